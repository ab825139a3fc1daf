// SPDX-License-Identifier: Apache-2.0
// One of the two translation units of dtrain_odr_check, each including all of dtrain and running
// the same code (second.cpp also holds main). A non-inline definition in a header fails the link;
// one with internal linkage shows up as two addresses.

#include "probe.hpp"

#include <dtrain/all.hpp>

namespace odr {

probe second() {
  using sampler = dtrain::sampler::distributed<7>;
  using policies = dtrain::policy::set<dtrain::precision::amp<dtrain::precision::bf16>>;
  dtrain::data::TensorDataset dataset(torch::zeros({10, 2}), torch::arange(10));
  dtrain::ScalingConfig{.num_workers = 2}.validate();
  return {&dtrain::strategy::default_bucket_bytes_cap,
          &dtrain::policy::defaults,
          reinterpret_cast<const void*>(&dtrain::launch::detect_worker),
          reinterpret_cast<const void*>(static_cast<std::vector<std::int64_t> (*)(std::int64_t, int, int, std::int64_t)>(&sampler::indices)),
          &policies::precision::name,
          sampler::indices(dataset.size(), 1, 3, 2),
          dataset.size()};
}

}  // namespace odr

#include <cstdio>

int main() {
  const odr::probe a = odr::first(), b = odr::second();
  int failures = 0;
  auto same = [&](bool ok, const char* what) {
    if (!ok) {
      std::printf("ODR: %s differs between the two translation units\n", what);
      ++failures;
    }
  };
  same(a.bucket_bytes_cap == b.bucket_bytes_cap, "&strategy::default_bucket_bytes_cap");
  same(a.policy_defaults == b.policy_defaults, "&policy::defaults");
  same(a.detect_worker == b.detect_worker, "&launch::detect_worker");
  same(a.sampler_indices == b.sampler_indices, "&sampler::distributed<7>::indices");
  same(a.indices == b.indices && a.indices.size() == 4, "sampler::distributed<7>::indices(10, 1, 3, 2)");
  same(a.dataset_size == b.dataset_size && a.dataset_size == 10, "TensorDataset::size()");
  same(a.precision_name == b.precision_name, "&policy::set<amp<bf16>>::precision::name");
  if (failures) return 1;
  std::printf("two translation units, one definition each\n");
  return 0;
}
