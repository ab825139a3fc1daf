// SPDX-License-Identifier: Apache-2.0
#pragma once
// Heartbeats and progress: each worker's own thread counts up a store key about once a second,
// over a store connection of its own (the training thread may block in the store), and publishes
// with it how long the worker's progress count (progress_mark.hpp), which the training thread
// advances at each batch, collective and report, has stood still.
//
// - A beat that stood still for FailureConfig::heartbeat_timeout: the rank is stopped (SIGSTOP),
//   frozen, or cut off. A busy rank (a checkpoint, a slow batch) keeps beating.
// - Progress that stood still for FailureConfig::progress_timeout while the beat goes on: the rank
//   is alive but stuck (a deadlock, an endless loop, a read from a dead mount). A rank that waits
//   for its peers counts as progressing: it is not the one to blame.
//
// A rank that waits for its peers checks both (Heartbeat::watch) and fails naming the rank and its
// host; dtrain's driver checks progress too (ProgressWatchdog), so a group whose every rank is
// stuck, or a group of one, is stopped and restarted as well. A rank cannot find itself stuck:
// its own training thread is the one that would have to act.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <dtrain/error.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/rendezvous.hpp>
#include <dtrain/progress_mark.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

namespace detail {
inline std::string rank_key(const char* what, int rank) { return std::string(what) + "/" + std::to_string(rank); }

// A counter read now and then: when it last changed, on the reader's own clock (hosts' clocks
// may differ; how long a value stood is what matters).
struct Sighting {
  std::int64_t value = 0;
  std::chrono::steady_clock::time_point since{};
  // Records `v` seen at `now`; true when it differs from the value seen before.
  bool moved(std::int64_t v, std::chrono::steady_clock::time_point now) {
    if (v == value) return false;
    value = v;
    since = now;
    return true;
  }
};

// A rank's published progress, "<beat> <ms its progress had stood still at that beat>", as a
// reader sees it. The publisher measures on its own clock; the reader adds the time since it
// first read that beat, so a rank that publishes nothing more (frozen) keeps ageing too.
struct ProgressSighting {
  std::int64_t beat = -1;  // the publisher's beat number; -1: nothing read yet
  std::chrono::milliseconds age{0};
  std::chrono::steady_clock::time_point seen{};
  // Reads `k`; false while nothing is published (the rank's train loop has not started).
  bool read(c10d::Store& store, const std::string& k, std::chrono::steady_clock::time_point now) {
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
  // How long the rank has made no progress, as far as can be told at `now`.
  std::chrono::steady_clock::duration stood(std::chrono::steady_clock::time_point now) const { return age + (now - seen); }
  // Whether its heartbeat thread still publishes (at least once a second when it does).
  bool beating(std::chrono::steady_clock::time_point now) const { return now - seen < std::chrono::seconds(3); }
};

// How often a watcher reads counters of a timeout: a quarter of it, at most a second apart.
inline std::chrono::milliseconds read_interval(std::chrono::milliseconds timeout) {
  return std::min(std::chrono::milliseconds(1000), timeout / 4);
}

// "vm (pid 10287)", as the rank published it.
inline std::string host_of(c10d::Store& store, int attempt, int rank) {
  const auto k = key(attempt, rank_key("host", rank));
  return store.check({k}) ? to_string(store.get(k)) : "an unknown host";
}

// "batch #5 of an epoch (ctx.shard)": the rank's last progress, as its heartbeat published it.
inline std::string last_progress_of(c10d::Store& store, int attempt, int rank) {
  const auto k = key(attempt, rank_key("progress_at", rank));
  return store.check({k}) ? to_string(store.get(k)) : "an unknown point";
}

inline std::string seconds_text(std::chrono::steady_clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

// Why a rank that made no progress is taken as stuck, and what to do when it was not.
inline std::string stuck_reason(bool beating, std::chrono::milliseconds timeout) {
  return std::string(beating ? "; its heartbeat goes on, so it is alive but stuck: a deadlock or an endless loop in the "
                               "train loop, or a read that never returns"
                             : "; its heartbeat stood still too: it is stopped (SIGSTOP), frozen, or cut off") +
         " (FailureConfig::progress_timeout is " + std::to_string(timeout.count()) +
         " ms; a loop that may go longer without a batch, collective or report must raise it, or call "
         "dtrain::mark_progress)";
}
}  // namespace detail

/// This rank's heartbeat and progress publisher (its thread), and its view of the others' (watch()).
class Heartbeat {
 public:
  /// Publishes this rank's host and pid and starts beating. `heartbeat_timeout` 0 turns beat
  /// checks off, `progress_timeout` 0 progress checks; with both off no thread runs.
  Heartbeat(const WorkerIdentity& who, c10d::Store& store, std::chrono::milliseconds heartbeat_timeout,
            std::chrono::milliseconds progress_timeout = std::chrono::milliseconds(0))
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
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  /// Collectives this rank has issued since its group started (what its heartbeat publishes).
  std::int64_t collectives() const { return collectives_issued() - collective_base_; }

