// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of run_tracking.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <exception>
#include <optional>
#include <utility>

#include <dtrain/launch/liveness.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/run_directory.hpp>
#include <dtrain/tracking/run_tracking.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tracking {

DTRAIN_INLINE RunTracking::RunTracking(nlohmann::json params, const RunConfig& run, bool persists,
                                       TrackerHooks tracker)
    : run_(run), persists_(persists), tracker_(tracker) {
  record_.path = run.path();
  record_.params = std::move(params);
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

DTRAIN_INLINE void RunTracking::continue_run(int restarts, std::int64_t resumed_step) {
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

DTRAIN_INLINE void RunTracking::beat() {
  const auto now = std::chrono::steady_clock::now();
  if (beating_ && now - last_beat_ < launch::driver_heartbeat_interval) return;
  const bool first = !beating_;
  beating_ = true;
  last_beat_ = now;
  record_.outcome["heartbeat_time"] = unix_now();
  record_.outcome["heartbeat_interval_s"] = launch::driver_heartbeat_interval.count();
  if (first || tracker_.heartbeat == nullptr) return;
  try {
    tracker_.heartbeat(record_);
  } catch (const std::exception&) {  // the next beat tries again; the run goes on
  }
}

DTRAIN_INLINE void RunTracking::group_started(int attempt, int world_size, std::int64_t step,
                                              const std::string& reason) {
  record_.outcome["groups"].push_back(
      {{"attempt", attempt}, {"world_size", world_size}, {"step", step}, {"reason", reason}});
}

DTRAIN_INLINE Result RunTracking::end(const std::string& status, int restarts, const std::string& error,
                                      int error_rank) {
  record_.outcome["status"] = status;
  record_.outcome["end_time"] = unix_now();
  record_.outcome["restarts"] = restarts;
  record_.outcome["error"] = error.empty() ? nlohmann::json(nullptr) : nlohmann::json(error);
  record_.outcome["error_rank"] = error_rank >= 0 ? nlohmann::json(error_rank) : nlohmann::json(nullptr);
  const auto files = RunFiles::read(run_.path(), persists_);
  record_.history = files.history;
  record_.step_history = read_step_history(record_.directory());
  record_.evaluations = files.evaluations;
  if (persists_) record_.checkpoints = checkpoint_index(files.checkpoints, run_.checkpoint);
  record_.outcome["reports"] = record_.history.size();
  tracker_.end(record_);
  std::optional<RunError> failure;
  if (status != "finished") failure = RunError{status, error, error_rank};
  auto result = Result::assemble(files, run_.path(), run_.checkpoint, restarts, status, std::move(failure));
  result.groups = GroupStart::list_from_json(record_.outcome["groups"]);
  return result;
}

}  // namespace tracking
DTRAIN_NAMESPACE_END
