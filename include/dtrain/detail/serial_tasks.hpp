// SPDX-License-Identifier: Apache-2.0
#pragma once
// Tasks that run one at a time, in the order they were submitted, on a thread of their own or on
// a thread that waits for one of them: the shared-memory channel's collectives
// (detail/shm_allreduce.hpp), whose order must be the same on every rank.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {

/// A submitted task: `done` is ready when it finished (a failure is its exception); `help`, called
/// by the thread about to wait for it, runs what is queued up to it on that thread (the executor's
/// thread may be busy with an earlier task, or not yet awake). It may outlive the executor.
struct pending_task {
  std::shared_future<void> done;
  std::function<void()> help;
};

class serial_tasks {
 public:
  serial_tasks() : thread_([queue = queue_] { queue->serve(); }) {}
  serial_tasks(const serial_tasks&) = delete;
  serial_tasks& operator=(const serial_tasks&) = delete;
  ~serial_tasks() { stop(); }

  /// Queues `task`. With `wake` false the thread is not woken for it: it runs when a waiter's
  /// help() takes it, or on the thread when a later task or the end wakes it.
  pending_task submit(std::function<void()> task, bool wake = true);

  /// Whether the task running now runs on a thread that waits for it (read from inside a task).
  bool by_waiter() const { return queue_->by_waiter; }

  /// Whether the executor's thread sleeps until woken. A task submitted without `wake` while it is
  /// still awake (busy, or about to sleep) may run on it.
  bool idle() const {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    return queue_->thread_sleeps;
  }

  /// Runs what is queued, then ends the thread; tasks submitted later are never run.
  void stop();

 private:
  // Shared with the `help` of every pending task.
  struct queue_state {
    std::mutex mutex;
    std::condition_variable changed;  // a task queued or finished, or the executor stops
    std::deque<std::packaged_task<void()>> tasks;
    bool running = false;    // one task at a time, on whichever thread took it: the order is kept
    bool by_waiter = false;  // the running task runs on a thread that waits for it
    bool stop = false;
    int sleeping_waiters = 0;  // threads in run_until() waiting for a task to finish
    bool thread_sleeps = false;  // the executor's thread waits for a task or stop()

    // Runs the first queued task on this thread, the lock released meanwhile.
    void run_front(std::unique_lock<std::mutex>& lock, bool waiter);
    void run_until(const std::shared_future<void>& done);
    void serve();
  };

  std::shared_ptr<queue_state> queue_ = std::make_shared<queue_state>();  // before thread_, which uses it
  std::thread thread_;
};

}  // namespace detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/detail/impl/serial_tasks.ipp>
#endif
