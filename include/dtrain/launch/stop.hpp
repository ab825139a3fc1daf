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
void worker_stop_signal(int sig);

void handle(int sig, void (*handler)(int), struct sigaction* old = nullptr);
}  // namespace detail

/// How many SIGINT/SIGTERM this process has received (the driver's while fit() runs; a worker's
/// since it started), and the last one's number.
inline int stop_signals_received() { return detail::stop_signals; }
inline int last_stop_signal() { return detail::last_stop_signal; }

/// The driver's SIGINT and SIGTERM handlers while fit() runs: they only count the signals, which
/// the driver's watch loop acts on; the previous handlers come back when this ends.
class StopSignals {
 public:
  StopSignals();
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
void install_worker_signal_handlers();

/// The store key the driver sets to ask a group to stop (read by StopRequest).
inline std::string stop_key(int attempt) { return key(attempt, "stop"); }
/// The store key a rank sets when its loop ended early for a stop request (ctx.should_stop()
/// answered true, or ctx.epochs() or ctx.shard() ended early): the driver records such a run
/// "stopped", and one whose loop ran out of work before the stop took effect "finished".
inline std::string stopped_early_key(int attempt) { return key(attempt, "stop/ended_early"); }

/// What a stopped run's outcome says: the last signal, to whom, and whether running the run
/// directory `run` again resumes it (`persists`: the Trainer keeps checkpoints).
std::string stop_message(const std::string& to, const std::filesystem::path& run, bool persists);

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

  bool should_stop(std::int64_t steps);

  /// Where the step count started (a resumed group counts from its checkpoint's steps).
  void start_counting_at(std::int64_t steps) {
    next_check_ = steps + 1;
    last_check_steps_ = steps;
  }

 private:
  // Rank 0's answer at a check: "stop <step>", or "<next check step> <step>".
  std::string check(std::int64_t steps);

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

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/launch/impl/stop.ipp>
#endif
