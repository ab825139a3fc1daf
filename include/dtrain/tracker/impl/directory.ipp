// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of directory.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tracker/directory.hpp>
#include <dtrain/tracking/report.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tracker {

DTRAIN_INLINE void directory::start(const tracking::RunRecord& run) {
  tracking::write_json(run.directory().params(), run.params);
  tracking::write_json(run.directory().outcome(), run.outcome);
}

DTRAIN_INLINE void directory::heartbeat(const tracking::RunRecord& run) {
  tracking::write_json(run.directory().outcome(), run.outcome);
}

DTRAIN_INLINE void directory::end(const tracking::RunRecord& run) {
  tracking::write_json(run.directory().outcome(), run.outcome);
  if (!run.checkpoints.empty()) tracking::write_json(run.directory().checkpoint_index(), run.checkpoints);
  tracking::write_atomically(run.directory().report(), tracking::render_report(run));
}
}  // namespace tracker
DTRAIN_NAMESPACE_END
