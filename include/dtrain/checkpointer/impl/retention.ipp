// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of retention.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/checkpointer/retention.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace checkpointer {

DTRAIN_INLINE void retain(std::vector<Entry>& index, const CheckpointConfig& config) {
  if (config.num_to_keep <= 0 || index.empty()) return;
  const bool higher = config.score_order == ScoreOrder::max;
  std::vector<Entry> ranked = index;
  std::stable_sort(ranked.begin(), ranked.end(), [&](const Entry& a, const Entry& b) {
    return scores_better(a.metrics, a.iteration, b.metrics, b.iteration, config.score_attribute, higher);
  });
  std::int64_t latest = 0;
  for (const auto& e : index) latest = std::max(latest, e.iteration);
  std::vector<std::int64_t> keep{latest, ranked.front().iteration};
  for (std::size_t i = 0; i < ranked.size() && i < static_cast<std::size_t>(config.num_to_keep); ++i)
    keep.push_back(ranked[i].iteration);
  std::vector<Entry> kept;
  for (auto& e : index) {
    if (std::find(keep.begin(), keep.end(), e.iteration) != keep.end()) {
      kept.push_back(std::move(e));
      continue;
    }
    std::error_code ec;
    // The manifest goes first: a removal cut short leaves a directory that no longer verifies.
    std::filesystem::remove(e.path / files::manifest, ec);
    std::filesystem::remove_all(e.path, ec);
  }
  index = std::move(kept);
}

DTRAIN_INLINE std::vector<Checkpoint> all_valid(const std::filesystem::path& run_dir, bool warn) {
  std::vector<Checkpoint> out;
  for (const auto& [iteration, dir] : RunDirectory(run_dir).checkpoints()) {
    std::string why;
    if (auto c = Checkpoint::open(dir, &why)) out.push_back(std::move(*c));
    else if (warn)
      std::fprintf(stderr, "dtrain: warning: checkpoint %s is damaged (%s); it is skipped\n", dir.c_str(), why.c_str());
  }
  return out;
}

DTRAIN_INLINE std::optional<Checkpoint> best_of(const std::vector<Checkpoint>& checkpoints, const CheckpointConfig& config) {
  const bool higher = config.score_order == ScoreOrder::max;
  const Checkpoint* best = nullptr;
  for (const auto& c : checkpoints)
    if (!best || scores_better(c.metrics(), c.iteration(), best->metrics(), best->iteration(), config.score_attribute, higher))
      best = &c;
  if (!best) return std::nullopt;
  return *best;
}
}  // namespace checkpointer
DTRAIN_NAMESPACE_END
