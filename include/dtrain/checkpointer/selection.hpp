// SPDX-License-Identifier: Apache-2.0
#pragma once
// Which checkpoint of a run to use: the newest one that verifies (and that this run can load), and
// the order of checkpoints by a reported score (retention and Result's best checkpoint).

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/run_directory.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer {

/// The store key under which a worker records that checkpoint `dir` verified but could not be
/// loaded into this run (another model's weights, say): the restarted group passes over it.
inline std::string unloadable_key(const std::filesystem::path& dir) {
  return "dtrain/unloadable/" + dir.lexically_normal().string();
}

/// The newest checkpoint under `run_dir` whose manifest verifies and that `unusable` (when given)
/// does not reject: `unusable(dir)` returns why this run cannot use it, or "". Each newer checkpoint
/// passed over is reported on stderr with its path and the reason (when `warn`), and the reasons
/// `unusable` gave are appended to `*rejected` as "; why".
std::optional<Checkpoint> latest_valid(
                                       const std::filesystem::path& run_dir, bool warn = true,
    const std::function<std::string(const std::filesystem::path&)>& unusable = {}, std::string* rejected = nullptr);

/// Whether checkpoint `a` scores better than `b` by `attribute` in `order`; a checkpoint without
/// the attribute (or with text there) scores worst; ties go to the newer.
bool scores_better(const Metrics& a, std::int64_t a_iter, const Metrics& b, std::int64_t b_iter,
                   const std::string& attribute, bool higher_is_better);

}  // namespace checkpointer

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/checkpointer/impl/selection.ipp>
#endif
