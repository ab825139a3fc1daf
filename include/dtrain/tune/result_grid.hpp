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
  double score(std::string_view metric, Mode mode, Scope scope = Scope::last) const;
};

class ResultGrid {
 public:
  /// Every trial of the experiment at `dir` (trial_NNNN directories with a trial.json), in index
  /// order. With `with_checkpoints` each trial's checkpoints are read and verified too.
  static ResultGrid from_path(const std::filesystem::path& dir, bool with_checkpoints = true);

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
  const TrialResult& best_result(std::string_view metric, Mode mode, Scope scope = Scope::last) const;
  /// best_result by the experiment's own metric and mode.
  const TrialResult& best_result(Scope scope = Scope::last) const { return best_result(metric_, mode_, scope); }

  /// The trials that failed.
  std::vector<const TrialResult*> errors() const;

  /// One row per trial (trials.csv): trial, status, stopped_early, each config name as
  /// config/<name>, the last report's metrics, and best_<metric>.
  MetricsHistory table() const;

  /// The grid as results.json holds it.
  nlohmann::json to_json() const;

 private:
  static TrialResult read_trial(const std::filesystem::path& dir, const SchedulerLog& log, bool with_checkpoints);

  std::string reported_names() const;

  std::filesystem::path path_;
  std::string metric_;
  Mode mode_ = Mode::min;
  std::vector<TrialResult> trials_;
};

}  // namespace tune

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tune/impl/result_grid.ipp>
#endif
