// SPDX-License-Identifier: Apache-2.0
#pragma once
// report.html: one self-contained page per run (inline SVG and CSS, no script, no network) with the
// metric curves by step, throughput over time, restarts and resumes marked, the latest value of
// every metric, evaluations with their confusion matrices, the checkpoints and the parameters.
// Its pieces (charts, tables, value formats) are tracking/html.hpp's.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/tracking/html.hpp>
#include <dtrain/tracking/record.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tracking {

namespace detail {

// The history's own bookkeeping columns, time stamps and throughput (charted against time): not
// curves by step.
bool is_curve(const std::string& column);

// Training and validation of one quantity share a chart: "val_loss", "train_loss" and the step
// history's "loss" all go on the chart "loss".
std::string chart_of(std::string column);

// Whether a series is a curve: two points or more, not all the same (a constant is a table's).
bool varies(const html::Series& s);

// The step history's rows of values (not its group starts), as a table of their own.
MetricsHistory step_values(const MetricsHistory& steps);

std::string confusion_table(const nlohmann::json& evaluation);

// Restarts (outcome.json's failures) and resumes (the step history's "resume" starts), on the
// step axis and on the time axis (seconds after `t0`).
struct Markers {
  std::vector<html::Marker> by_step, by_time;
};
Markers restarts_and_resumes(const RunRecord& run, double t0);

}  // namespace detail

/// The HTML page of `run`: its outcome, curves of the metrics by step (training and validation of
/// a quantity on one chart; the step history's loss between reports), throughput over time,
/// restarts and resumes marked on both, the latest value of every metric (single values, sizes
/// and constants are there, not charted), evaluations, checkpoints and parameters. A section
/// with nothing to show is left out.
std::string render_report(const RunRecord& run);

/// Renders run_dir's files into run_dir/report.html; returns its path.
std::filesystem::path write_report(const std::filesystem::path& run_dir);

}  // namespace tracking

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tracking/impl/report.ipp>
#endif
