// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of stop.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/launch/stop.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace launch {
namespace detail {

DTRAIN_INLINE void worker_stop_signal(int sig) {
  if (stop_signals > 0) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  count_stop_signal(sig);
}

DTRAIN_INLINE void handle(int sig, void (*handler)(int), struct sigaction* old) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(sig, &sa, old);
}
}  // namespace detail

DTRAIN_INLINE StopSignals::StopSignals() {
  detail::stop_signals = 0;
  detail::last_stop_signal = 0;
  detail::handle(SIGINT, detail::count_stop_signal, &old_int_);
  detail::handle(SIGTERM, detail::count_stop_signal, &old_term_);
}

DTRAIN_INLINE void install_worker_signal_handlers() {
  detail::stop_signals = 0;
  detail::handle(SIGINT, detail::worker_stop_signal);
  detail::handle(SIGTERM, detail::worker_stop_signal);
  detail::handle(SIGPIPE, SIG_IGN);
}

DTRAIN_INLINE std::string stop_message(const std::string& to, const std::filesystem::path& run, bool persists) {
  const std::string msg =
      std::string("stopped by ") + (last_stop_signal() == SIGINT ? "SIGINT" : "SIGTERM") + " to " + to + "; ";
  if (persists)
    return msg + "run " + run.string() + " again (the same storage path and name) to resume from its latest checkpoint";
  return msg + "the Trainer keeps no checkpoints (checkpointer::none), so running it again starts over";
}

DTRAIN_INLINE bool StopRequest::should_stop(std::int64_t steps) {
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

DTRAIN_INLINE std::string StopRequest::check(std::int64_t steps) {
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
}  // namespace launch
DTRAIN_NAMESPACE_END
