// SPDX-License-Identifier: Apache-2.0
#pragma once
// The backend-neutral collective vocabulary: a reduction (reduce), a pending collective (Work) and
// a device-side completion (Completion). Every backend returns these and every strategy,
// precision and metric that talks through a communicator is written against them, so none of
// them includes a particular backend (only backend/gloo.hpp includes Gloo).

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>

#include <torch/csrc/distributed/c10d/Work.hpp>  // c10d's backend-neutral Work: no Gloo, no NCCL

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

/// A collective's reduction.
enum class reduce { sum, mean, max, min };

/// How a backend whose collectives complete on a device (backend::nccl: CUDA events) says that
/// one is done. wait() may return once later work on the caller's stream is ordered after it.
struct Completion {
  virtual ~Completion() = default;
  virtual void wait() = 0;
  virtual bool completed() const = 0;
};

/// A pending collective. wait() blocks until it is done and rethrows its failure, naming it.
///
/// It wraps one of: a c10d::Work (a c10d process group's collective), a shared_future (a
/// collective run on a thread of dtrain's own, e.g. the shared-memory channel), or a Completion
/// (a device-side one). A default-constructed Work is an already completed no-op (world size 1).
class Work {
 public:
  Work() = default;
  Work(c10::intrusive_ptr<c10d::Work> work, std::string what)
      : work_(std::move(work)), what_(std::move(what)) {}
  Work(std::shared_future<void> done, std::string what) : done_(std::move(done)), what_(std::move(what)) {}
  Work(std::shared_ptr<Completion> completion, std::string what)
      : completion_(std::move(completion)), what_(std::move(what)) {}

  /// This work followed by `then`, which wait() runs on the waiting thread once the collective is
  /// done (e.g. copying a result out of a staging buffer).
  Work then(std::function<void()> then) && {
    then_ = std::move(then);
    return std::move(*this);
  }

  void wait() {
    try {
      if (work_) work_->wait();
      if (done_.valid()) done_.get();
    } catch (const std::exception& e) {
      work_.reset();
      done_ = {};
      completion_.reset();
      throw WorkerError(what_ + " failed: " + e.what() +
                        " (a peer died, hung past RunConfig::collective_timeout, or the ranks "
                        "issued different collectives)");
    }
    work_.reset();
    done_ = {};
    // A device completion's errors name the collective and the rank already.
    if (auto c = std::move(completion_)) c->wait();
    if (then_) std::exchange(then_, nullptr)();
  }
  bool completed() const {
    return (!work_ || work_->isCompleted()) &&
           (!done_.valid() || done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) &&
           (!completion_ || completion_->completed());
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::shared_future<void> done_;
  std::shared_ptr<Completion> completion_;
  std::string what_;
  std::function<void()> then_;
};

DTRAIN_NAMESPACE_END