  /// A peer that has issued more than `mine` collectives, as its heartbeat last published (read at
  /// most every 100 ms); -1 when none has. Every rank issues the same collectives in the same order,
  /// so a rank waiting at a group step after `mine` of them learns from this that a peer went past
  /// that step without it (or issues collectives this rank does not).
  int peer_ahead(c10d::Store& store, std::int64_t mine) {
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
  /// The count `peer_ahead` last read for rank `r` (-1: none).
  std::int64_t peer_collectives(int r) const { return peer_collectives_[r]; }

  /// Called while this rank waits for its peers at `what`: throws WorkerError when a peer's
  /// heartbeat has not moved for the heartbeat timeout, or its progress for the progress timeout,
  /// naming it, its host and where it last made progress. Reads the store at most every quarter
  /// of the shorter timeout (progress: at least once a second). Waiting counts as progress.
  void watch(c10d::Store& store, const std::string& what) {
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

 private:
  void beat() {
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

  WorkerIdentity who_;
  std::chrono::milliseconds timeout_, progress_timeout_;
  std::chrono::milliseconds interval_{1000}, watch_interval_{1000};
  c10::intrusive_ptr<c10d::Store> beat_store_;
  std::vector<detail::Sighting> beats_;
  std::vector<detail::ProgressSighting> progress_;
  std::int64_t progress_base_, collective_base_;
  std::vector<std::int64_t> peer_collectives_;
  std::chrono::steady_clock::time_point last_collectives_read_{};
  std::atomic<std::int64_t> waits_{0};
  std::chrono::steady_clock::time_point last_watch_{};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

/// A group that made no progress, as dtrain's driver found it: the first stuck rank, and the
/// failure's description for Result::error and outcome.json.
struct Stuck {
  int rank = -1;
  std::string cause;
};

/// dtrain's driver's view of its workers' progress (FailureConfig::progress_timeout): finds a rank
/// whose progress stood still even when no rank waits for it (every rank stuck, a group of one).
/// A rank that waits for its peers publishes progress, so only the stuck ones are named.
class ProgressWatchdog {
 public:
  /// `timeout` 0: never finds anything.
  ProgressWatchdog(c10d::Store& store, int attempt, int world_size, std::chrono::milliseconds timeout)
      : store_(store), attempt_(attempt), timeout_(timeout), progress_(world_size) {
    if (timeout_.count() > 0) interval_ = detail::read_interval(timeout_);
  }

  /// Reads the progress of the ranks for which `running(rank)` is true, at most every quarter of
  /// the timeout (at least once a second). The ranks whose progress stood still for the timeout,
  /// described; nothing while every rank moves or has not reached its train loop. While another
  /// rank moves (it may be waiting for a stuck one) a margin of two reads, at least 2 s, is added,
  /// so that rank names the stuck one first, with what it waits at.
  std::optional<Stuck> check(const std::function<bool(int)>& running) {
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

 private:
  c10d::Store& store_;
  int attempt_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds interval_{1000};
  std::vector<detail::ProgressSighting> progress_;
  std::chrono::steady_clock::time_point last_read_{};
};

}  // namespace launch

DTRAIN_NAMESPACE_END
