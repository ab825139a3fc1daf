// SPDX-License-Identifier: Apache-2.0
#pragma once
// sampler::sequential: the dataset in order, cut into one contiguous block per rank.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include <dtrain/error.hpp>
#include <dtrain/policy/category.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace sampler {

/// In-order indices, no shuffling: rank r gets the r-th of `world_size` contiguous blocks (the first
/// n % world ranks one sample more). Every sample is seen exactly once per epoch, so this is the
/// sampler for evaluation, and for training when the data is already shuffled.
struct sequential {
  using category = dtrain::category::sampler;

  static std::int64_t samples_per_rank(std::int64_t dataset_size, int world_size, int rank = 0);

  static std::vector<std::int64_t> indices(std::int64_t dataset_size, int rank, int world_size,
                                           std::int64_t /*epoch*/);
};

}  // namespace sampler

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/sampler/impl/sequential.ipp>
#endif
