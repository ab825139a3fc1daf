// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of report.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tune/report.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tune {

DTRAIN_INLINE std::string report_html(const ResultGrid& grid, const std::string& time_attr, const nlohmann::json& tuner) {
  namespace html = tracking::html;
  const auto& metric = grid.metric();
  std::string body = "<h1>Tune experiment " + html::escape(grid.path().filename().string()) + "</h1>";
  int finished = 0, early = 0, failed = 0, other = 0;
  for (const auto& t : grid) {
    if (t.status == "failed") ++failed;
    else if (t.status == "finished") ++(t.stopped_early ? early : finished);
    else ++other;
  }
  body += "<p id=\"summary\">" + std::to_string(grid.size()) + " trials: " + std::to_string(finished) +
          " ran to the end, " + std::to_string(early) + " stopped early by the scheduler, " + std::to_string(failed) +
          " failed, " + std::to_string(other) + " not finished. Metric <b>" + html::escape(metric) + "</b> (" +
          (grid.mode() == Mode::max ? "higher" : "lower") + " is better); search " +
          html::escape(tuner.value("search", nlohmann::json::object()).value("name", "")) + ", scheduler " +
          html::escape(tuner.value("scheduler", nlohmann::json::object()).value("name", "")) + ".</p>";
  const TrialResult* best = nullptr;
  try {
    best = &grid.best_result();
  } catch (const ConfigError&) {
  }
  if (best)
    body += "<p id=\"best\">Best trial: <a href=\"" + html::escape(best->id) + "/report.html\">" + html::escape(best->id) +
            "</a>, " + html::escape(metric) + " " + html::number(best->score(metric, grid.mode())) + ", config " +
            html::escape(nlohmann::json(best->config).dump()) + "</p>";

  std::vector<html::Series> series;
  for (const auto& t : grid) {
    const auto& h = t.result.metrics_history;
    html::Series s{t.id, h.column(time_attr), h.column(metric), t.id + (t.stopped_early ? " (stopped)" : "")};
    if (s.points() > 0) series.push_back(std::move(s));
  }
  body += "<h2>" + html::escape(metric) + " by " + html::escape(time_attr) + "</h2><div class=\"charts\">" +
          html::line_chart("curves", metric, time_attr, series) + "</div>";

  std::vector<std::string> names;
  const auto space = tuner.value("space", nlohmann::json::object());  // named: .items() of a temporary would dangle
  for (const auto& [name, d] : space.items()) names.push_back(name);
  body += "<h2>Trials</h2><table id=\"trials\"><tr><th>trial</th><th>status</th>";
  for (const auto& n : names) body += "<th>" + html::escape(n) + "</th>";
  body += "<th>" + html::escape(time_attr) + "</th><th>last " + html::escape(metric) + "</th><th>best " +
          html::escape(metric) + "</th></tr>";
  for (const auto& t : grid) {
    const bool has_report = std::filesystem::exists(t.path() / "report.html");
    body += "<tr class=\"trial\" data-trial=\"" + html::escape(t.id) + "\" data-status=\"" + html::escape(t.status) +
            "\"><td>" + (has_report ? "<a href=\"" + html::escape(t.id) + "/report.html\">" + html::escape(t.id) + "</a>"
                                    : html::escape(t.id)) +
            "</td><td title=\"" + html::escape(t.error.value_or(t.stop_reason)) + "\">" + html::escape(t.status) +
            (t.stopped_early ? " (stopped early)" : "") + "</td>";
    for (const auto& n : names) {
      const auto it = t.config.find(n);
      body += "<td>" + (it == t.config.end() ? std::string() : html::escape(it->second.is_integer() || !it->second.is_number()
                                                                                 ? it->second.text()
                                                                                 : html::number(it->second.number()))) +
              "</td>";
    }
    const auto times = t.result.metrics_history.column(time_attr);
    const double reached = times.empty() ? std::nan("") : times.back();
    auto cell = [](double v) { return std::isfinite(v) ? html::number(v) : std::string(); };
    body += "<td>" + cell(reached) + "</td><td>" + cell(t.score(metric, grid.mode(), Scope::last)) + "</td><td>" +
            cell(t.score(metric, grid.mode(), Scope::all)) + "</td></tr>";
  }
  body += "</table>";
  return html::page("Tune experiment " + grid.path().filename().string(), body);
}

DTRAIN_INLINE void write_summary(const ResultGrid& grid, const std::string& time_attr, const nlohmann::json& tuner) {
  const ExperimentDirectory dir(grid.path());
  const auto tmp = dir.table().string() + ".partial";
  grid.table().write_csv(tmp);
  std::filesystem::rename(tmp, dir.table());
  tracking::write_json(dir.results(), grid.to_json());
  tracking::write_atomically(dir.report(), report_html(grid, time_attr, tuner));
}
}  // namespace tune
DTRAIN_NAMESPACE_END
