// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of selection.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/checkpointer/selection.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace checkpointer {

DTRAIN_INLINE std::optional<Checkpoint> latest_valid(
                                                     const std::filesystem::path& run_dir, bool warn,
    const std::function<std::string(const std::filesystem::path&)>& unusable, std::string* rejected) {
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

DTRAIN_INLINE bool scores_better(const Metrics& a, std::int64_t a_iter, const Metrics& b, std::int64_t b_iter,
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
