// SPDX-License-Identifier: Apache-2.0
#pragma once
// The pieces dtrain's HTML pages are made of (report.html, and any page of runs): text escaped,
// numbers, dates and durations written for a person, a table of values, and line charts as inline
// SVG with several series, a legend and vertical markers. No script, nothing fetched.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <ctime>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tracking::html {

std::string escape(const std::string& s);

std::string number(double v, int precision = 6);

/// "2026-11-26 19:58:03 UTC" for a Unix time; "-" for none.
std::string utc(double unix_s);

/// "0.42 s", "83.4 s (1:23)", "4,000 s (1:06:40)": seconds, and as a clock reading from a minute on.
std::string duration(double seconds);

/// A metric's value as a person reads it, by the convention its name follows: `timestamp` and
/// `*_unix` are dates, `*_s` (not `*_per_s`) durations, `*bytes*` sizes; other numbers as they are,
/// integers exactly.
std::string value_text(std::string_view name, const nlohmann::json& v);

/// A table of the given header cells and rows of cells (escaped here).
std::string table(const std::string& id, const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows);

// Tick values 1, 2 or 5 times a power of ten, about `n` of them over [lo, hi].
std::vector<double> ticks(double lo, double hi, int n = 5);

/// One line of a chart: `ys` against `xs`; NaN points are skipped.
struct Series {
  std::string name;  // the metric (data-series), and the legend's text unless `label` is set
  std::vector<double> xs, ys;
  std::string label = {};

  /// The points a chart draws (both coordinates finite).
  std::size_t points() const;
};

/// A vertical marker on a chart: a restart or a resume, at x.
struct Marker {
  double x;
  std::string label;
};

/// A line chart as inline SVG (`svg.curve[data-metric=title]`), one polyline per series
/// (`polyline.line[data-series][data-points]`) in its own colour (nine, then again), a legend when
/// there are two or more or a series has a label (in rows, as many as its entries need), and markers as dashed vertical lines (`line.restart`). Points carry a <title> (dots are
/// drawn for series of up to 60 points; longer ones are thinned to at most 1,000 for the page).
/// Empty when no series has a point.
std::string line_chart(const std::string& id, const std::string& title, const std::string& x_label,
                       const std::vector<Series>& series, const std::vector<Marker>& markers = {});

/// The page's style sheet: the charts' and tables' look.
inline constexpr const char* style =
    "body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222;background:#fff}"
    "h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}"
    ".status{font-weight:600}.status.finished{color:#1a7f37}.status.failed{color:#cf222e}.status.running{color:#9a6700}"
    "pre.error{background:#fff0f0;padding:8px;white-space:pre-wrap}"
    ".charts{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}"
    ".side-by-side{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}figure.chart{margin:0;border:1px solid #e5e5e5}"
    "svg .line{fill:none;stroke-width:2}"
    "svg .grid{stroke:#eee}svg .frame{fill:none;stroke:#999}svg .tick,svg .axis{font-size:11px;fill:#555}"
    "svg .title{font-size:13px;font-weight:600;fill:#222}svg .restart{stroke:#d62728;stroke-width:2;stroke-dasharray:5,4}"
    "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}.confusion-matrix td{min-width:38px}.confusion-matrix th{white-space:nowrap}"
    ".confusion-matrix td.dark{color:#fff}caption{caption-side:bottom;color:#666;font-size:12px}";

/// A whole page: `title` and `body` inside the document with the style sheet.
inline std::string page(const std::string& title, const std::string& body) {
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + escape(title) +
         "</title><style>" + style + "</style></head><body>" + body + "</body></html>\n";
}

}  // namespace tracking::html

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tracking/impl/html.ipp>
#endif
