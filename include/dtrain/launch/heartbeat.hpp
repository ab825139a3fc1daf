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
  bool read(c10d::Store& store, const std::string& k, std::chrono::steady_clock::time_point now);
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
std::string host_of(c10d::Store& store, int attempt, int rank);

// "batch #5 of an epoch (ctx.shard)": the rank's last progress, as its heartbeat published it.
std::string last_progress_of(c10d::Store& store, int attempt, int rank);

std::string seconds_text(std::chrono::steady_clock::duration d);

// Why a rank that made no progress is taken as stuck, and what to do when it was not.
std::string stuck_reason(bool beating, std::chrono::milliseconds timeout);
}  // namespace detail

/// This rank's heartbeat and progress publisher (its thread), and its view of the others' (watch()).
class Heartbeat {
 public:
  /// Publishes this rank's host and pid and starts beating. `heartbeat_timeout` 0 turns beat
  /// checks off, `progress_timeout` 0 progress checks; with both off no thread runs.
  Heartbeat(const WorkerIdentity& who, c10d::Store& store, std::chrono::milliseconds heartbeat_timeout,
            std::chrono::milliseconds progress_timeout = std::chrono::milliseconds(0));
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  ~Heartbeat();

  /// Collectives this rank has issued since its group started (what its heartbeat publishes).
  std::int64_t collectives() const { return collectives_issued() - collective_base_; }

  /// A peer that has issued more than `mine` collectives, as its heartbeat last published (read at
  /// most every 100 ms); -1 when none has. Every rank issues the same collectives in the same order,
  /// so a rank waiting at a group step after `mine` of them learns from this that a peer went past
  /// that step without it (or issues collectives this rank does not).
  int peer_ahead(c10d::Store& store, std::int64_t mine);
  /// The count `peer_ahead` last read for rank `r` (-1: none).
  std::int64_t peer_collectives(int r) const { return peer_collectives_[r]; }

  /// Called while this rank waits for its peers at `what`: throws WorkerError when a peer's
  /// heartbeat has not moved for the heartbeat timeout, or its progress for the progress timeout,
  /// naming it, its host and where it last made progress. Reads the store at most every quarter
  /// of the shorter timeout (progress: at least once a second). Waiting counts as progress.
  void watch(c10d::Store& store, const std::string& what);

 private:
  void beat();

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
  ProgressWatchdog(c10d::Store& store, int attempt, int world_size, std::chrono::milliseconds timeout);

  /// Reads the progress of the ranks for which `running(rank)` is true, at most every quarter of
  /// the timeout (at least once a second). The ranks whose progress stood still for the timeout,
  /// described; nothing while every rank moves or has not reached its train loop. While another
  /// rank moves (it may be waiting for a stuck one) a margin of two reads, at least 2 s, is added,
  /// so that rank names the stuck one first, with what it waits at.
  std::optional<Stuck> check(const std::function<bool(int)>& running);

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

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/launch/impl/heartbeat.ipp>
#endif
