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
#include <filesystem>
#include <optional>
#include <string>

#include <dtrain/error.hpp>
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
/// second one kills it. SIGPIPE is ignored, as Python ignores it: a write to a peer that closed
/// its socket (Gloo's writev to a rank that died) fails with EPIPE, which the library reports
/// and the worker records as its failure, where the signal would end the worker without a word.
inline void install_worker_signal_handlers() {
  detail::stop_signals = 0;
  detail::handle(SIGINT, detail::worker_stop_signal);
  detail::handle(SIGTERM, detail::worker_stop_signal);
  detail::handle(SIGPIPE, SIG_IGN);
}

/// The store key the driver sets to ask a group to stop (read by StopRequest).
inline std::string stop_key(int attempt) { return key(attempt, "stop"); }
/// The store key a rank sets when its loop ended early for a stop request (ctx.should_stop()
/// answered true, or ctx.epochs() or ctx.shard() ended early): the driver records such a run
/// "stopped", and one whose loop ran out of work before the stop took effect "finished".
inline std::string stopped_early_key(int attempt) { return key(attempt, "stop/ended_early"); }

/// What a stopped run's outcome says: the last signal, to whom, and whether running the run
/// directory `run` again resumes it (`persists`: the Trainer keeps checkpoints).
inline std::string stop_message(const std::string& to, const std::filesystem::path& run, bool persists) {
  const std::string msg =
      std::string("stopped by ") + (last_stop_signal() == SIGINT ? "SIGINT" : "SIGTERM") + " to " + to + "; ";
  if (persists)
    return msg + "run " + run.string() + " again (the same storage path and name) to resume from its latest checkpoint";
  return msg + "the Trainer keeps no checkpoints (checkpointer::none), so running it again starts over";
}

/// A rank's view of a stop request, behind ctx.should_stop() and the early end of ctx.epochs()
/// and ctx.shard(). A request is seen through this worker's own signal (at no cost) or the
/// group's stop key (read at most once per `poll`). The first rank to see it proposes a step a
/// little ahead, which every rank reads back: should_stop() is then true on every rank from that
/// same step on, so a loop that breaks or checkpoints on it stays in step with its peers.
///
/// Why every rank agrees: ranks advance their step counts in lock step (each step's gradients are
/// reduced over all of them), and each asks at least once per `poll` while it trains, since
/// ctx.shard() asks at every batch boundary. The proposed step lies more than two polls' worth of
/// steps ahead at the faster of the rate since the group started and the rate over the last poll
/// (and at least 2 ahead), so every rank reads it before its count reaches it. A rank that read
/// it late, past the step, could not stop at it and is named: an error is better than a group
/// whose collectives no longer match.
class StopRequest {
 public:
  StopRequest(const Group& group, std::chrono::milliseconds poll)
      : group_(group), poll_(poll), start_(std::chrono::steady_clock::now()), next_poll_(start_),
        last_poll_(start_) {}

  bool should_stop(std::int64_t steps) {
    if (stop_at_) return steps >= *stop_at_;
    const auto now = std::chrono::steady_clock::now();
    bool seen = stop_signals_received() > 0;
    if (!seen && now >= next_poll_) {
      next_poll_ = now + poll_;
      recent_rate_ = rate(steps - last_poll_steps_, now - last_poll_);
      last_poll_ = now;
      last_poll_steps_ = steps;
      seen = group_.store().check({stop_key(group_.identity().attempt)});
    }
    if (!seen) return false;
    const auto at = group_.key("stop/at");
    if (group_.store().add(group_.key("stop/proposals"), 1) == 1) {
      const double steps_per_s = std::max({rate(steps - first_steps_, now - start_), recent_rate_,
                                           rate(steps - last_poll_steps_, now - last_poll_)});
      const auto margin = std::max<std::int64_t>(
          2, static_cast<std::int64_t>(std::ceil(2 * steps_per_s * std::chrono::duration<double>(poll_).count())) + 1);
      group_.store().set(at, to_bytes(std::to_string(steps + margin)));
      // The ranks that have not had a signal of their own see the key at their next poll.
      group_.store().set(stop_key(group_.identity().attempt), to_bytes("1"));
    }
    stop_at_ = std::stoll(to_string(group_.store().get(at)));  // waits for the proposer's set
    if (steps > *stop_at_)
      throw Error("rank " + std::to_string(group_.rank()) + " learnt of the stop request at step " +
                  std::to_string(steps) + ", after the step " + std::to_string(*stop_at_) +
                  " the group agreed to stop at: it cannot stop in step with the others. Set "
                  "FailureConfig::stop_poll shorter, or ask ctx.should_stop() (or iterate ctx.shard) at every step");
    return steps >= *stop_at_;
  }

  /// Where the step count started (a resumed group counts from its checkpoint's steps).
  void start_counting_at(std::int64_t steps) { first_steps_ = last_poll_steps_ = steps; }

 private:
  static double rate(std::int64_t steps, std::chrono::steady_clock::duration d) {
    const double s = std::chrono::duration<double>(d).count();
    return s > 0 ? static_cast<double>(steps) / s : 0.0;
  }

  const Group& group_;
  std::chrono::milliseconds poll_;
  std::chrono::steady_clock::time_point start_, next_poll_, last_poll_;
  std::int64_t first_steps_ = 0, last_poll_steps_ = 0;
  double recent_rate_ = 0;  // steps per second between the last two polls
  std::optional<std::int64_t> stop_at_;
};

}  // namespace launch

DTRAIN_NAMESPACE_END
