// SPDX-License-Identifier: Apache-2.0
#pragma once
// The timing columns every report carries, as Ray Train's results do:
//   time_this_iter_s  seconds since the previous report (since the group's start for its first)
//   time_total_s      seconds of training so far, counted on across resumes (the checkpoint the
//                     group resumed from carries the total it had)
//   samples_per_s     the samples every rank took from the Trainer's Sampler since the previous
//                     report, summed over the ranks, over time_this_iter_s
// A value the loop reports under one of these names is kept: the loop's own wins.

#include <chrono>
#include <cstdint>
#include <utility>

#include <dtrain/config.hpp>
#include <dtrain/metrics.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tracking {

class ReportTiming {
  using clock = std::chrono::steady_clock;

 public:
  /// The group starts its loop now; `resumed` are the metrics of the checkpoint it resumed from
  /// (empty for a fresh start).
  void start(const Metrics& resumed = {});
  /// This rank took `n` samples of the Trainer's Sampler.
  void add_samples(std::int64_t n) { samples_ += n; }
  /// This rank's samples since the previous report; counting starts again.
  std::int64_t take_samples() { return std::exchange(samples_, 0); }

  /// Adds time_this_iter_s and time_total_s to a report's row; returns time_this_iter_s.
  double fill_times(Metrics& row);
  /// Adds samples_per_s: the group took `group_samples` over `iter_s` (fill_times' answer).
  static void fill_rate(Metrics& row, double group_samples, double iter_s) {
    row.try_emplace("samples_per_s", iter_s > 0 ? group_samples / iter_s : 0.0);
  }

 private:
  double total_before_ = 0;
  clock::time_point started_ = clock::now(), last_ = started_;
  std::int64_t samples_ = 0;
};

}  // namespace tracking

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tracking/impl/report_timing.ipp>
#endif
