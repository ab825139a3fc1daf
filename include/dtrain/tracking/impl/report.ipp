// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of report.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tracking/report.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tracking {
namespace detail {

DTRAIN_INLINE bool is_curve(const std::string& column) {
  static const std::set<std::string> skip = {"iteration", "epoch",          "step",        "timestamp",
                                             "event",     "world_size",     "time_total_s", "time_this_iter_s"};
  return !skip.count(column) && !column.ends_with("_unix") && column.find("samples_per_s") == std::string::npos;
}

DTRAIN_INLINE std::string chart_of(std::string column) {
  for (bool cut = true; cut;) {
    cut = false;
    for (std::string_view prefix : {"train_", "training_", "val_", "valid_", "validation_", "eval_", "test_"})
      if (column.size() > prefix.size() && column.compare(0, prefix.size(), prefix) == 0) {
        column.erase(0, prefix.size());
        cut = true;
      }
  }
  return column;
}

DTRAIN_INLINE bool varies(const html::Series& s) {
  if (s.points() < 2) return false;
  std::optional<double> first;
  for (std::size_t i = 0; i < s.xs.size() && i < s.ys.size(); ++i) {
    if (!std::isfinite(s.xs[i]) || !std::isfinite(s.ys[i])) continue;
    if (first && *first != s.ys[i]) return true;
    first = s.ys[i];
  }
  return false;
}

DTRAIN_INLINE MetricsHistory step_values(const MetricsHistory& steps) {
  MetricsHistory out;
  for (const auto& row : steps.rows())
    if (!row.count("event")) out.push_back(row);
  return out;
}

DTRAIN_INLINE std::string confusion_table(const nlohmann::json& evaluation) {
  using html::escape;
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
      s += "<td style=\"background: rgba(" + rgb + "," + html::number(v == 0 ? 0.0 : a, 3) + ")\"" +
           (a > 0.55 && v ? " class=\"dark\"" : "") + ">" + std::to_string(v) + "</td>";
    }
    s += "</tr>";
  }
  return s + "</table>";
}

DTRAIN_INLINE Markers restarts_and_resumes(const RunRecord& run, double t0) {
  Markers m;
  const auto failures = run.outcome.value("failures", nlohmann::json::array());
  for (std::size_t i = 0; i < failures.size(); ++i) {
    const auto& f = failures[i];
    const std::string label = "restart " + std::to_string(i + 1) + ": " + f.value("cause", std::string());
    // resumed_step is null for the last failure of a run that gave up: no group resumed.
    if (f.contains("resumed_step") && f.at("resumed_step").is_number())
      m.by_step.push_back({f.at("resumed_step").get<double>(), label});
    if (f.contains("time") && f.at("time").is_number()) m.by_time.push_back({f.at("time").get<double>() - t0, label});
  }
  const auto& h = run.step_history;
  const auto steps = h.column("step"), times = h.column("timestamp");  // NaN where a row lacks one
  for (std::size_t i = 0; i < h.size(); ++i) {
    const auto event = h[i].find("event");
    if (event == h[i].end() || event->second.text() != "resume") continue;
    const std::string label = "resumed from step " + html::number(steps[i]) + " at " + html::utc(times[i]);
    m.by_step.push_back({steps[i], label});
    m.by_time.push_back({times[i] - t0, label});
  }
  return m;
}
}  // namespace detail

