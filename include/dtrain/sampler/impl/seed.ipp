// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of seed.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/sampler/seed.hpp>

DTRAIN_NAMESPACE_BEGIN

DTRAIN_INLINE void enable_reproducibility(std::uint64_t seed) {
  torch::manual_seed(seed);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  sampler::process_seed() = seed;
}
DTRAIN_NAMESPACE_END
