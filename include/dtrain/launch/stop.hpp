// SPDX-License-Identifier: Apache-2.0
#pragma once
// Stopping a run on SIGINT or SIGTERM: the driver's signal counter, the workers' own handlers, and
// the agreement by which every rank's ctx.should_stop() turns true from the same step on.

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <optional>
#include <string>

#include <dtrain/launch/group.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

namespace detail {
inline volatile std::sig_atomic_t stop_signals = 0;  // SIGINT/SIGTERM received by this process
inline volatile std::sig_atomic_t last_stop_signal = 0;

inline void count_stop_signal(int sig) {
  stop_signals = stop_signals + 1;
  last_stop_signal = sig;
}

// A worker's handler: the first signal asks the loop to stop (ctx.should_stop()); a second one
// ends the worker at once, by that signal, as if no handler were installed.
inline void worker_stop_signal(int sig) {
  if (stop_signals > 0) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  count_stop_signal(sig);
}

inline void handle(int sig, void (*handler)(int), struct sigaction* old = nullptr) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(sig, &sa, old);
}
}  // namespace detail

/// How many SIGINT/SIGTERM this process has received (the driver's while fit() runs; a worker's
/// since it started), and the last one's number.
inline int stop_signals_received() { return detail::stop_signals; }
inline int last_stop_signal() { return detail::last_stop_signal; }

/// The driver's SIGINT and SIGTERM handlers while fit() runs: they only count the signals, which
/// the driver's watch loop acts on; the previous handlers come back when this ends.
class StopSignals {
 public:
  StopSignals() {
    detail::stop_signals = 0;
    detail::last_stop_signal = 0;
    detail::handle(SIGINT, detail::count_stop_signal, &old_int_);
    detail::handle(SIGTERM, detail::count_stop_signal, &old_term_);
  }
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

/// In a worker: SIGINT and SIGTERM (Ctrl-C reaches the whole process group; the driver, Slurm,
/// Kubernetes and torchrun send SIGTERM) ask the loop to stop instead of killing the worker; a
/// second one kills it.
inline void install_worker_stop_handlers() {
  detail::stop_signals = 0;
  detail::handle(SIGINT, detail::worker_stop_signal);
  detail::handle(SIGTERM, detail::worker_stop_signal);
}

/// The store key the driver sets to ask a group to stop (read by StopRequest).
inline std::string stop_key(int attempt) { return key(attempt, "stop"); }

/// A rank's view of a stop request, behind ctx.should_stop(). A request is seen through this
/// worker's own signal (at no cost) or the group's stop key (read at most once per `poll`). The
/// first rank to see it proposes a step a little ahead (two polls' worth of steps at the current
/// rate, at least 2), which every rank reads back: should_stop() is then true on every rank from
/// that same step on, so a loop that breaks or checkpoints on it stays in step with its peers.
class StopRequest {
 public:
  StopRequest(const Group& group, std::chrono::milliseconds poll)
      : group_(group), poll_(poll), start_(std::chrono::steady_clock::now()), next_poll_(start_) {}

  bool should_stop(std::int64_t steps) {
    if (stop_at_) return steps >= *stop_at_;
    const auto now = std::chrono::steady_clock::now();
    bool seen = stop_signals_received() > 0;
    if (!seen && now >= next_poll_) {
      next_poll_ = now + poll_;
      seen = group_.store().check({stop_key(group_.identity().attempt)});
    }
    if (!seen) return false;
    const auto at = group_.key("stop/at");
    if (group_.store().add(group_.key("stop/proposals"), 1) == 1) {
      const double elapsed = std::chrono::duration<double>(now - start_).count();
      const double steps_per_s = elapsed > 0 ? static_cast<double>(steps - first_steps_) / elapsed : 0;
      const auto margin = std::max<std::int64_t>(
          2, static_cast<std::int64_t>(std::ceil(2 * steps_per_s * std::chrono::duration<double>(poll_).count())) + 1);
      group_.store().set(at, to_bytes(std::to_string(steps + margin)));
      // The ranks that have not had a signal of their own see the key at their next poll.
      group_.store().set(stop_key(group_.identity().attempt), to_bytes("1"));
    }
    stop_at_ = std::stoll(to_string(group_.store().get(at)));  // waits for the proposer's set
    return steps >= *stop_at_;
  }

  /// Where the step count started (a resumed group counts from its checkpoint's steps).
  void start_counting_at(std::int64_t steps) { first_steps_ = steps; }

 private:
  const Group& group_;
  std::chrono::milliseconds poll_;
  std::chrono::steady_clock::time_point start_, next_poll_;
  std::int64_t first_steps_ = 0;
  std::optional<std::int64_t> stop_at_;
};

}  // namespace launch

DTRAIN_NAMESPACE_END
