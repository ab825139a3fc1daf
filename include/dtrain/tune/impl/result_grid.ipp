// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of result_grid.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tune/result_grid.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tune {

DTRAIN_INLINE double TrialResult::score(std::string_view metric, Mode mode, Scope scope) const {
  double out = std::nan("");
  for (double v : result.metrics_history.column(metric)) {
    if (!std::isfinite(v)) continue;
    if (scope == Scope::last || std::isnan(out) || (mode == Mode::min ? v < out : v > out)) out = v;
  }
  return out;
}

DTRAIN_INLINE ResultGrid ResultGrid::from_path(const std::filesystem::path& dir, bool with_checkpoints) {
  const ExperimentDirectory exp(dir);
  const auto tuner = tracking::read_json(exp.tuner());
  if (!tuner.is_object())
    throw Error(exp.tuner().string() + " is missing: " + dir.string() + " is not the directory of a Tuner experiment");
  ResultGrid grid;
  grid.path_ = dir;
  grid.metric_ = tuner.value("metric", std::string());
  grid.mode_ = tuner.value("mode", std::string("min")) == "max" ? Mode::max : Mode::min;
  const auto log = SchedulerLog::read(exp);
  std::vector<std::filesystem::path> trials;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_directory() && std::filesystem::exists(ExperimentDirectory::trial_spec(e.path()))) trials.push_back(e.path());
  std::sort(trials.begin(), trials.end());
  for (const auto& t : trials) grid.trials_.push_back(read_trial(t, log, with_checkpoints));
  return grid;
}

DTRAIN_INLINE const TrialResult& ResultGrid::best_result(std::string_view metric, Mode mode, Scope scope) const {
  const TrialResult* best = nullptr;
  double best_score = 0;
  for (const auto& t : trials_) {
    const double s = t.score(metric, mode, scope);
    if (std::isnan(s)) continue;
    if (!best || (mode == Mode::min ? s < best_score : s > best_score)) best = &t, best_score = s;
  }
  if (!best)
    throw ConfigError("ResultGrid::best_result: no trial of " + path_.string() + " reported \"" + std::string(metric) +
                      "\"; the loop's ctx.report() must carry it (names reported: " + reported_names() + ")");
  return *best;
}

DTRAIN_INLINE std::vector<const TrialResult*> ResultGrid::errors() const {
  std::vector<const TrialResult*> out;
  for (const auto& t : trials_)
    if (t.status == "failed") out.push_back(&t);
  return out;
}

DTRAIN_INLINE MetricsHistory ResultGrid::table() const {
  MetricsHistory rows;
  for (const auto& t : trials_) {
    Metrics row = t.metrics();
    row["trial"] = t.id;
    row["status"] = t.status;
    row["stopped_early"] = t.stopped_early;
    if (t.error) row["error"] = *t.error;
    for (const auto& [k, v] : t.config) row["config/" + k] = v;
    if (!metric_.empty()) {
      const double best = t.score(metric_, mode_, Scope::all);
      if (!std::isnan(best)) row["best_" + metric_] = best;
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

DTRAIN_INLINE nlohmann::json ResultGrid::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& t : trials_)
    list.push_back({{"trial", t.id}, {"index", t.index}, {"status", t.status}, {"config", t.config},
                    {"seed", t.seed}, {"stopped_early", t.stopped_early}, {"stop_reason", t.stop_reason},
                    {"error", t.error ? nlohmann::json(*t.error) : nlohmann::json(nullptr)},
                    {"metrics", t.metrics()}, {"path", t.path().string()}});
  nlohmann::json j = {{"format", 1}, {"metric", metric_}, {"mode", mode_ == Mode::max ? "max" : "min"}, {"trials", list}};
  try {
    j["best_trial"] = best_result().id;
  } catch (const ConfigError&) {  // nothing reported yet
    j["best_trial"] = nullptr;
  }
  return j;
}

DTRAIN_INLINE TrialResult ResultGrid::read_trial(const std::filesystem::path& dir, const SchedulerLog& log, bool with_checkpoints) {
  TrialResult t;
  const auto spec = tracking::read_json(ExperimentDirectory::trial_spec(dir));
  try {
    t.id = spec.at("id").get<std::string>();
    t.index = spec.at("index").get<std::size_t>();
    t.seed = spec.at("seed").get<std::uint64_t>();
    t.config = spec.at("config").get<Metrics>();
  } catch (const std::exception& e) {
    throw Error(ExperimentDirectory::trial_spec(dir).string() + ": not a trial description (" + e.what() + ")");
  }
  t.result.path = dir;
  if (std::filesystem::exists(RunDirectory(dir).outcome())) {
    t.result = Result::from_path(dir, with_checkpoints);
    t.status = t.result.status;
    if (t.result.error) t.error = t.result.error->message;
  }
  if (const auto s = log.stops.find(t.id); s != log.stops.end()) {
    t.stopped_early = true;
    t.stopped_at = s->second.value("time", 0.0);
    t.stop_reason = s->second.value("why", std::string());
  }
  if (const auto e = spec.find("process_error"); e != spec.end() && e->is_string() && t.status != "finished") {
    t.status = "failed";  // its process ended before fit() recorded an end
    t.error = e->get<std::string>();
  }
  return t;
}

DTRAIN_INLINE std::string ResultGrid::reported_names() const {
  std::set<std::string> names;
  for (const auto& t : trials_)
    for (const auto& c : t.result.metrics_history.columns()) names.insert(c);
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}
}  // namespace tune
DTRAIN_NAMESPACE_END
