// SPDX-License-Identifier: Apache-2.0
// One of the two translation units of dtrain_odr_check, each including all of dtrain and running
// the same code (second.cpp also holds main). A non-inline definition in a header fails the link;
// one with internal linkage shows up as two addresses.

#include "probe.hpp"

#include <dtrain/all.hpp>

namespace odr {

probe first() {
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
