// SPDX-License-Identifier: Apache-2.0
#pragma once
// What each translation unit of dtrain_odr_check sees of dtrain's inline entities: addresses that
// must be one and the same in every TU, and results that must agree.

#include <cstdint>
#include <vector>

namespace odr {

struct probe {
  const void* bucket_bytes_cap;  // an inline constexpr variable
  const void* policy_defaults;   // an inline constexpr hana::map
  const void* detect_worker;     // an inline function
  const void* sampler_indices;   // a static member function of a class template
  const void* precision_name;    // a static constexpr data member of a class template
  std::vector<std::int64_t> indices;
  std::int64_t dataset_size;
};

probe first();   // defined in first.cpp
probe second();  // defined in second.cpp

}  // namespace odr
