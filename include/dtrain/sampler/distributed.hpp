// SPDX-License-Identifier: Apache-2.0
#pragma once
// sampler::distributed<>: a seeded permutation re-drawn every epoch, split evenly across ranks.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include <dtrain/error.hpp>
#include <dtrain/policy/category.hpp>
#include <dtrain/sampler/seed.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace sampler {

/// What to do with the samples that do not divide evenly among the ranks.
enum class tail {
  /// Repeat the first samples of the permutation until every rank has ceil(n / world) of them
  /// (PyTorch's DistributedSampler with drop_last=false): every sample is seen at least once.
  pad,
  /// Leave out the last n % world samples of the permutation: every rank gets floor(n / world)
  /// and no sample is seen twice in an epoch.
  drop,
};

/// Seeded shuffle per epoch, even split across ranks.
///
/// The permutation of epoch e is a function of (Seed, e) alone, drawn with std::mt19937_64 and a
/// Fisher-Yates shuffle written out here (std::shuffle's algorithm is unspecified), so every rank,
/// every run and every standard library draws the same one. Rank r takes the positions r, r + world,
/// r + 2 world, ... of it, as PyTorch's DistributedSampler does. The epoch comes from the worker
/// context (ctx.epochs()), so the permutation changes every epoch without a set_epoch call.
/// RunConfig::seed (or dtrain::enable_reproducibility) replaces Seed at run time: the Trainer then
/// calls the five-argument indices() with it.
template <std::uint64_t Seed = 0, bool Shuffle = true, tail Tail = tail::pad>
struct distributed {
  using category = dtrain::category::sampler;
  static constexpr std::uint64_t seed = Seed;
  static constexpr bool shuffle = Shuffle;
  static constexpr tail tail_policy = Tail;

  /// How many samples each rank sees per epoch.
  static std::int64_t samples_per_rank(std::int64_t dataset_size, int world_size) {
    if (world_size < 1) throw ConfigError("sampler::distributed: world_size must be >= 1");
    return Tail == tail::pad ? (dataset_size + world_size - 1) / world_size
                             : dataset_size / world_size;
  }

  /// The dataset indices rank `rank` of `world_size` visits in `epoch`, in visiting order.
  static std::vector<std::int64_t> indices(std::int64_t dataset_size, int rank, int world_size,
                                           std::int64_t epoch) {
    return indices(dataset_size, rank, world_size, epoch, Seed);
  }

  /// The same, drawn with `seed` in place of Seed.
  static std::vector<std::int64_t> indices(std::int64_t dataset_size, int rank, int world_size,
                                           std::int64_t epoch, std::uint64_t seed) {
    return indices_from(0, dataset_size, rank, world_size, epoch, seed);
  }

  /// The rest of epoch `epoch` after its first `offset` positions (the samples all ranks together
  /// trained of it: batches x global batch), dealt to `rank` of `world_size` as a whole epoch is
  /// dealt: positions offset + rank, offset + rank + world, ... of its permutation. Every world size
  /// trains the same first positions after the same number of global batches, so a group resumed
  /// with another worker count continues the epoch from there and trains each sample once.
  static std::vector<std::int64_t> indices_from(std::int64_t offset, std::int64_t dataset_size, int rank,
                                                int world_size, std::int64_t epoch, std::uint64_t seed = Seed) {
    if (offset < 0 || offset > dataset_size)
      throw ConfigError("sampler::distributed: the epoch's sample offset " + std::to_string(offset) +
                        " is outside [0, " + std::to_string(dataset_size) +
                        "]; was the checkpoint written for another dataset?");
    if (rank < 0 || rank >= world_size)
      throw ConfigError("sampler::distributed: rank " + std::to_string(rank) +
                        " is outside [0, world_size = " + std::to_string(world_size) + ")");
    std::vector<std::int64_t> order(static_cast<std::size_t>(dataset_size));
    if (dataset_size == 0) return {};
    std::iota(order.begin(), order.end(), std::int64_t{0});
    if constexpr (Shuffle) {
      // Mixing the epoch into the seed with a large odd constant keeps neighbouring (seed, epoch)
      // pairs from producing correlated streams.
      std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(epoch + 1)));
      for (std::size_t i = order.size(); i > 1; --i) {
        const auto j = static_cast<std::size_t>(rng() % i);
        std::swap(order[i - 1], order[j]);
      }
    }
    const std::int64_t per_rank = samples_per_rank(dataset_size - offset, world_size);
    std::vector<std::int64_t> mine;
    mine.reserve(static_cast<std::size_t>(per_rank));
    for (std::int64_t k = 0; k < per_rank; ++k) {
      // With tail::pad the global position may run past the end: wrap to the permutation's start.
      const std::int64_t global = offset + k * world_size + rank;
      mine.push_back(order[static_cast<std::size_t>(global % dataset_size)]);
    }
    return mine;
  }
};

}  // namespace sampler

DTRAIN_NAMESPACE_END
