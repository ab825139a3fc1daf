// SPDX-License-Identifier: Apache-2.0
#pragma once
// Which checkpoints a run keeps (retention by score), and which valid one is the best.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/selection.hpp>
#include <dtrain/config.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/run_directory.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer {

/// A checkpoint known to the retention of a running group.
struct Entry {
  std::int64_t iteration = 0;
  std::filesystem::path path;
  Metrics metrics;
};

/// Removes the checkpoints `config` does not keep: the num_to_keep best by score_attribute (or the
/// newest), plus the latest and the best, are kept. Called after a new checkpoint is complete.
void retain(std::vector<Entry>& index, const CheckpointConfig& config);

/// Every checkpoint under `run_dir` whose manifest verifies, newest first; each is verified once.
/// With `warn`, each damaged one is reported on stderr with its path and the reason.
std::vector<Checkpoint> all_valid(const std::filesystem::path& run_dir, bool warn = false);

/// The best of `checkpoints` by `config` (score_attribute and score_order; the newest when no
/// score attribute is set), or nothing when there are none.
std::optional<Checkpoint> best_of(const std::vector<Checkpoint>& checkpoints, const CheckpointConfig& config);

/// The best checkpoint under `run_dir` whose manifest verifies, ranked as `config` ranks them
/// (score_attribute and score_order; the newest when no score attribute is set), or nothing when
/// there is none. Damaged checkpoints are passed over.
inline std::optional<Checkpoint> best_valid(const std::filesystem::path& run_dir, const CheckpointConfig& config) {
  return best_of(all_valid(run_dir), config);
}

}  // namespace checkpointer

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/checkpointer/impl/retention.ipp>
#endif
