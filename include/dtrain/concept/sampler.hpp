// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Sampler concept: which sample indices each rank sees, epoch by epoch.

#include <concepts>
#include <cstdint>
#include <vector>

#include <dtrain/policy/category.hpp>

DTRAIN_NAMESPACE_BEGIN

/// Sampler.
///
/// Minimal complete definition: `using category = dtrain::category::sampler;` and
/// `static std::vector<std::int64_t> indices(std::int64_t n, int rank, int world_size,
/// std::int64_t epoch)`, the indices of a dataset of `n` samples that rank `rank` visits in
/// `epoch`, in visiting order. A sampler is passed as a value where one is chosen per call:
/// `ctx.shard(split, global_batch, dtrain::sampler::sequential{})`.
///
/// Optional members: `static ... indices(n, rank, world_size, epoch, std::uint64_t seed)`, the
/// same drawn with a seed chosen at run time (RunConfig::seed); the Trainer's Sampler is called
/// with it when a seed is set (sampler::distributed has it). `static ... indices_from(std::int64_t
/// offset, n, rank, world_size, epoch[, seed])`: the rest of the epoch after its first `offset`
/// positions, dealt to `rank` of `world_size`, where after b global batches of G samples every
/// world size has trained the same first b x G positions; with it a checkpoint resumes mid-epoch
/// under another worker count and each sample of the epoch is trained once (ElasticSampler).
///
/// Laws (checked by tests/laws/sampler.hpp for every model):
/// - a pure function of its arguments: every rank computes every rank's share alike, every run;
/// - every index is in [0, n);
/// - cover: over the ranks of one epoch, every index appears (at least once where the sampler pads
///   the tail, exactly once where it drops it or the world size divides n).
///
/// Models: sampler::distributed<Seed, Shuffle, Tail>, sampler::sequential.
template <class S>
concept SamplerPolicy = PolicyOf<S, category::sampler> && requires(std::int64_t n, int r, std::int64_t e) {
  { S::indices(n, r, r, e) } -> std::same_as<std::vector<std::int64_t>>;
};

/// A Sampler whose draw takes a run-time seed.
template <class S>
concept SeededSampler = SamplerPolicy<S> && requires(std::int64_t n, int r, std::int64_t e, std::uint64_t seed) {
  { S::indices(n, r, r, e, seed) } -> std::same_as<std::vector<std::int64_t>>;
};

/// A Sampler that deals the rest of an epoch from its global sample offset to any world size.
template <class S>
concept ElasticSampler = SamplerPolicy<S> && requires(std::int64_t offset, std::int64_t n, int r, std::int64_t e) {
  { S::indices_from(offset, n, r, r, e) } -> std::same_as<std::vector<std::int64_t>>;
};

DTRAIN_NAMESPACE_END
