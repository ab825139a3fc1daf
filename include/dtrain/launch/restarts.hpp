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
#include <regex>
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
inline std::string describe_failure(c10d::Store& store, const ExitStatus& ended, int n, int attempt) {
  std::vector<std::pair<double, std::string>> errors;
  for (int r = 0; r < n; ++r) {
    const auto k = key(attempt, "error/" + std::to_string(r));
    if (!store.check({k})) continue;
    const auto text = to_string(store.get(k));
    const auto space = text.find(' ');
    errors.emplace_back(std::stod(text.substr(0, space)), "rank " + std::to_string(r) + ": " + text.substr(space + 1));
  }
  std::sort(errors.begin(), errors.end());
  std::string msg = "training failed: rank " + std::to_string(ended.rank) + " " + ended.describe();
  if (!errors.empty()) {
    msg += "; first error: " + errors.front().second;
    for (std::size_t i = 1; i < errors.size(); ++i) msg += "; then " + errors[i].second;
  }
  return msg;
}

/// What makes two failures "the same": the first error's text, whichever rank raised it first
/// (a group's ranks often fail alike, in a different order each time).
inline std::string failure_signature(const std::string& cause) {
  const auto first = cause.find("; first error: ");
  std::string text = first == std::string::npos ? cause : cause.substr(first);
  text = text.substr(0, text.find("; then "));
  return std::regex_replace(text, std::regex("rank [0-9]+"), "rank");
}

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
                   std::optional<std::pair<std::int64_t, std::int64_t>> resumed) {
    ++passed_over_;
    past.push_back({{"time", unix_now()}, {"attempt", attempt}, {"cause", cause},
                    {"resumed_iteration", resumed ? resumed->first : 0},
                    {"resumed_step", resumed ? resumed->second : 0}, {"counted", false}});
  }

  /// Records group `attempt`'s failure in `past` (outcome.json's "failures"), to be resumed from
  /// `resumed` (the latest valid checkpoint's iteration and step; none: from the start). Returns
  /// the run's error message when the rules say stop: a configuration error, the same failure
  /// from the same step max_repeated_failures times, or more than max_failures failures.
  std::optional<std::string> failed(nlohmann::json& past, std::string cause, int attempt,
                                    std::optional<std::pair<std::int64_t, std::int64_t>> resumed, bool config_error) {
    failures_.push_back(std::move(cause));
    nlohmann::json entry = {{"time", unix_now()}, {"attempt", attempt}, {"cause", failures_.back()},
                            {"resumed_iteration", resumed ? resumed->first : 0},
                            {"resumed_step", resumed ? resumed->second : 0}, {"counted", true}};
    // The same cause from the same checkpoint step as the failure before: no progress was made.
    same_ = !past.empty() &&
            failure_signature(past.back()["cause"].get<std::string>()) == failure_signature(failures_.back()) &&
            past.back()["resumed_step"] == entry["resumed_step"];
    repeats_ = same_ ? repeats_ + 1 : 1;
    past.push_back(std::move(entry));

    const int allowed = config_.max_failures;
    const int repeat_limit = config_.max_repeated_failures;
    const bool repeating = repeat_limit > 0 && repeats_ >= repeat_limit && allowed != 0;
    if (!config_error && !repeating && (allowed < 0 || count() <= allowed)) return std::nullopt;

    std::string msg = count() == 1 ? failures_.front() : "training failed " + std::to_string(count()) + " times";
    if (count() > 1)
      for (std::size_t i = 0; i < failures_.size(); ++i) msg += "; attempt " + std::to_string(i) + ": " + failures_[i];
    if (config_error)
      msg += " (not restarted: a configuration error fails again on every restart; fix it and run again)";
    else if (repeating)
      msg += " (stopped: the same failure from the same checkpoint step " + std::to_string(repeats_) +
             " times in a row, so a restart would fail again; fix its cause and run again to resume. "
             "FailureConfig::max_repeated_failures = " + std::to_string(repeat_limit) + ")";
    else if (allowed > 0 || count() > 1)
      msg += " (FailureConfig::max_failures = " + std::to_string(allowed) + ")";
    past.back()["resumed_iteration"] = nullptr;  // no group resumed
    past.back()["resumed_step"] = nullptr;
    return msg;
  }

  /// Says the last failure and sleeps before its restart: the backoff doubles while the failures
  /// make no progress (up to restart_backoff_max) and starts again from restart_backoff when they do.
  /// `beat` (the driver's heartbeat) is called at least once a second meanwhile.
  void back_off(const std::function<void()>& beat = {}) {
    if (!same_) backoff_ = config_.restart_backoff;
    const int allowed = config_.max_failures;
    std::fprintf(stderr, "dtrain: %s; restarting the worker group in %.1f s (restart %d of %s)\n",
                 failures_.back().c_str(), backoff_.count() / 1000.0, count(),
                 allowed < 0 ? "unlimited" : std::to_string(allowed).c_str());
    const auto until = std::chrono::steady_clock::now() + backoff_;
    for (auto now = std::chrono::steady_clock::now(); now < until; now = std::chrono::steady_clock::now()) {
      if (beat) beat();
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(until - now, std::chrono::seconds(1)));
    }
    backoff_ = std::min(backoff_ * 2, config_.restart_backoff_max);
  }

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
