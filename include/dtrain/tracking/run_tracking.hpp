// SPDX-License-Identifier: Apache-2.0
#pragma once
// RunTracking<Policies>: a run's record from its start to its end, handed to the Tracker. The one
// code path for dtrain's driver and for rank 0 under torchrun, Slurm or Open MPI, so that a
// launched run leaves the same files (params.json, outcome.json, checkpoints.json, report.html,
// the MLflow store) as one run by dtrain's own driver.

#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include <dtrain/config.hpp>
#include <dtrain/launch/liveness.hpp>
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
    const double now = unix_now();
    record_.outcome = {{"format", format_version}, {"status", "running"}, {"start_time", now},
                       {"end_time", nullptr}, {"restarts", 0}, {"failures", nlohmann::json::array()},
                       {"groups", nlohmann::json::array()},
                       {"error", nullptr},
                       // Who records the run, so that a reader can tell a live run from one whose
                       // driver was killed (launch/liveness.hpp); heartbeats once beat() is called.
                       {"driver", launch::ProcessIdentity::self().to_json()},
                       {"heartbeat_time", now}, {"heartbeat_interval_s", nullptr}};
  }

  /// A launched group restarted by its launcher (torchrun's `--max_restarts`): the same run, so
  /// its start time (and MLflow run id) is the first group's, read back from outcome.json.
  ///
  /// The group before this one failed: its rank 0 recorded "failed" and the error when it could;
  /// when it could not (rank 0 killed by a signal, its host lost), outcome.json still says
  /// "running", and this failure is recorded now, as unexplained. Either way it joins "failures".
  void continue_run(int restarts, std::int64_t resumed_step) {
    const auto earlier = read_json(record_.directory().outcome());
    if (earlier.is_object() && earlier.contains("start_time")) {
      record_.outcome["start_time"] = earlier["start_time"];
      if (earlier.contains("failures")) record_.outcome["failures"] = earlier["failures"];
      if (earlier.contains("groups")) record_.outcome["groups"] = earlier["groups"];
      const auto status = earlier.value("status", std::string());
      const auto error = earlier.value("error", nlohmann::json());
      std::string cause = status == "failed" && error.is_string() ? error.get<std::string>() : "";
      if (status == "running")
        cause = "the group of attempt " + std::to_string(restarts - 1) +
                " ended without its rank 0 recording why (rank 0 was killed by a signal or lost with its host; "
                "the launcher's log has its end), and the launcher restarted it";
      if (!cause.empty())
        record_.outcome["failures"].push_back({{"time", unix_now()}, {"attempt", restarts - 1}, {"cause", cause},
                                               {"resumed_step", resumed_step}});
    }
    record_.outcome["restarts"] = restarts;
  }

  /// The Tracker's start: params.json and outcome.json "running" (and MLflow's run).
  void start() { Policies::tracker::start(record_); }

  /// The driver's heartbeat: outcome.json's heartbeat_time, rewritten through the Tracker's
  /// heartbeat (when it has one) at most every launch::driver_heartbeat_interval. Call it often;
  /// the first call, before start(), only says that the driver beats. Never throws: a write that
  /// fails (a full disk) is tried again at the next beat.
  void beat() {
    const auto now = std::chrono::steady_clock::now();
    if (beating_ && now - last_beat_ < launch::driver_heartbeat_interval) return;
    const bool first = !beating_;
    beating_ = true;
    last_beat_ = now;
    record_.outcome["heartbeat_time"] = unix_now();
    record_.outcome["heartbeat_interval_s"] = launch::driver_heartbeat_interval.count();
    if (first) return;
    if constexpr (requires { Policies::tracker::heartbeat(record_); }) {
      try {
        Policies::tracker::heartbeat(record_);
      } catch (const std::exception&) {  // the next beat tries again; the run goes on
      }
    }
  }

  nlohmann::json& outcome() { return record_.outcome; }

  /// Records a worker group's start in outcome.json's "groups" (written with the outcome).
  void group_started(int attempt, int world_size, std::int64_t step, const std::string& reason) {
    record_.outcome["groups"].push_back(
        {{"attempt", attempt}, {"world_size", world_size}, {"step", step}, {"reason", reason}});
  }

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
    record_.step_history = read_step_history(record_.directory());
    record_.evaluations = files.evaluations;
    if constexpr (persists) record_.checkpoints = checkpoint_index(files.checkpoints, run_.checkpoint);
    record_.outcome["reports"] = record_.history.size();
    Policies::tracker::end(record_);
    std::optional<RunError> failure;
    if (status != "finished") failure = RunError{status, error, error_rank};
    auto result = Result::assemble(files, run_.path(), run_.checkpoint, restarts, status, std::move(failure));
    result.groups = GroupStart::list_from_json(record_.outcome["groups"]);
    return result;
  }

 private:
  RunConfig run_;
  RunRecord record_;
  bool beating_ = false;
  std::chrono::steady_clock::time_point last_beat_{};
};

}  // namespace tracking

DTRAIN_NAMESPACE_END
