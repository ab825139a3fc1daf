// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Tracker concept: what is recorded about a run besides its metrics history.

#include <dtrain/policy/category.hpp>
#include <dtrain/tracking/record.hpp>

DTRAIN_NAMESPACE_BEGIN

/// Tracker.
///
/// Minimal complete definition: `using category = dtrain::category::tracker;`,
/// `static void start(const tracking::RunRecord&)`, called by the driver before the first worker
/// starts (params, outcome "running"), and `static void end(const tracking::RunRecord&)`, called
/// once the run finished or failed for good (outcome, checkpoint index, history, evaluations).
///
/// Optional members: `static void report(const tracking::RunRecord&, const Metrics& row)`, called
/// in rank 0's worker after each report's row is appended to metrics.jsonl (the record holds the
/// run's path and outcome.json as start() wrote it; no history). tracker::mlflow<> appends the
/// row's metric lines there (live curves). Without it, nothing happens per report.
/// `static void heartbeat(const tracking::RunRecord&)`, called by the driver about every
/// launch::driver_heartbeat_interval while the run goes on, with outcome.json's heartbeat_time
/// renewed: tracker::directory rewrites outcome.json, so that a reader on another machine can tell
/// a live run from one whose driver was killed (launch/liveness.hpp). Its errors are ignored.
///
/// Laws (checked by tests/laws/tracker.hpp for every model):
/// - neither throws for a run directory that is writable;
/// - start before end, end exactly once, and nothing written after end;
/// - end() may follow a start() no reader saw (a crash in between leaves outcome "running").
///
/// Models: tracker::directory, tracker::mlflow<>, tracker::tensorboard<Base> (Base's files and
/// TensorBoard's event files: tracker::tensorboard<tracker::mlflow<>> writes all three), tracker::none.
template <class T>
concept TrackerPolicy = PolicyOf<T, category::tracker> && requires(const tracking::RunRecord& run) {
  T::start(run);
  T::end(run);
};

DTRAIN_NAMESPACE_END
