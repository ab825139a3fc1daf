// SPDX-License-Identifier: Apache-2.0
#pragma once
// report.html: one self-contained page per run (inline SVG and CSS, no script, no network) with the
// metric curves by step, throughput over time, restarts marked, the final metrics, evaluations
// with their confusion matrices, the checkpoints and the parameters.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/tracking/record.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tracking {

namespace detail {

inline std::string escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

inline std::string number(double v, int precision = 6) {
  if (std::isnan(v)) return "NaN";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", precision, v);
  return buf;
}

inline std::string utc(double unix_s) {
  if (!(unix_s > 0)) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// Tick values 1, 2 or 5 times a power of ten, about `n` of them over [lo, hi].
inline std::vector<double> ticks(double lo, double hi, int n = 5) {
  std::vector<double> out;
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag >= 5 ? 5 * mag : raw / mag >= 2 ? 2 * mag : mag;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

/// A vertical marker on a chart: a restart, at x.
struct Marker {
  double x;
  std::string label;
};

/// A line chart as inline SVG: `xs` against `ys` (NaN points are skipped), with axes, ticks and a
/// <title> on every point. Markers are dashed vertical lines of class "restart".
inline std::string line_chart(const std::string& id, const std::string& title, const std::string& x_label,
                              const std::vector<double>& xs, const std::vector<double>& ys,
                              const std::vector<Marker>& markers = {}) {
  constexpr double W = 480, H = 270, left = 62, right = 16, top = 30, bottom = 42;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  std::vector<std::pair<double, double>> pts;
  for (std::size_t i = 0; i < xs.size() && i < ys.size(); ++i) {
    if (!std::isfinite(xs[i]) || !std::isfinite(ys[i])) continue;
    pts.emplace_back(xs[i], ys[i]);
    x0 = std::min(x0, xs[i]);
    x1 = std::max(x1, xs[i]);
    y0 = std::min(y0, ys[i]);
    y1 = std::max(y1, ys[i]);
  }
  for (const auto& m : markers)
    if (std::isfinite(m.x) && !pts.empty()) {
      x0 = std::min(x0, m.x);
      x1 = std::max(x1, m.x);
    }
  if (pts.empty()) return "";
  if (x1 <= x0) { x0 -= 1; x1 += 1; }
  if (y1 <= y0) {
    const double pad = y0 == 0 ? 1 : std::abs(y0) * 0.05;
    y0 -= pad;
    y1 += pad;
  } else {
    const double pad = (y1 - y0) * 0.05;
    y0 -= pad;
    y1 += pad;
  }
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (W - left - right); };
  auto py = [&](double y) { return H - bottom - (y - y0) / (y1 - y0) * (H - top - bottom); };
  std::string s = "<figure class=\"chart\" id=\"" + escape(id) + "\"><svg xmlns=\"http://www.w3.org/2000/svg\" "
                  "class=\"curve\" data-metric=\"" + escape(title) + "\" width=\"" + number(W) + "\" height=\"" +
                  number(H) + "\" viewBox=\"0 0 " + number(W) + " " + number(H) + "\" role=\"img\">";
  s += "<title>" + escape(title) + " by " + escape(x_label) + "</title>";
  s += "<text x=\"" + number(W / 2) + "\" y=\"18\" text-anchor=\"middle\" class=\"title\">" + escape(title) + "</text>";
  // Grid and tick labels.
  for (double t : ticks(y0, y1)) {
    const double y = py(t);
    s += "<line class=\"grid\" x1=\"" + number(left) + "\" x2=\"" + number(W - right) + "\" y1=\"" + number(y) +
         "\" y2=\"" + number(y) + "\"/><text class=\"tick\" x=\"" + number(left - 6) + "\" y=\"" + number(y + 4) +
         "\" text-anchor=\"end\">" + number(t, 4) + "</text>";
  }
  for (double t : ticks(x0, x1)) {
    const double x = px(t);
    s += "<line class=\"grid\" x1=\"" + number(x) + "\" x2=\"" + number(x) + "\" y1=\"" + number(top) + "\" y2=\"" +
         number(H - bottom) + "\"/><text class=\"tick\" x=\"" + number(x) + "\" y=\"" + number(H - bottom + 16) +
         "\" text-anchor=\"middle\">" + number(t, 5) + "</text>";
  }
  s += "<rect class=\"frame\" x=\"" + number(left) + "\" y=\"" + number(top) + "\" width=\"" + number(W - left - right) +
       "\" height=\"" + number(H - top - bottom) + "\"/>";
  s += "<text class=\"axis\" x=\"" + number((left + W - right) / 2) + "\" y=\"" + number(H - 6) +
       "\" text-anchor=\"middle\">" + escape(x_label) + "</text>";
  for (const auto& m : markers) {
    if (!std::isfinite(m.x)) continue;
    const double x = px(m.x);
    s += "<line class=\"restart\" x1=\"" + number(x) + "\" x2=\"" + number(x) + "\" y1=\"" + number(top) +
         "\" y2=\"" + number(H - bottom) + "\"><title>" + escape(m.label) + "</title></line>";
  }
  std::string poly;
  for (const auto& [x, y] : pts) poly += number(px(x)) + "," + number(py(y)) + " ";
  s += "<polyline class=\"line\" points=\"" + poly + "\"/>";
  for (const auto& [x, y] : pts)
    s += "<circle class=\"point\" cx=\"" + number(px(x)) + "\" cy=\"" + number(py(y)) + "\" r=\"3\"><title>" +
         escape(x_label) + " " + number(x) + ": " + number(y) + "</title></circle>";
  s += "</svg></figure>";
  return s;
}

// The history's own bookkeeping columns, and time stamps: not curves.
inline bool is_curve(const std::string& column) {
  static const std::set<std::string> skip = {"iteration", "epoch", "step", "timestamp"};
  if (skip.count(column)) return false;
  return !(column.size() > 5 && column.compare(column.size() - 5, 5, "_unix") == 0);
}

inline std::string metric_text(const nlohmann::json& v) {
  if (v.is_number_float()) return number(v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

inline std::string table_of(const std::string& id, const nlohmann::json& object) {
  std::string s = "<table id=\"" + id + "\"><tr><th>name</th><th>value</th></tr>";
  for (const auto& [k, v] : object.items())
    s += "<tr><td>" + escape(k) + "</td><td>" + escape(metric_text(v)) + "</td></tr>";
  return s + "</table>";
}

inline std::string confusion_table(const nlohmann::json& evaluation) {
  const auto& m = evaluation.at("confusion_matrix");
  const auto names = evaluation.value("class_names", std::vector<std::string>{});
  std::int64_t peak = 1;
  for (const auto& row : m)
    for (const auto& v : row) peak = std::max(peak, v.get<std::int64_t>());
  auto name = [&](std::size_t i) { return i < names.size() ? names[i] : std::to_string(i); };
  std::string s = "<table class=\"confusion-matrix\"><caption>rows: true class, columns: predicted class</caption><tr><th></th>";
  for (std::size_t p = 0; p < m.size(); ++p) s += "<th class=\"pred\">" + escape(name(p)) + "</th>";
  s += "</tr>";
  for (std::size_t t = 0; t < m.size(); ++t) {
    s += "<tr><th class=\"true\">" + escape(name(t)) + "</th>";
    for (std::size_t p = 0; p < m[t].size(); ++p) {
      const auto v = m[t][p].get<std::int64_t>();
      // Shade by count: the diagonal in blue, mistakes in red.
      const double a = 0.08 + 0.82 * static_cast<double>(v) / static_cast<double>(peak);
      const std::string rgb = t == p ? "31,119,180" : "214,39,40";
      s += "<td style=\"background: rgba(" + rgb + "," + number(v == 0 ? 0.0 : a, 3) + ")\"" +
           (a > 0.55 && v ? " class=\"dark\"" : "") + ">" + std::to_string(v) + "</td>";
    }
    s += "</tr>";
  }
  return s + "</table>";
}

}  // namespace detail

/// The HTML page of `run`.
inline std::string render_report(const RunRecord& run) {
  using detail::escape;
  using detail::number;
  const auto& h = run.history;
  const auto steps = h.column("step"), times = h.column("timestamp");
  const std::string status = run.outcome.value("status", "unknown");
  const auto failures = run.outcome.value("failures", nlohmann::json::array());

  // Restarts: on step charts at the step the new group resumed from, on the time chart when the
  // failure happened.
  std::vector<detail::Marker> step_markers, time_markers;
  const double t_first = times.empty() ? 0 : times.front();
  for (std::size_t i = 0; i < failures.size(); ++i) {
    const auto& f = failures[i];
    const std::string label = "restart " + std::to_string(i + 1) + ": " + f.value("cause", std::string());
    // resumed_step is null for the last failure of a run that gave up: no group resumed.
    if (f.contains("resumed_step") && f.at("resumed_step").is_number())
      step_markers.push_back({f.at("resumed_step").get<double>(), label});
    if (f.contains("time")) time_markers.push_back({f.at("time").get<double>() - t_first, label});
  }

  std::string body;
  body += "<h1>dtrain run <code>" + escape(run.name()) + "</code></h1>";
  body += "<p class=\"status " + escape(status) + "\" id=\"outcome\">" + escape(status);
  if (run.outcome.contains("restarts"))
    body += " &middot; " + std::to_string(run.outcome.value("restarts", 0)) + " restart(s)";
  const double start = run.outcome.value("start_time", 0.0), end = run.outcome.value("end_time", 0.0);
  body += " &middot; started " + escape(detail::utc(start));
  if (end > 0) body += " &middot; took " + number(end - start, 4) + " s";
  body += " &middot; " + std::to_string(h.size()) + " reports</p>";
  if (run.outcome.contains("error") && !run.outcome.at("error").is_null())
    body += "<pre class=\"error\">" + escape(run.outcome.value("error", "")) + "</pre>";
  if (!failures.empty()) {
    body += "<h2>Restarts</h2><ol id=\"restarts\">";
    for (const auto& f : failures)
      body += "<li>" + escape(detail::utc(f.value("time", 0.0))) + ": " + escape(f.value("cause", "")) +
              (f.contains("resumed_step") && f.at("resumed_step").is_number()
                   ? " &rarr; resumed from step " + std::to_string(f.at("resumed_step").get<std::int64_t>())
                   : std::string(" &rarr; not restarted (no failures left)")) +
              "</li>";
    body += "</ol>";
  }

  // Curves: every numeric metric by step.
  body += "<h2>Metrics by step</h2><div class=\"charts\" id=\"curves\">";
  int charts = 0;
  for (const auto& col : h.columns()) {
    if (!detail::is_curve(col)) continue;
    const auto ys = h.column(col);
    if (std::none_of(ys.begin(), ys.end(), [](double v) { return std::isfinite(v); })) continue;
    const auto chart = detail::line_chart("curve-" + col, col, "step", steps, ys, step_markers);
    if (!chart.empty()) {
      body += chart;
      ++charts;
    }
  }
  if (charts == 0) body += "<p>No numeric metric was reported.</p>";
  body += "</div>";

  // Throughput over wall time: a reported samples/s when it was reported at least twice, else
  // optimizer steps per second between consecutive reports.
  std::string rate_column;
  for (const auto& col : h.columns()) {
    if (col.find("samples_per_s") == std::string::npos) continue;
    const auto v = h.column(col);
    if (std::count_if(v.begin(), v.end(), [](double x) { return std::isfinite(x); }) >= 2) rate_column = col;
  }
  std::vector<double> elapsed, rate;
  for (std::size_t i = 0; i < h.size(); ++i) {
    elapsed.push_back(times[i] - t_first);
    if (!rate_column.empty()) rate.push_back(h.column(rate_column)[i]);
    else if (i > 0 && times[i] > times[i - 1] && steps[i] > steps[i - 1])
      rate.push_back((steps[i] - steps[i - 1]) / (times[i] - times[i - 1]));
    else rate.push_back(std::numeric_limits<double>::quiet_NaN());
  }
  body += "<h2>Throughput</h2><div class=\"charts\" id=\"throughput\">" +
          detail::line_chart("throughput-chart", rate_column.empty() ? "steps/s" : rate_column,
                             "seconds since the first report", elapsed, rate, time_markers) +
          "</div>";

  // Final metrics: the last report.
  body += "<h2>Final metrics</h2>";
  if (!h.empty()) body += detail::table_of("final-metrics", nlohmann::json(h.rows().back()));
  else body += "<p id=\"final-metrics\">No report was made.</p>";

  for (const auto& e : run.evaluations) {
    body += "<h2>Evaluation <code>" + escape(e.value("name", "")) + "</code></h2>";
    if (!e.value("checkpoint", std::string()).empty())
      body += "<p>checkpoint <code>" + escape(e.value("checkpoint", "")) + "</code></p>";
    body += detail::table_of("evaluation-" + e.value("name", std::string()), e.value("metrics", nlohmann::json::object()));
    if (e.contains("confusion_matrix")) body += detail::confusion_table(e);
  }

  if (run.checkpoints.contains("checkpoints")) {
    const std::string score = run.checkpoints.value("score_attribute", "");
    body += "<h2>Checkpoints</h2><table id=\"checkpoints\"><tr><th>directory</th><th>iteration</th><th>step</th><th>" +
            escape(score.empty() ? "score" : score) + "</th><th></th></tr>";
    for (const auto& c : run.checkpoints.at("checkpoints")) {
      std::string tags;
      if (c.value("best", false)) tags += "best ";
      if (c.value("latest", false)) tags += "latest";
      body += "<tr><td>" + escape(c.value("directory", "")) + "</td><td>" + std::to_string(c.value("iteration", 0)) +
              "</td><td>" + std::to_string(c.value("step", 0)) + "</td><td>" +
              (c.contains("score") && !c.at("score").is_null() ? escape(detail::metric_text(c.at("score"))) : "-") +
              "</td><td>" + tags + "</td></tr>";
    }
    body += "</table>";
  }

  std::vector<std::pair<std::string, std::string>> params;
  flatten(run.params, "", params);
  body += "<h2>Parameters</h2><table id=\"params\"><tr><th>name</th><th>value</th></tr>";
  for (const auto& [k, v] : params) body += "<tr><td>" + escape(k) + "</td><td>" + escape(v) + "</td></tr>";
  body += "</table>";

  static constexpr const char* style =
      "body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222;background:#fff}"
      "h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}"
      ".status{font-weight:600}.status.finished{color:#1a7f37}.status.failed{color:#cf222e}.status.running{color:#9a6700}"
      "pre.error{background:#fff0f0;padding:8px;white-space:pre-wrap}"
      ".charts{display:flex;flex-wrap:wrap;gap:12px}figure.chart{margin:0;border:1px solid #e5e5e5}"
      "svg .line{fill:none;stroke:#1f77b4;stroke-width:2}svg .point{fill:#1f77b4}"
      "svg .grid{stroke:#eee}svg .frame{fill:none;stroke:#999}svg .tick,svg .axis{font-size:11px;fill:#555}"
      "svg .title{font-size:13px;font-weight:600;fill:#222}svg .restart{stroke:#d62728;stroke-width:2;stroke-dasharray:5,4}"
      "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}"
      "td:first-child,th:first-child{text-align:left}.confusion-matrix td{min-width:38px}"
      ".confusion-matrix td.dark{color:#fff}caption{caption-side:bottom;color:#666;font-size:12px}";
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>dtrain run " + escape(run.name()) +
         "</title><style>" + style + "</style></head><body>" + body + "</body></html>\n";
}

/// Renders run_dir's files into run_dir/report.html; returns its path.
inline std::filesystem::path write_report(const std::filesystem::path& run_dir) {
  const auto path = RunDirectory(run_dir).report();
  write_atomically(path, render_report(RunRecord::read(run_dir)));
  return path;
}

}  // namespace tracking

DTRAIN_NAMESPACE_END
