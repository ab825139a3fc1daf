#pragma once
// The Tracker concept (moved verbatim from policy/concepts.hpp).

#include <dtrain/policy/category.hpp>
#include <dtrain/tracking/record.hpp>

DTRAIN_NAMESPACE_BEGIN

/// Tracker. Minimal complete definition: `static void start(const tracking::RunRecord&)`, called by
/// the driver before the first worker starts (params, outcome "running"), and `static void
/// end(const tracking::RunRecord&)`, called once the run finished or failed for good (outcome,
/// checkpoint index, history, evaluations).
/// Laws: neither throws for a run directory that is writable; end() may be called without a
/// successful start() having been seen by a reader (a crash in between leaves outcome "running").
/// Models: tracker::directory, tracker::mlflow<>, tracker::none.
template <class T>
concept TrackerPolicy = PolicyOf<T, category::tracker> && requires(const tracking::RunRecord& run) {
  T::start(run);
  T::end(run);
};

DTRAIN_NAMESPACE_END
