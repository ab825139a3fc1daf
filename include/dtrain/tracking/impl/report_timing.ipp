// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of report_timing.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tracking/report_timing.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tracking {

DTRAIN_INLINE void ReportTiming::start(const Metrics& resumed) {
  const auto it = resumed.find("time_total_s");
  total_before_ = it != resumed.end() && it->second.is_number() ? it->second.number() : 0.0;
  started_ = last_ = clock::now();
  samples_ = 0;
}

DTRAIN_INLINE double ReportTiming::fill_times(Metrics& row) {
  const auto now = clock::now();
  const double iter = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  row.try_emplace("time_this_iter_s", iter);
  row.try_emplace("time_total_s", total_before_ + std::chrono::duration<double>(now - started_).count());
  return iter;
}
}  // namespace tracking
DTRAIN_NAMESPACE_END
