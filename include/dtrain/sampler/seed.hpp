// SPDX-License-Identifier: Apache-2.0
#pragma once
// The run-time seed of the Trainer's Sampler, and dtrain::enable_reproducibility.

#include <cstdint>
#include <optional>

#include <ATen/Context.h>
#include <torch/utils.h>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace sampler {
/// The process-wide seed enable_reproducibility() set, or nothing. Workers forked by the driver
/// inherit it; workers it starts afresh run the code before fit() again, which sets it again.
inline std::optional<std::uint64_t>& process_seed() {
  static std::optional<std::uint64_t> seed;
  return seed;
}
}  // namespace sampler

/// Seeds torch's generator (this process, and every worker, which calls it too on its way to
/// fit()) and the Trainer's Sampler (where RunConfig::seed is unset), and turns on LibTorch's
/// deterministic algorithms (an operation without one then throws rather than varies). Two runs
/// with the same seed, worker count and data then train bitwise-equal parameters.
void enable_reproducibility(std::uint64_t seed);

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/sampler/impl/seed.ipp>
#endif
