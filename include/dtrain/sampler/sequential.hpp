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

  static std::int64_t samples_per_rank(std::int64_t dataset_size, int world_size, int rank = 0) {
    if (world_size < 1) throw ConfigError("sampler::sequential: world_size must be >= 1");
    return dataset_size / world_size + (rank < dataset_size % world_size ? 1 : 0);
  }

  static std::vector<std::int64_t> indices(std::int64_t dataset_size, int rank, int world_size,
                                           std::int64_t /*epoch*/) {
    if (rank < 0 || rank >= world_size)
      throw ConfigError("sampler::sequential: rank " + std::to_string(rank) +
                        " is outside [0, world_size = " + std::to_string(world_size) + ")");
    const std::int64_t base = dataset_size / world_size, extra = dataset_size % world_size;
    const std::int64_t begin = rank * base + std::min<std::int64_t>(rank, extra);
    std::vector<std::int64_t> mine(static_cast<std::size_t>(samples_per_rank(dataset_size, world_size, rank)));
    std::iota(mine.begin(), mine.end(), begin);
    return mine;
  }
};

}  // namespace sampler

DTRAIN_NAMESPACE_END