DTRAIN_INLINE std::string render_report(const RunRecord& run) {
  using html::escape;
  using html::number;
  const auto& h = run.history;
  const auto steps_rows = detail::step_values(run.step_history);
  const std::string status = run.outcome.value("status", "unknown");
  const auto failures = run.outcome.value("failures", nlohmann::json::array());
  // "/run/progress/record_every" of params.json, when it is there and a number.
  const auto every = run.params.value(nlohmann::json::json_pointer("/run/progress/record_every"), nlohmann::json());
  const std::int64_t record_every = every.is_number_integer() ? every.get<std::int64_t>() : 0;
  // Time runs from the first thing recorded (the first group's start, else the first report) to
  // the last; past ten minutes the time axis counts minutes.
  double t0 = std::numeric_limits<double>::infinity(), t_last = -t0;
  for (const auto* table : {&run.step_history, &h})
    for (double t : table->column("timestamp"))
      if (std::isfinite(t)) {
        t0 = std::min(t0, t);
        t_last = std::max(t_last, t);
      }
  const bool minutes = t_last - t0 > 600;
  const auto markers = detail::restarts_and_resumes(run, std::isfinite(t0) ? t0 : 0);

  std::string body = "<h1>dtrain run <code>" + escape(run.name()) + "</code></h1>";
  body += "<p class=\"status " + escape(status) + "\" id=\"outcome\">" + escape(status);
  if (run.outcome.contains("restarts"))
    body += " &middot; " + std::to_string(run.outcome.value("restarts", 0)) + " restart(s)";
  const double start = run.outcome.value("start_time", 0.0), end = run.outcome.value("end_time", 0.0);
  body += " &middot; started " + escape(html::utc(start));
  if (end > 0) body += " &middot; took " + escape(html::duration(end - start));
  body += " &middot; " + std::to_string(h.size()) + " report(s)</p>";
  if (run.outcome.contains("error") && !run.outcome.at("error").is_null())
    body += "<pre class=\"error\">" + escape(run.outcome.value("error", "")) + "</pre>";
  if (!failures.empty()) {
    body += "<h2>Restarts</h2><ol id=\"restarts\">";
    for (const auto& f : failures)
      body += "<li>" + escape(html::utc(f.value("time", 0.0))) + ": " + escape(f.value("cause", "")) +
              (f.contains("resumed_step") && f.at("resumed_step").is_number()
                   ? " &rarr; resumed from step " + std::to_string(f.at("resumed_step").get<std::int64_t>())
                   : std::string(" &rarr; not restarted (no failures left)")) +
              "</li>";
    body += "</ol>";
  }

  // Curves by step: the step history's columns first (the finest), then the reports', grouped
  // into charts by quantity; only series that change over two points or more.
  std::map<std::string, std::vector<html::Series>> charts;
  auto add = [&](const MetricsHistory& table, const std::string& source) {
    const auto xs = table.column("step");
    for (const auto& col : table.columns()) {
      if (!detail::is_curve(col)) continue;
      html::Series s{col, xs, table.column(col), col + " (" + source + ")"};  // the legend: what, from where
      if (detail::varies(s)) charts[detail::chart_of(col)].push_back(std::move(s));
    }
  };
  const std::string steps_source =
      record_every > 0 ? "every " + std::to_string(record_every) + " steps, rank 0" : "steps, rank 0";
  add(steps_rows, steps_source);
  add(h, "reports");
  // Losses first: the curve a person looks for.
  std::vector<std::string> order;
  for (const auto& [name, series] : charts) order.push_back(name);
  std::stable_partition(order.begin(), order.end(), [](const std::string& n) { return n.find("loss") != std::string::npos; });
  std::string curves;
  for (const auto& name : order) curves += html::line_chart("curve-" + name, name, "step", charts[name], markers.by_step);

  // Throughput over time: the step history's samples/s, and samples/s the loop reported; else
  // optimizer steps per second between reports.
  auto elapsed = [&](const MetricsHistory& table) {
    auto ts = table.column("timestamp");
    for (auto& t : ts) t = (t - t0) / (minutes ? 60 : 1);
    return ts;
  };
  std::vector<html::Series> rates;
  auto add_rates = [&](const MetricsHistory& table, const std::string& source) {
    for (const auto& col : table.columns())
      if (col.find("samples_per_s") != std::string::npos) {
        html::Series s{col, elapsed(table), table.column(col), col + " (" + source + ")"};
        if (s.points() >= 2) rates.push_back(std::move(s));
      }
  };
  add_rates(steps_rows, steps_source);
  add_rates(h, "reports");
  if (rates.empty() && h.size() >= 3) {
    const auto steps = h.column("step"), times = h.column("timestamp");
    html::Series s{"steps_per_s", elapsed(h), {}, "steps_per_s (between reports)"};
    for (std::size_t i = 0; i < h.size(); ++i)
      s.ys.push_back(i > 0 && times[i] > times[i - 1] && steps[i] > steps[i - 1]
                         ? (steps[i] - steps[i - 1]) / (times[i] - times[i - 1])
                         : std::numeric_limits<double>::quiet_NaN());
    if (s.points() >= 2) rates.push_back(std::move(s));
  }
  if (!rates.empty()) {
    auto time_markers = markers.by_time;
    for (auto& m : time_markers) m.x /= minutes ? 60 : 1;
    curves += html::line_chart("throughput-chart", "throughput",
                               minutes ? "minutes since the start" : "seconds since the start", rates, time_markers);
  }
  // Side by side, so that the first screen shows the loss and the throughput together.
  if (!curves.empty()) body += "<h2>Curves</h2><div class=\"charts\" id=\"curves\">" + curves + "</div>";

  // Every metric's latest value, when and how often it was reported.
  if (!h.empty()) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& col : h.columns()) {
      if (col == "iteration" || col == "step" || col == "epoch") continue;
      std::size_t count = 0;
      const Metrics* last = nullptr;
      for (const auto& row : h.rows())
        if (row.count(col)) {
          ++count;
          last = &row;
        }
      const auto step = last->find("step");
      rows.push_back({col, html::value_text(col, nlohmann::json(last->at(col))),
                      step == last->end() ? "-" : step->second.text(), std::to_string(count)});
    }
    body += "<h2>Final metrics</h2>" + html::table("final-metrics", {"name", "latest value", "at step", "reports"}, rows);
  }

  for (const auto& e : run.evaluations) {
    body += "<h2>Evaluation <code>" + escape(e.value("name", "")) + "</code></h2>";
    if (!e.value("checkpoint", std::string()).empty())
      body += "<p>checkpoint <code>" + escape(e.value("checkpoint", "")) + "</code></p>";
    std::vector<std::vector<std::string>> rows;
    const auto metrics = e.value("metrics", nlohmann::json::object());  // items() must not outlive it
    for (const auto& [k, v] : metrics.items()) rows.push_back({k, html::value_text(k, v)});
    body += "<div class=\"side-by-side\">" +
            html::table("evaluation-" + e.value("name", std::string()), {"name", "value"}, rows);
    if (e.contains("confusion_matrix")) body += detail::confusion_table(e);
    body += "</div>";
  }

  if (run.checkpoints.contains("checkpoints") && !run.checkpoints.at("checkpoints").empty()) {
    const std::string score = run.checkpoints.value("score_attribute", "");
    std::vector<std::vector<std::string>> rows;
    for (const auto& c : run.checkpoints.at("checkpoints")) {
      std::string tags;
      if (c.value("best", false)) tags += "best ";
      if (c.value("latest", false)) tags += "latest";
      rows.push_back({c.value("directory", ""), std::to_string(c.value("iteration", 0)), std::to_string(c.value("step", 0)),
                      c.contains("score") && !c.at("score").is_null() ? html::value_text(score, c.at("score")) : "-", tags});
    }
    body += "<h2>Checkpoints</h2>" +
            html::table("checkpoints", {"directory", "iteration", "step", score.empty() ? "score" : score, ""}, rows);
  }

  std::vector<std::pair<std::string, std::string>> params;
  flatten(run.params, "", params);
  if (!params.empty()) {
    std::vector<std::vector<std::string>> rows;
    for (auto& [k, v] : params) rows.push_back({k, v});
    body += "<h2>Parameters</h2>" + html::table("params", {"name", "value"}, rows);
  }
  return html::page("dtrain run " + run.name(), body);
}

DTRAIN_INLINE std::filesystem::path write_report(const std::filesystem::path& run_dir) {
  const auto path = RunDirectory(run_dir).report();
  write_atomically(path, render_report(RunRecord::read(run_dir)));
  return path;
}
}  // namespace tracking
DTRAIN_NAMESPACE_END
