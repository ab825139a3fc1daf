// SPDX-License-Identifier: Apache-2.0
#pragma once
// RunTracking<Policies>: a run's record from its start to its end, handed to the Tracker. The one
// code path for dtrain's driver and for rank 0 under torchrun, Slurm or Open MPI, so that a
// launched run leaves the same files (params.json, outcome.json, checkpoints.json, report.html,
// the MLflow store) as one run by dtrain's own driver.

#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include <dtrain/config.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/result.hpp>
#include <dtrain/run_directory.hpp>
#include <dtrain/tracking/record.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tracking {

template <class Policies>
class RunTracking {
 public:
  static constexpr bool persists = Policies::checkpointer::state::persists;

  /// The record of a run that starts now: its params, and outcome "running" with no failures.
  RunTracking(const ScalingConfig& scaling, const RunConfig& run) : run_(run) {
    record_.path = run.path();
    record_.params = params_json<Policies>(scaling, run);
    record_.outcome = {{"format", format_version}, {"status", "running"}, {"start_time", unix_now()},
                       {"end_time", nullptr}, {"restarts", 0}, {"failures", nlohmann::json::array()},
                       {"error", nullptr}};
  }

  /// A launched group restarted by its launcher (torchrun's `--max_restarts`): the same run, so
  /// its start time (and MLflow run id) is the first group's, read back from outcome.json.
  void continue_run(int restarts) {
    const auto earlier = read_json(record_.directory().outcome());
    if (earlier.is_object() && earlier.contains("start_time")) {
      record_.outcome["start_time"] = earlier["start_time"];
      if (earlier.contains("failures")) record_.outcome["failures"] = earlier["failures"];
    }
    record_.outcome["restarts"] = restarts;
  }

  /// The Tracker's start: params.json and outcome.json "running" (and MLflow's run).
  void start() { Policies::tracker::start(record_); }

  nlohmann::json& outcome() { return record_.outcome; }

  /// The run's end, for the Tracker and the Result alike: the run directory read once, its
  /// checkpoints verified once (damaged ones are reported on stderr and passed over).
  Result end(const std::string& status, int restarts, const std::string& error, int error_rank = -1) {
    record_.outcome["status"] = status;
    record_.outcome["end_time"] = unix_now();
    record_.outcome["restarts"] = restarts;
    record_.outcome["error"] = error.empty() ? nlohmann::json(nullptr) : nlohmann::json(error);
    record_.outcome["error_rank"] = error_rank >= 0 ? nlohmann::json(error_rank) : nlohmann::json(nullptr);
    const auto files = RunFiles::read(run_.path(), persists);
    record_.history = files.history;
    record_.evaluations = files.evaluations;
    if constexpr (persists) record_.checkpoints = checkpoint_index(files.checkpoints, run_.checkpoint);
    record_.outcome["reports"] = record_.history.size();
    Policies::tracker::end(record_);
    std::optional<RunError> failure;
    if (status != "finished") failure = RunError{status, error, error_rank};
    return Result::assemble(files, run_.path(), run_.checkpoint, restarts, status, std::move(failure));
  }

 private:
  RunConfig run_;
  RunRecord record_;
};

}  // namespace tracking

DTRAIN_NAMESPACE_END
