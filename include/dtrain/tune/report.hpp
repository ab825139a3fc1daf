// SPDX-License-Identifier: Apache-2.0
#pragma once
// The experiment's report.html and trials.csv, rewritten as each trial ends: every trial's
// curve of the metric against the scheduler's time, and one row per trial with its config, status
// and scores, linked to the trial's own report.html. Self-contained, no script.

#include <cmath>
#include <string>
#include <vector>

#include <dtrain/tracking/html.hpp>
#include <dtrain/tracking/record.hpp>
#include <dtrain/tune/result_grid.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tune {

/// The page for `grid`, its curves drawn against `time_attr`.
std::string report_html(const ResultGrid& grid, const std::string& time_attr, const nlohmann::json& tuner);

/// Writes trials.csv, results.json and report.html of `grid` (each atomically).
void write_summary(const ResultGrid& grid, const std::string& time_attr, const nlohmann::json& tuner);

}  // namespace tune

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tune/impl/report.ipp>
#endif
