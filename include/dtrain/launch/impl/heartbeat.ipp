// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of heartbeat.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/launch/heartbeat.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace launch {
namespace detail {

DTRAIN_INLINE bool ProgressSighting::read(c10d::Store& store, const std::string& k, std::chrono::steady_clock::time_point now) {
  if (!store.check({k})) return false;
  const auto text = to_string(store.get(k));
  const auto space = text.find(' ');
  const auto b = std::stoll(text.substr(0, space));
  if (b != beat) {
    beat = b;
    age = std::chrono::milliseconds(std::stoll(text.substr(space + 1)));
    seen = now;
  }
  return true;
}

DTRAIN_INLINE std::string host_of(c10d::Store& store, int attempt, int rank) {
  const auto k = key(attempt, rank_key("host", rank));
  return store.check({k}) ? to_string(store.get(k)) : "an unknown host";
}

DTRAIN_INLINE std::string last_progress_of(c10d::Store& store, int attempt, int rank) {
  const auto k = key(attempt, rank_key("progress_at", rank));
  return store.check({k}) ? to_string(store.get(k)) : "an unknown point";
}

DTRAIN_INLINE std::string seconds_text(std::chrono::steady_clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

DTRAIN_INLINE std::string stuck_reason(bool beating, std::chrono::milliseconds timeout) {
  return std::string(beating ? "; its heartbeat goes on, so it is alive but stuck: a deadlock or an endless loop in the "
                               "train loop, or a read that never returns"
                             : "; its heartbeat stood still too: it is stopped (SIGSTOP), frozen, or cut off") +
         " (FailureConfig::progress_timeout is " + std::to_string(timeout.count()) +
         " ms; a loop that may go longer without a batch, collective or report must raise it, or call "
         "dtrain::mark_progress)";
}
}  // namespace detail

DTRAIN_INLINE Heartbeat::Heartbeat(const WorkerIdentity& who, c10d::Store& store, std::chrono::milliseconds heartbeat_timeout,
                                   std::chrono::milliseconds progress_timeout)
    : who_(who), timeout_(heartbeat_timeout), progress_timeout_(progress_timeout), beats_(who.world_size),
      progress_(who.world_size), progress_base_(last_progress().count), collective_base_(collectives_issued()),
      peer_collectives_(who.world_size, -1) {
  const bool beats = timeout_.count() > 0 && who.world_size >= 2;
  // Progress is published even for a group of one: dtrain's driver watches it.
  if (!beats && progress_timeout_.count() <= 0) return;
  const bool progress = progress_timeout_.count() > 0;
  const auto shortest = !beats ? progress_timeout_ : progress ? std::min(timeout_, progress_timeout_) : timeout_;
  interval_ = std::clamp(shortest / 5, std::chrono::milliseconds(1), std::chrono::milliseconds(1000));
  watch_interval_ = !beats ? detail::read_interval(progress_timeout_)
                    : progress ? std::min(timeout_ / 4, detail::read_interval(progress_timeout_)) : timeout_ / 4;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  store.set(key(who.attempt, detail::rank_key("host", who.rank)),
            to_bytes(std::string(host) + " (pid " + std::to_string(::getpid()) + ")"));
  beat_store_ = store_client(who, std::max(shortest, std::chrono::milliseconds(1000)));
  const auto now = std::chrono::steady_clock::now();
  for (auto& b : beats_) b.since = now;
  thread_ = std::thread([this] { beat(); });
}

DTRAIN_INLINE Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

DTRAIN_INLINE int Heartbeat::peer_ahead(c10d::Store& store, std::int64_t mine) {
  if (!thread_.joinable() || who_.world_size < 2) return -1;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_collectives_read_ < std::chrono::milliseconds(100)) return -1;
  last_collectives_read_ = now;
  for (int r = 0; r < who_.world_size; ++r) {
    const auto k = key(who_.attempt, detail::rank_key("collectives", r));
    if (r == who_.rank || !store.check({k})) continue;
    peer_collectives_[r] = std::stoll(to_string(store.get(k)));
    if (peer_collectives_[r] > mine) return r;
  }
  return -1;
}

