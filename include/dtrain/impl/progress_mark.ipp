// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of progress_mark.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/progress_mark.hpp>

DTRAIN_NAMESPACE_BEGIN

DTRAIN_INLINE std::string ProgressPoint::describe() const {
  std::string s = where;
  const auto hash = s.find('#');
  if (hash != std::string::npos && number >= 0) s.insert(hash + 1, std::to_string(number));
  if (after > 0)
    s += ", then " + std::to_string(after) + (after == 1 ? " collective issued or completed" : " collectives issued or completed");
  return s;
}

DTRAIN_INLINE void mark_progress(const char* where, std::int64_t number) noexcept {
  detail::progress_where.store(where, std::memory_order_relaxed);
  detail::progress_number.store(number, std::memory_order_relaxed);
  const auto count = detail::progress_count.fetch_add(1, std::memory_order_release) + 1;
  detail::progress_labelled.store(count, std::memory_order_relaxed);
}

DTRAIN_INLINE ProgressPoint last_progress() noexcept {
  ProgressPoint p;
  p.count = detail::progress_count.load(std::memory_order_acquire);
  p.where = detail::progress_where.load(std::memory_order_relaxed);
  p.number = detail::progress_number.load(std::memory_order_relaxed);
  p.after = std::max<std::int64_t>(0, p.count - detail::progress_labelled.load(std::memory_order_relaxed));
  return p;
}
DTRAIN_NAMESPACE_END
