// SPDX-License-Identifier: Apache-2.0
#pragma once
// tracker::none: nothing recorded beyond the metrics history that Result is built from.

#include <dtrain/policy/category.hpp>
#include <dtrain/tracking/record.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tracker {

/// Writes no params, outcome, checkpoint index or report: the run directory holds metrics.jsonl,
/// metrics.csv and the checkpoints only.
struct none {
  using category = dtrain::category::tracker;
  static constexpr const char* name = "none";
  static void start(const tracking::RunRecord&) {}
  static void end(const tracking::RunRecord&) {}
};

}  // namespace tracker

DTRAIN_NAMESPACE_END
