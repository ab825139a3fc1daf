// SPDX-License-Identifier: Apache-2.0
#pragma once
// Trial schedulers: at each report of a trial, whether it goes on or stops early (Ray Tune's
// TrialScheduler). A scheduler is a policy type: a user adds one by writing a type that models
// tune::Scheduler. dtrain's: fifo (never stops), asha (asynchronous successive halving) and
// median_stopping (the median stopping rule).
//
// A scheduler sees scores, higher better (the metric, negated under Mode::min), against a time:
// TuneConfig::time_attr of the report ("iteration", the report count, by default). Its decision is
// made in the trial's rank 0 at the report, with every trial's results so far (the experiment's
// scheduler.json, under a lock), and the trial ends at that report (ctx.stop_when).

#include <algorithm>
#include <cmath>
#include <concepts>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tune {

/// Whether a lower (min: a loss) or a higher (max: an accuracy) metric is better.
enum class Mode { min, max };

/// One result of a trial: its time (TuneConfig::time_attr) and score (higher better).
struct Point {
  double time = 0, score = 0;
};
/// Every trial's results so far, by trial id, each in the order reported.
using Histories = std::map<std::string, std::vector<Point>, std::less<>>;

/// A scheduler's answer to one result.
struct Decision {
  bool stop = false;
  std::string why;  // for a stop: the rule that stopped the trial, with its numbers
};

/// What a Tuner asks of a scheduler: `name`, its parameters for tuner.json (`describe()`), and
/// `on_result(histories, trial, point)`: whether `trial`, whose result `point` is new (not yet in
/// `histories`, which hold every trial's earlier results), stops.
template <class S>
concept Scheduler = std::copy_constructible<S> && requires(const S& s, const Histories& h, const std::string& id, Point p) {
  { S::name } -> std::convertible_to<std::string_view>;
  { s.describe() } -> std::convertible_to<nlohmann::json>;
  { s.on_result(h, id, p) } -> std::same_as<Decision>;
};

/// Runs every trial to the end of its loop.
struct fifo {
  static constexpr const char* name = "fifo";
  nlohmann::json describe() const { return {{"name", name}}; }
  Decision on_result(const Histories&, const std::string&, Point) const { return {}; }
};

namespace detail {
/// numpy.percentile's linear interpolation of sorted `v` at `q` in [0, 100].
double percentile(std::vector<double> v, double q);
inline std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}
}  // namespace detail

/// Asynchronous successive halving (ASHA, Li et al. 2018; Ray Tune's ASHAScheduler with one
/// bracket). Rungs at grace_period * reduction_factor^k up to max_t. A trial reaching a rung for
/// the first time is compared with the trials already recorded there: below their
/// (1 - 1/reduction_factor) quantile it stops, else it goes on and is recorded. A trial reaching
/// max_t stops there (its loop may run longer).
struct asha {
  static constexpr const char* name = "asha";
  double max_t = 100;
  double grace_period = 1;
  double reduction_factor = 4;

  void validate() const;
  nlohmann::json describe() const {
    return {{"name", name}, {"max_t", max_t}, {"grace_period", grace_period}, {"reduction_factor", reduction_factor}};
  }
  /// The rungs' times, lowest first.
  std::vector<double> rungs() const;

  Decision on_result(const Histories& histories, const std::string& trial, Point p) const;
};

/// The median stopping rule (Golovin et al. 2017; Ray Tune's MedianStoppingRule): past
/// grace_period, a trial whose best score so far is below the median of the other trials' mean
/// scores up to the same time stops, when at least min_samples_required trials have reached it.
struct median_stopping {
  static constexpr const char* name = "median_stopping";
  double grace_period = 1;
  int min_samples_required = 3;

  nlohmann::json describe() const {
    return {{"name", name}, {"grace_period", grace_period}, {"min_samples_required", min_samples_required}};
  }

  Decision on_result(const Histories& histories, const std::string& trial, Point p) const;
};

}  // namespace tune

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tune/impl/scheduler.ipp>
#endif
