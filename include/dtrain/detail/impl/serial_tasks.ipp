// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of serial_tasks.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/detail/serial_tasks.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace detail {

DTRAIN_INLINE pending_task serial_tasks::submit(std::function<void()> task, bool wake) {
  std::packaged_task<void()> packaged(std::move(task));
  std::shared_future<void> done = packaged.get_future().share();
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->tasks.push_back(std::move(packaged));
  }
  if (wake) queue_->changed.notify_all();
  return {done, [queue = queue_, done] { queue->run_until(done); }};
}

DTRAIN_INLINE void serial_tasks::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->stop = true;
  }
  queue_->changed.notify_all();
  thread_.join();
}

DTRAIN_INLINE void serial_tasks::queue_state::run_front(std::unique_lock<std::mutex>& lock, bool waiter) {
  auto task = std::move(tasks.front());
  tasks.pop_front();
  running = true;
  by_waiter = waiter;
  lock.unlock();
  task();  // a failure goes to the task's future
  lock.lock();
  running = false;
  // After a task the thread ran, its waiters go on. After a waiter's own task, the thread is
  // woken only if something is left for it (a task queued, or stop() waiting for the end),
  // or another thread waits: waking it for nothing would take a core from a worker.
  if (!waiter || !tasks.empty() || stop || sleeping_waiters > 0) changed.notify_all();
}

DTRAIN_INLINE void serial_tasks::queue_state::run_until(const std::shared_future<void>& done) {
  std::unique_lock<std::mutex> lock(mutex);
  while (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    if (!running && !tasks.empty()) {
      run_front(lock, true);
    } else {
      ++sleeping_waiters;
      changed.wait(lock);
      --sleeping_waiters;
    }
  }
}

DTRAIN_INLINE void serial_tasks::queue_state::serve() {
  std::unique_lock<std::mutex> lock(mutex);
  for (;;) {
    thread_sleeps = true;
    changed.wait(lock, [&] { return !running && (stop || !tasks.empty()); });
    thread_sleeps = false;
    if (tasks.empty()) return;  // stopped, and every task has run
    run_front(lock, false);
  }
}
}  // namespace detail
DTRAIN_NAMESPACE_END
