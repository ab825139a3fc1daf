// SPDX-License-Identifier: Apache-2.0
#pragma once
// The driver's restart rules (FailureConfig): which failed group is restarted, after how long, and
// how each failure is described and recorded in outcome.json's "failures".

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <dtrain/config.hpp>
#include <dtrain/launch/process.hpp>
#include <dtrain/launch/rendezvous.hpp>
#include <dtrain/metrics.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

/// What failed group `attempt` of `n` ranks: the rank that ended first and how, then each rank's
/// recorded error in the order they were raised (the first is the cause; the others usually lost
/// their peer).
std::string describe_failure(c10d::Store& store, const ExitStatus& ended, int n, int attempt);

/// What makes two failures "the same": the first error's text, whichever rank raised it first
/// (a group's ranks often fail alike, in a different order each time).
std::string failure_signature(const std::string& cause);

/// The run's failures so far, and FailureConfig's verdict on each.
class Restarts {
 public:
  explicit Restarts(const FailureConfig& config) : config_(config), backoff_(config.restart_backoff) {}

  /// Failures so far that count against max_failures (each one restarted, but for the last when
  /// it ended the run).
  int count() const { return static_cast<int>(failures_.size()); }

  /// Groups started again so far: after each failure (but for the last when it ended the run:
  /// subtract it) and after each checkpoint passed over (outcome.json's and Result's "restarts").
  int restarted() const { return count() + passed_over_; }

  /// Records group `attempt`'s end on a checkpoint that verified but could not be loaded into this
  /// run (`cause`): the next group passes over it as over a damaged one and resumes from
  /// `resumed`. A restart, recorded in `past` (outcome.json's "failures") with "counted": false:
  /// it does not count against max_failures. Each one leaves one checkpoint fewer, so it ends.
  void passed_over(nlohmann::json& past, const std::string& cause, int attempt,
                   std::optional<std::pair<std::int64_t, std::int64_t>> resumed);

  /// Records group `attempt`'s failure in `past` (outcome.json's "failures"), to be resumed from
  /// `resumed` (the latest valid checkpoint's iteration and step; none: from the start). Returns
  /// the run's error message when the rules say stop: a configuration error, the same failure
  /// from the same step max_repeated_failures times, or more than max_failures failures.
  std::optional<std::string> failed(nlohmann::json& past, std::string cause, int attempt,
                                    std::optional<std::pair<std::int64_t, std::int64_t>> resumed, bool config_error);

  /// Says the last failure and sleeps before its restart: the backoff doubles while the failures
  /// make no progress (up to restart_backoff_max) and starts again from restart_backoff when they do.
  /// `beat` (the driver's heartbeat) is called at least once a second meanwhile.
  void back_off(const std::function<void()>& beat = {});

 private:
  FailureConfig config_;
  std::chrono::milliseconds backoff_;
  std::vector<std::string> failures_;
  int passed_over_ = 0;  // checkpoints passed over (groups restarted, not counted as failures)
  bool same_ = false;    // the last failure repeated the one before
  int repeats_ = 0;    // consecutive failures with the same cause from the same checkpoint step
};

}  // namespace launch

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/launch/impl/restarts.ipp>
#endif
