// SPDX-License-Identifier: Apache-2.0
#pragma once
// tracker::directory: the run directory's own tracking files (the default Tracker).

#include <dtrain/policy/category.hpp>
#include <dtrain/tracking/record.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tracker {

/// Writes, in storage_path/name/: params.json and outcome.json ("running") when the run starts;
/// outcome.json (finished or failed, with the cause and the restarts), checkpoints.json and
/// report.html when it ends. docs/run-directory.md describes the files.
struct directory {
  using category = dtrain::category::tracker;
  static constexpr const char* name = "directory";

  static void start(const tracking::RunRecord& run);

  /// The driver's heartbeat while the run goes on: outcome.json again, with its heartbeat_time.
  static void heartbeat(const tracking::RunRecord& run);

  static void end(const tracking::RunRecord& run);
};

}  // namespace tracker

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tracker/impl/directory.ipp>
#endif
