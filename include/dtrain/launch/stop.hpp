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
#include <dtrain/progress_mark.hpp>

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
/// and ctx.shard(). Rank 0 alone decides, at check steps every rank knows: at each it reads its
/// own signal and the group's stop key (which the driver sets, and any rank that got a signal of
/// its own) and publishes "stop here" or the next check step; every rank reads that answer at the
/// same step and, on "stop", should_stop() is true on every rank from that step on, so a loop
/// that breaks or checkpoints on it stays in step with its peers.
///
/// Why this needs no timing: the ranks ask at the same step counts (ctx.shard() asks at every
/// batch boundary, and the counts advance in lock step), and each check is named by its number,
/// so a rank that reaches a check before rank 0 waits for rank 0's answer (at most the skew of a
/// step). Rank 0 spaces the checks about `poll` apart at the step rate since the last one (the
/// gap at most doubling from one check to the next, so a run that slows down is still checked
/// often). A rank that asked at another step than rank 0 is named: an error is better than a
/// group whose collectives no longer match.
class StopRequest {
 public:
  StopRequest(const Group& group, std::chrono::milliseconds poll)
      : group_(group), poll_(poll), last_check_(std::chrono::steady_clock::now()) {}

  bool should_stop(std::int64_t steps) {
    if (stop_at_) return steps >= *stop_at_;
    if (stop_signals_received() > 0 && !announced_ && group_.rank() != 0) {
      group_.store().set(stop_key(group_.identity().attempt), to_bytes("1"));  // rank 0 reads it at its next check
      announced_ = true;
    }
    if (steps < next_check_) return false;
    // A check is a group step, counted as a collective: a rank that skipped a report() and reached
    // it is named by the ranks waiting at that report; and it waits for rank 0 as at a barrier.
    note_collective_issued();
    const auto name = "stop/check/" + std::to_string(checks_);
    if (group_.rank() != 0) group_.await_decision(name, "the stop check at step " + std::to_string(steps));
    const auto answer = group_.decide(name, [&] { return check(steps); });
    ++checks_;
    const auto space = answer.find(' ');
    const auto at = std::stoll(answer.substr(space + 1));
    if (at != steps)
      throw Error("rank " + std::to_string(group_.rank()) + " asked whether to stop at step " + std::to_string(steps) +
                  " where rank 0 asked at step " + std::to_string(at) +
                  ": every rank must ask ctx.should_stop() at the same steps (ctx.shard and ctx.epochs do), or the "
                  "ranks cannot stop at the same step");
    if (answer.compare(0, space, "stop") == 0) {
      stop_at_ = steps;
      return true;
    }
    next_check_ = std::stoll(answer.substr(0, space));
    return false;
  }

  /// Where the step count started (a resumed group counts from its checkpoint's steps).
  void start_counting_at(std::int64_t steps) {
    next_check_ = steps + 1;
    last_check_steps_ = steps;
  }

 private:
  // Rank 0's answer at a check: "stop <step>", or "<next check step> <step>".
  std::string check(std::int64_t steps) {
    const auto now = std::chrono::steady_clock::now();
    const bool stop =
        stop_signals_received() > 0 || group_.store().check({stop_key(group_.identity().attempt)});
    // Keys of checks every rank has passed (a rank trails rank 0 by at most a step) go.
    if (checks_ >= 8) group_.store().deleteKey(group_.key("stop/check/" + std::to_string(checks_ - 8)));
    if (stop) return "stop " + std::to_string(steps);
    const double s = std::chrono::duration<double>(now - last_check_).count();
    const double steps_per_poll =
        s > 0 ? static_cast<double>(steps - last_check_steps_) / s * std::chrono::duration<double>(poll_).count() : 1;
    gap_ = std::clamp<std::int64_t>(std::llround(steps_per_poll), 1, 2 * gap_);
    last_check_ = now;
    last_check_steps_ = steps;
    return std::to_string(steps + gap_) + " " + std::to_string(steps);
  }

  const Group& group_;
  std::chrono::milliseconds poll_;
  std::chrono::steady_clock::time_point last_check_;  // rank 0: when it last checked
  std::int64_t next_check_ = 1, last_check_steps_ = 0, checks_ = 0;
  std::int64_t gap_ = 1;   // rank 0: steps between its last two checks
  bool announced_ = false;  // this rank's own signal is in the store
  std::optional<std::int64_t> stop_at_;
};

}  // namespace launch

DTRAIN_NAMESPACE_END
