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
inline std::optional<Checkpoint> latest_valid(
    const std::filesystem::path& run_dir, bool warn = true,
    const std::function<std::string(const std::filesystem::path&)>& unusable = {}, std::string* rejected = nullptr) {
  for (const auto& [it, dir] : RunDirectory(run_dir).checkpoints()) {
    std::string why;
    auto c = Checkpoint::open(dir, &why);
    if (c && (!unusable || (why = unusable(dir)).empty())) return c;
    if (c && rejected) *rejected += "; " + why;
    if (warn)
      std::fprintf(stderr, "dtrain: warning: checkpoint %s %s (%s); falling back to an older one\n", dir.c_str(),
                   c ? "cannot be loaded into this run" : "is damaged", why.c_str());
  }
  return std::nullopt;
}

/// Whether checkpoint `a` scores better than `b` by `attribute` in `order`; a checkpoint without
/// the attribute (or with text there) scores worst; ties go to the newer.
inline bool scores_better(const Metrics& a, std::int64_t a_iter, const Metrics& b, std::int64_t b_iter,
                          const std::string& attribute, bool higher_is_better) {
  if (attribute.empty()) return a_iter > b_iter;
  auto score = [&](const Metrics& m) -> std::optional<double> {
    auto it = m.find(attribute);
    if (it == m.end() || !it->second.is_number()) return std::nullopt;
    const double v = it->second.number();
    if (v != v) return std::nullopt;  // NaN
    return v;
  };
  const auto sa = score(a), sb = score(b);
  if (sa && sb && *sa != *sb) return higher_is_better ? *sa > *sb : *sa < *sb;
  if (sa.has_value() != sb.has_value()) return sa.has_value();
  return a_iter > b_iter;
}

}  // namespace checkpointer

DTRAIN_NAMESPACE_END
