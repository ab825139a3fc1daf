// SPDX-License-Identifier: Apache-2.0
#pragma once
// Heartbeats: each worker's own thread counts up a store key about once a second, over a store
// connection of its own (the training thread may block in the store); a rank that waits for its
// peers reads their counters, and a counter that has not moved for FailureConfig::heartbeat_timeout
// means that rank is stopped (SIGSTOP), frozen, or cut off: the waiting rank fails naming it and
// its host, and the driver restarts the group. A rank that is merely busy (a checkpoint, a slow
// batch) keeps beating.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <dtrain/error.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/rendezvous.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

/// This rank's heartbeat (its thread) and its view of the others' (watch()).
class Heartbeat {
 public:
  /// Publishes this rank's host and pid and starts beating; `timeout` 0 turns heartbeats off.
  Heartbeat(const WorkerIdentity& who, c10d::Store& store, std::chrono::milliseconds timeout)
      : who_(who), timeout_(timeout), seen_(who.world_size), changed_(who.world_size) {
    if (timeout_.count() <= 0 || who.world_size < 2) return;
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    store.set(key(who.attempt, "host/" + std::to_string(who.rank)),
              to_bytes(std::string(host) + " (pid " + std::to_string(::getpid()) + ")"));
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(who.master_port);
    o.isServer = false;
    o.waitWorkers = false;
    o.timeout = std::chrono::milliseconds(std::max<long long>(timeout_.count(), 1000));
    beat_store_ = c10::make_intrusive<c10d::TCPStore>(who.master_addr, o);
    const auto now = std::chrono::steady_clock::now();
    for (auto& c : changed_) c = now;
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

  /// Throws WorkerError when a peer's heartbeat has not moved for the timeout, naming it, its host
  /// and `what` this rank waits at. Reads the store at most every quarter of the timeout.
  void watch(c10d::Store& store, const std::string& what) {
    if (!thread_.joinable()) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_watch_ < timeout_ / 4) return;
    last_watch_ = now;
    for (int r = 0; r < who_.world_size; ++r) {
      if (r == who_.rank) continue;
      const auto count = store.add(key(who_.attempt, "beat/" + std::to_string(r)), 0);
      if (count != seen_[r]) {
        seen_[r] = count;
        changed_[r] = now;
        continue;
      }
      if (now - changed_[r] < timeout_) continue;
      const auto host_key = key(who_.attempt, "host/" + std::to_string(r));
      const std::string host = store.check({host_key}) ? to_string(store.get(host_key)) : "an unknown host";
      const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - changed_[r]).count();
      throw WorkerError("rank " + std::to_string(r) + " on " + host + " has shown no sign of life for " +
                        std::to_string(silent) + " ms while rank " + std::to_string(who_.rank) + " waits at " + what +
                        ": it is stopped (SIGSTOP), frozen, or its host is unreachable "
                        "(FailureConfig::heartbeat_timeout is " + std::to_string(timeout_.count()) + " ms)");
    }
  }

 private:
  void beat() {
    const auto interval = std::min(std::chrono::milliseconds(1000), timeout_ / 5);
    const auto k = key(who_.attempt, "beat/" + std::to_string(who_.rank));
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      try {
        beat_store_->add(k, 1);
      } catch (const std::exception&) {  // the store is gone: the group is ending
        return;
      }
      wake_.wait_for(lock, interval);
    }
  }

  WorkerIdentity who_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::TCPStore> beat_store_;
  std::vector<std::int64_t> seen_;
  std::vector<std::chrono::steady_clock::time_point> changed_;
  std::chrono::steady_clock::time_point last_watch_{};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace launch

DTRAIN_NAMESPACE_END
