// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of restarts.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/launch/restarts.hpp>

#include <regex>

DTRAIN_NAMESPACE_BEGIN
namespace launch {

DTRAIN_INLINE std::string describe_failure(c10d::Store& store, const ExitStatus& ended, int n, int attempt) {
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

DTRAIN_INLINE std::string failure_signature(const std::string& cause) {
  const auto first = cause.find("; first error: ");
  std::string text = first == std::string::npos ? cause : cause.substr(first);
  text = text.substr(0, text.find("; then "));
  return std::regex_replace(text, std::regex("rank [0-9]+"), "rank");
}

DTRAIN_INLINE void Restarts::passed_over(nlohmann::json& past, const std::string& cause, int attempt,
                                         std::optional<std::pair<std::int64_t, std::int64_t>> resumed) {
  ++passed_over_;
  past.push_back({{"time", unix_now()}, {"attempt", attempt}, {"cause", cause},
                  {"resumed_iteration", resumed ? resumed->first : 0},
                  {"resumed_step", resumed ? resumed->second : 0}, {"counted", false}});
}

DTRAIN_INLINE std::optional<std::string> Restarts::failed(nlohmann::json& past, std::string cause, int attempt,
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

DTRAIN_INLINE void Restarts::back_off(const std::function<void()>& beat) {
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
}  // namespace launch
DTRAIN_NAMESPACE_END
