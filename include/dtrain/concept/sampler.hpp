#pragma once
// The Sampler concept (moved verbatim from policy/concepts.hpp).

#include <concepts>
#include <cstdint>
#include <vector>

#include <dtrain/policy/category.hpp>

DTRAIN_NAMESPACE_BEGIN

/// Sampler. Minimal complete definition: `static std::vector<std::int64_t> indices(std::int64_t n,
/// int rank, int world_size, std::int64_t epoch)`.
/// Laws: a pure function of its arguments (every rank computes every rank's share alike); every
/// index is in [0, n).
/// Models: sampler::distributed<>, sampler::sequential.
template <class S>
concept SamplerPolicy = PolicyOf<S, category::sampler> && requires(std::int64_t n, int r, std::int64_t e) {
  { S::indices(n, r, r, e) } -> std::same_as<std::vector<std::int64_t>>;
};

DTRAIN_NAMESPACE_END
