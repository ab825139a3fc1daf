// SPDX-License-Identifier: Apache-2.0
#pragma once
// ResultGrid: every trial of a Tuner experiment, its config, status, metrics and run (Ray Tune's
// ResultGrid); read from the experiment directory, so a finished, stopped or killed experiment
// reads back the same way: tune::ResultGrid::from_path(dir).

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/error.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/result.hpp>
#include <dtrain/run_directory.hpp>
#include <dtrain/tune/experiment.hpp>
#include <dtrain/tune/scheduler.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tune {

/// Which of a trial's reports best_result compares: its last one with the metric (Ray's "last"),
/// or its best one ("all").
enum class Scope { last, all };

/// One trial: what the search chose, how it ended, and its run.
struct TrialResult {
  std::string id;  // trial_NNNN, also its run directory's name
  std::size_t index = 0;
  /// The parameters the search chose (flat names, "model.layers"), without the base config.
  Metrics config;
  /// The seed its random parameters were drawn with.
  std::uint64_t seed = 0;
  /// "pending" (not started), "running", "finished" (its loop ended, or the scheduler ended it:
  /// see stopped_early), "failed", "stopped" (a signal stopped the experiment; a re-run resumes
  /// it) or "interrupted" (its driver was killed; a re-run resumes it).
  std::string status = "pending";
  /// Whether the scheduler ended it, at which time and why.
  bool stopped_early = false;
  double stopped_at = 0;
  std::string stop_reason;
  /// Why it failed.
  std::optional<std::string> error;
  /// Its run: metrics, metrics_history, checkpoints (best_checkpoint() by the Trainer's
  /// CheckpointConfig), as fit() returns it.
  Result result;

  const std::filesystem::path& path() const { return result.path; }
  /// The last report's metrics.
  const Metrics& metrics() const { return result.metrics; }
  /// Whether the trial ran to its end (or to the scheduler's stop): it will not run again.
  bool done() const { return status == "finished" || status == "failed"; }

  /// `metric` of its last report that has it (Scope::last) or its best (Scope::all); NaN when it
  /// never reported it.
  double score(std::string_view metric, Mode mode, Scope scope = Scope::last) const {
    double out = std::nan("");
    for (double v : result.metrics_history.column(metric)) {
      if (!std::isfinite(v)) continue;
      if (scope == Scope::last || std::isnan(out) || (mode == Mode::min ? v < out : v > out)) out = v;
    }
    return out;
  }
};

class ResultGrid {
 public:
  /// Every trial of the experiment at `dir` (trial_NNNN directories with a trial.json), in index
  /// order. With `with_checkpoints` each trial's checkpoints are read and verified too.
  static ResultGrid from_path(const std::filesystem::path& dir, bool with_checkpoints = true) {
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

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TrialResult>& trials() const { return trials_; }
  std::vector<TrialResult>& trials() { return trials_; }
  std::size_t size() const { return trials_.size(); }
  const TrialResult& operator[](std::size_t i) const { return trials_.at(i); }
  auto begin() const { return trials_.begin(); }
  auto end() const { return trials_.end(); }
  /// The metric and mode of the experiment's TuneConfig.
  const std::string& metric() const { return metric_; }
  Mode mode() const { return mode_; }

  /// The trial whose `metric` is best by `mode` (Ray's get_best_result): compared on each
  /// trial's last report with the metric, or its best (Scope::all). Failed trials take part with
  /// what they reported. Throws ConfigError when no trial reported the metric.
  const TrialResult& best_result(std::string_view metric, Mode mode, Scope scope = Scope::last) const {
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
  /// best_result by the experiment's own metric and mode.
  const TrialResult& best_result(Scope scope = Scope::last) const { return best_result(metric_, mode_, scope); }

  /// The trials that failed.
  std::vector<const TrialResult*> errors() const {
    std::vector<const TrialResult*> out;
    for (const auto& t : trials_)
      if (t.status == "failed") out.push_back(&t);
    return out;
  }

  /// One row per trial (trials.csv): trial, status, stopped_early, each config name as
  /// config/<name>, the last report's metrics, and best_<metric>.
  MetricsHistory table() const {
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

  /// The grid as results.json holds it.
  nlohmann::json to_json() const {
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

 private:
  static TrialResult read_trial(const std::filesystem::path& dir, const SchedulerLog& log, bool with_checkpoints) {
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

  std::string reported_names() const {
    std::set<std::string> names;
    for (const auto& t : trials_)
      for (const auto& c : t.result.metrics_history.columns()) names.insert(c);
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
    return out.empty() ? "none" : out;
  }

  std::filesystem::path path_;
  std::string metric_;
  Mode mode_ = Mode::min;
  std::vector<TrialResult> trials_;
};

}  // namespace tune

DTRAIN_NAMESPACE_END
