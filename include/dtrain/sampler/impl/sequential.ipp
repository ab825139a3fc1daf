// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of sequential.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/sampler/sequential.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace sampler {

DTRAIN_INLINE std::int64_t sequential::samples_per_rank(std::int64_t dataset_size, int world_size, int rank) {
  if (world_size < 1) throw ConfigError("sampler::sequential: world_size must be >= 1");
  return dataset_size / world_size + (rank < dataset_size % world_size ? 1 : 0);
}

DTRAIN_INLINE std::vector<std::int64_t> sequential::indices(std::int64_t dataset_size, int rank, int world_size,
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
}  // namespace sampler
DTRAIN_NAMESPACE_END
