// SPDX-License-Identifier: Apache-2.0
#pragma once
// The group protocol over the rendezvous store: store-based barriers that fail fast when a peer
// failed or left the loop, rank 0's decisions published to every rank, and the finish handshake
// that checks every rank reported equally often.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <dtrain/error.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/heartbeat.hpp>
#include <dtrain/launch/rendezvous.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

/// One worker's view of its group: who it is, the store every rank shares, and how long a wait
/// may last. Every key is scoped to the group's attempt, so a restarted group starts clean.
///
/// Cross-rank invariant: every rank calls arrive() with the same names in the same order; a rank
/// that leaves the train loop publishes how many report() calls it made (finish()), which is how
/// the others tell "left early" from "slow".
class Group {
 public:
  /// `heartbeat_timeout` (FailureConfig::heartbeat_timeout; 0: off): how long a peer's heartbeat
  /// may stand still before a rank waiting for it fails naming it; `progress_timeout` (0: off) the
  /// same for its progress (see launch/heartbeat.hpp).
  Group(const WorkerIdentity& who, c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds timeout,
        std::chrono::milliseconds heartbeat_timeout = std::chrono::milliseconds(0),
        std::chrono::milliseconds progress_timeout = std::chrono::milliseconds(0));

  const WorkerIdentity& identity() const { return who_; }
  int rank() const { return who_.rank; }
  int size() const { return who_.world_size; }
  c10d::Store& store() const { return *store_; }
  const c10::intrusive_ptr<c10d::Store>& store_ptr() const { return store_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// The store key `name` of this group's attempt.
  std::string key(const std::string& name) const { return launch::key(who_.attempt, name); }

  /// A barrier named `name` (`what` in errors): waits until every rank arrived, failing fast when
  /// a rank failed, or left the loop after fewer than `reports` report() calls (a barrier at the
  /// end of the loop, `finishing`, only watches for failures).
  ///
  /// A peer that goes on issuing collectives instead (it skipped this step, or issues collectives
  /// this rank does not) is named within about a second, from the collective counts the ranks'
  /// heartbeats publish: at a group step every rank has issued the same collectives.
  void arrive(const std::string& name, const std::string& what, std::int64_t reports, bool finishing = false) const;

  /// Waits, as arrive() does, until rank 0 has published `name` (a decide() every rank reads at
  /// the same step), failing fast when a rank failed or left the train loop.
  void await_decision(const std::string& name, const std::string& what) const;

  /// Throws when another rank of the group recorded a failure.
  void check_errors(const std::string& what) const;

  /// Throws when waiting at `what` cannot end: a rank failed, or returned from the train loop
  /// with fewer than `reports` report() calls (a negative `reports`: returned at all).
  void check_peers(const std::string& what, std::int64_t reports = -1) const;

  /// Rank 0 computes `choose()` and publishes it under `name`; every rank (rank 0 too) returns it.
  /// When choose() throws on rank 0, rank 0 rethrows and the others throw ConfigError with its
  /// message, instead of waiting for an answer that never comes.
  ///
  /// The stored value is never empty ('=' + answer, or '!' + error): LibTorch 1.13's TCPStore
  /// sends a value's length with MSG_MORE and then no bytes for an empty one, so the socket stays
  /// corked and the set, and every get of it, arrive 40-250 ms late. An empty answer (a fresh run:
  /// no checkpoint to resume) cost every rank but 0 about 0.25 s at each start.
  template <class Choose>
  std::string decide(const std::string& name, Choose&& choose) const {
    if (who_.rank == 0) {
      std::string answer;
      try {
        answer = choose();
      } catch (const std::exception& e) {
        store_->set(key(name), to_bytes(std::string("!") + e.what()));
        throw;
      }
      store_->set(key(name), to_bytes("=" + answer));
      return answer;
    }
    const auto stored = to_string(store_->get(key(name)));  // waits up to the store's timeout
    if (!stored.empty() && stored[0] == '!')
      throw ConfigError("rank 0 could not decide " + name + ": " + stored.substr(1));
    if (stored.empty() || stored[0] != '=')
      throw ConfigError("rank 0's decision on " + name + " reads '" + stored.substr(0, 80) +
                        "', not one of dtrain's: another program uses this rendezvous store; give each run its own "
                        "MASTER_PORT");
    return stored.substr(1);
  }

  /// The end of the train loop: publishes this rank's report() count, waits for every rank, and
  /// throws WorkerError when the counts differ.
  void finish(std::int64_t reports) const;

 private:
  static std::string finished_key(int rank) { return "finished/" + std::to_string(rank); }

  // Polls `done()` with a growing pause, failing when it cannot come true: a peer failed, left
  // the loop (see check_peers), went on issuing collectives past this step, or the timeout passed.
  template <class Done>
  void wait_until(Done done, const std::string& what, std::int64_t reports, bool finishing) const {
    const auto mine = heartbeat_->collectives();
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    auto pause = std::chrono::microseconds(20);
    while (!done()) {
      if (finishing) check_errors(what);
      else check_peers(what, reports);
      // A peer past this step once `done()` holds is no skip: ask `done()` again after.
      if (const int r = heartbeat_->peer_ahead(*store_, mine); r >= 0 && !done())
        throw WorkerError("rank " + std::to_string(r) + " went on past " + what + " without it: it has issued " +
                          std::to_string(heartbeat_->peer_collectives(r)) + " collectives, while rank " +
                          std::to_string(who_.rank) + " waits at " + what + " after " + std::to_string(mine) +
                          ". Every rank must make the same report() calls and collectives, in the same order; look "
                          "for a report() or a collective inside a branch on the rank or on data that differs "
                          "between ranks");
      if (std::chrono::steady_clock::now() > deadline)
        throw WorkerError("rank " + std::to_string(who_.rank) + " waited " + std::to_string(timeout_.count()) +
                          " ms at " + what + " for the other ranks; one of them hangs or skipped it");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(5000));
    }
  }

  WorkerIdentity who_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Heartbeat> heartbeat_;  // a pointer: check_peers() is const, watching is not
};

}  // namespace launch

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/launch/impl/group.ipp>
#endif
