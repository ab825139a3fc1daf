// SPDX-License-Identifier: Apache-2.0
#pragma once
// RunTracking: a run's record from its start to its end, handed to the Tracker. The one code path
// for dtrain's driver and for rank 0 under torchrun, Slurm or Open MPI, so that a launched run
// leaves the same files (params.json, outcome.json, checkpoints.json, report.html, the MLflow
// store) as one run by dtrain's own driver.

#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include <dtrain/config.hpp>
#include <dtrain/result.hpp>
#include <dtrain/tracking/record.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tracking {

/// A Tracker policy's hooks (concept/tracker.hpp), so that the record is kept by code that does not
/// depend on the Tracker's type.
struct TrackerHooks {
  void (*start)(const RunRecord&) = nullptr;
  void (*end)(const RunRecord&) = nullptr;
  void (*heartbeat)(const RunRecord&) = nullptr;  // optional: none where the Tracker has none

  template <class Tracker>
  static TrackerHooks of() {
    TrackerHooks hooks{&Tracker::start, &Tracker::end};
    if constexpr (requires(const RunRecord& r) { Tracker::heartbeat(r); }) hooks.heartbeat = &Tracker::heartbeat;
    return hooks;
  }
};

class RunTracking {
 public:
  /// The record of a run that starts now: `params` (params_json), and outcome "running" with no
  /// failures. `persists`: the Trainer's Checkpointer writes checkpoints (checkpoints.json).
  RunTracking(nlohmann::json params, const RunConfig& run, bool persists, TrackerHooks tracker);

  /// A launched group restarted by its launcher (torchrun's `--max_restarts`): the same run, so
  /// its start time (and MLflow run id) is the first group's, read back from outcome.json.
  ///
  /// The group before this one failed: its rank 0 recorded "failed" and the error when it could;
  /// when it could not (rank 0 killed by a signal, its host lost), outcome.json still says
  /// "running", and this failure is recorded now, as unexplained. Either way it joins "failures".
  void continue_run(int restarts, std::int64_t resumed_step);

  /// The Tracker's start: params.json and outcome.json "running" (and MLflow's run).
  void start() { tracker_.start(record_); }

  /// The driver's heartbeat: outcome.json's heartbeat_time, rewritten through the Tracker's
  /// heartbeat (when it has one) at most every launch::driver_heartbeat_interval. Call it often;
  /// the first call, before start(), only says that the driver beats. Never throws: a write that
  /// fails (a full disk) is tried again at the next beat.
  void beat();

  nlohmann::json& outcome() { return record_.outcome; }

  /// Records a worker group's start in outcome.json's "groups" (written with the outcome).
  void group_started(int attempt, int world_size, std::int64_t step, const std::string& reason);

  /// The run's end, for the Tracker and the Result alike: the run directory read once, its
  /// checkpoints verified once (damaged ones are reported on stderr and passed over).
  Result end(const std::string& status, int restarts, const std::string& error, int error_rank = -1);

 private:
  RunConfig run_;
  bool persists_;
  TrackerHooks tracker_;
  RunRecord record_;
  bool beating_ = false;
  std::chrono::steady_clock::time_point last_beat_{};
};

}  // namespace tracking

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tracking/impl/run_tracking.ipp>
#endif