DTRAIN_INLINE void Heartbeat::watch(c10d::Store& store, const std::string& what) {
  waits_.fetch_add(1, std::memory_order_relaxed);
  if (!thread_.joinable() || who_.world_size < 2) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_watch_ < watch_interval_) return;
  last_watch_ = now;
  for (int r = 0; r < who_.world_size; ++r) {
    if (r == who_.rank) continue;
    if (timeout_.count() > 0 &&
        !beats_[r].moved(store.add(key(who_.attempt, detail::rank_key("beat", r)), 0), now) &&
        now - beats_[r].since >= timeout_) {
      const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - beats_[r].since).count();
      throw WorkerError("rank " + std::to_string(r) + " on " + detail::host_of(store, who_.attempt, r) +
                        " has shown no sign of life for " + std::to_string(silent) + " ms while rank " +
                        std::to_string(who_.rank) + " waits at " + what +
                        ": it is stopped (SIGSTOP), frozen, or its host is unreachable "
                        "(FailureConfig::heartbeat_timeout is " + std::to_string(timeout_.count()) + " ms)");
    }
    if (progress_timeout_.count() <= 0) continue;
    auto& progress = progress_[r];
    if (!progress.read(store, key(who_.attempt, detail::rank_key("progress", r)), now) ||
        progress.stood(now) < progress_timeout_)
      continue;
    throw WorkerError("rank " + std::to_string(r) + " on " + detail::host_of(store, who_.attempt, r) +
                      " made no progress for " + detail::seconds_text(progress.stood(now)) + " while rank " +
                      std::to_string(who_.rank) + " waits at " + what + ": last progress at " +
                      detail::last_progress_of(store, who_.attempt, r) +
                      detail::stuck_reason(progress.beating(now), progress_timeout_));
  }
}

DTRAIN_INLINE void Heartbeat::beat() {
  const auto beat_key = key(who_.attempt, detail::rank_key("beat", who_.rank));
  const auto progress_key = key(who_.attempt, detail::rank_key("progress", who_.rank));
  const auto where_key = key(who_.attempt, detail::rank_key("progress_at", who_.rank));
  // Published each beat once the train loop started (the first mark after this heartbeat
  // began): how long this rank's marks plus its waits for peers have stood still.
  const auto collectives_key = key(who_.attempt, detail::rank_key("collectives", who_.rank));
  std::int64_t beat_number = 0, token = -1, described = progress_base_, published = 0;
  auto moved_at = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    try {
      beat_store_->add(beat_key, 1);
      if (const auto c = collectives(); c != published) {
        beat_store_->set(collectives_key, to_bytes(std::to_string(c)));
        published = c;
      }
      if (progress_timeout_.count() > 0) {
        const auto p = last_progress();
        if (p.count > progress_base_) {
          if (p.count != described) {  // named before its age is, so a watcher never reads a stale one
            beat_store_->set(where_key, to_bytes(p.describe()));
            described = p.count;
          }
          const auto now = std::chrono::steady_clock::now();
          if (const auto t = p.count + waits_.load(std::memory_order_relaxed); t != token) {
            token = t;
            moved_at = now;
          }
          const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(now - moved_at).count();
          beat_store_->set(progress_key, to_bytes(std::to_string(++beat_number) + " " + std::to_string(age)));
        }
      }
    } catch (const std::exception&) {  // the store is gone: the group is ending
      return;
    }
    wake_.wait_for(lock, interval_);
  }
}

DTRAIN_INLINE ProgressWatchdog::ProgressWatchdog(c10d::Store& store, int attempt, int world_size, std::chrono::milliseconds timeout)
    : store_(store), attempt_(attempt), timeout_(timeout), progress_(world_size) {
  if (timeout_.count() > 0) interval_ = detail::read_interval(timeout_);
}

DTRAIN_INLINE std::optional<Stuck> ProgressWatchdog::check(const std::function<bool(int)>& running) {
  if (timeout_.count() <= 0) return std::nullopt;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_read_ < interval_) return std::nullopt;
  last_read_ = now;
  std::vector<bool> watched(progress_.size());
  bool moving = false;  // a rank that moves may be waiting for a stuck one, and name it
  for (int r = 0; r < static_cast<int>(progress_.size()); ++r) {
    watched[r] = running(r) && progress_[r].read(store_, key(attempt_, detail::rank_key("progress", r)), now);
    moving = moving || (watched[r] && progress_[r].stood(now) < timeout_);
  }
  const auto limit = moving ? timeout_ + std::max(2 * interval_, std::chrono::milliseconds(2000)) : timeout_;
  Stuck stuck;
  std::string named, others, first;
  for (int r = 0; r < static_cast<int>(progress_.size()); ++r) {
    auto& progress = progress_[r];
    if (!watched[r] || progress.stood(now) < limit) continue;
    const std::string who = "rank " + std::to_string(r) + " on " + detail::host_of(store_, attempt_, r);
    const std::string stood = detail::seconds_text(progress.stood(now));
    if (stuck.rank >= 0) {
      others += (others.empty() ? "" : ", ") + who + " for " + stood;
      continue;
    }
    stuck.rank = r;
    named = who + " made no progress for " + stood;
    // Without the times and the pid, so that the same stall twice reads as the same failure
    // (FailureConfig::max_repeated_failures).
    first = "rank " + std::to_string(r) + " made no progress: last progress at " +
            detail::last_progress_of(store_, attempt_, r) + detail::stuck_reason(progress.beating(now), timeout_);
  }
  if (stuck.rank < 0) return std::nullopt;
  stuck.cause = "training failed: " + named + (others.empty() ? "" : " (and " + others + ")") +
                "; the driver stopped the group; first error: " + first;
  return stuck;
}
}  // namespace launch
DTRAIN_NAMESPACE_END
