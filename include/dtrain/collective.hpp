// SPDX-License-Identifier: Apache-2.0
#pragma once
// The backend-neutral collective vocabulary: a reduction (reduce), a pending collective (Work) and
// a device-side completion (Completion). Every backend returns these and every strategy,
// precision and metric that talks through a communicator is written against them, so none of
// them includes a particular backend (only backend/gloo.hpp includes Gloo).

#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/distributed/c10d/Work.hpp>  // c10d's backend-neutral Work: no Gloo, no NCCL

#include <dtrain/error.hpp>
#include <dtrain/progress_mark.hpp>

DTRAIN_NAMESPACE_BEGIN

/// A collective's reduction.
enum class reduce { sum, mean, max, min };

/// Where a collective runs, for a backend with a thread of its own (backend::gloo's shared-memory
/// channel; others ignore it). `background`: on that thread, overlapping what the caller does
/// meanwhile. `by_waiter`: the caller waits for it next, so it runs on the waiting thread and
/// no thread is woken for it; until waited for (or until a later collective of the channel) it
/// does not run. On a core that the workers already fill, waking a thread for a collective the
/// caller waits for at once only takes the core from a worker.
enum class runs { background, by_waiter };

/// One rank's call of a collective, as every backend exchanges it before the data: the operation,
/// its reduction or root, dtype, element count and the call's sequence number on this rank. Ranks
/// whose calls differ get CollectiveMismatch instead of each other's bytes.
struct CollectiveCall {
  enum class op : std::int64_t { allreduce = 1, broadcast, allgather, reduce_scatter, barrier };
  op operation = op::barrier;
  std::int64_t argument = -1;  // the reduction (allreduce, reduce_scatter) or the root (broadcast)
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::int64_t count = 0;  // elements this rank passes in
  std::uint64_t seq = 0;   // 1 for a communicator's first collective

  static constexpr int words = 5;
  std::array<std::int64_t, words> encode() const;
  static CollectiveCall decode(const std::int64_t* w);
  bool operator==(const CollectiveCall&) const = default;

  /// E.g. "allreduce(sum) of 1 Double value (collective #7)".
  std::string describe() const;
};

/// Ranks that issued different collectives at the same point: the message names both calls.
struct CollectiveMismatch : WorkerError {
  using WorkerError::WorkerError;
};

/// Throws CollectiveMismatch when a rank's call (in `all`: world * CollectiveCall::words values,
/// rank r's at r * words) differs from `mine`, naming the first such rank's call and this one's.
void verify_same_call(int rank, const CollectiveCall& mine, const std::int64_t* all, int world);

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
///
/// Issuing one and its wait() returning are signs of this worker's progress (progress_mark.hpp).
class Work {
 public:
  Work() = default;
  Work(c10::intrusive_ptr<c10d::Work> work, std::string what)
      : work_(std::move(work)), what_(std::move(what)) {
    detail::note_progress();
  }
  Work(std::shared_future<void> done, std::string what) : done_(std::move(done)), what_(std::move(what)) {
    detail::note_progress();
  }
  /// As above, for a queue of collectives whose thread the waiter may relieve: wait() first calls
  /// `help`, which runs the queued collectives up to this one on the waiting thread.
  Work(std::shared_future<void> done, std::function<void()> help, std::string what);
  Work(std::shared_ptr<Completion> completion, std::string what)
      : completion_(std::move(completion)), what_(std::move(what)) {
    detail::note_progress();
  }

  /// This work preceded by `verify`, which wait() runs first (once `exchange`, the exchange of
  /// the ranks' CollectiveCalls, is done; it may be null): a CollectiveMismatch it throws is
  /// rethrown as it is, before the collective's own result is looked at.
  Work verified_by(c10::intrusive_ptr<c10d::Work> exchange, std::function<void()> verify) && {
    exchange_ = std::move(exchange);
    verify_ = std::move(verify);
    return std::move(*this);
  }

  /// This work followed by `then`, which wait() runs on the waiting thread once the collective is
  /// done (e.g. copying a result out of a staging buffer).
  Work then(std::function<void()> then) && {
    then_ = std::move(then);
    return std::move(*this);
  }

  void wait();
  /// Whether it is done (a `runs::by_waiter` collective may not start before wait()).
  bool completed() const;

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::shared_future<void> done_;
  std::function<void()> help_;
  std::shared_ptr<Completion> completion_;
  c10::intrusive_ptr<c10d::Work> exchange_;
  std::function<void()> verify_;
  std::string what_;
  std::function<void()> then_;
};

namespace detail {
/// comm.allreduce(t, op, where) where the communicator takes a dtrain::runs (backend::gloo), else
/// comm.allreduce(t, op).
template <class Communicator>
Work allreduce(Communicator& comm, at::Tensor& t, reduce op, runs where) {
  if constexpr (requires { comm.allreduce(t, op, where); }) return comm.allreduce(t, op, where);
  else return comm.allreduce(t, op);
}
/// comm.broadcast(t, root, where), or comm.broadcast(t, root) likewise.
template <class Communicator>
Work broadcast(Communicator& comm, at::Tensor& t, int root, runs where) {
  if constexpr (requires { comm.broadcast(t, root, where); }) return comm.broadcast(t, root, where);
  else return comm.broadcast(t, root);
}
}  // namespace detail

/// A Backend's communicator seen through the collectives a Strategy issues: size and rank,
/// allreduce and broadcast (with dtrain::runs where the communicator takes it), and the flat
/// allgather and reduce-scatter. The parts of a Strategy written against it (DDP's reducer) are
/// compiled once for every Backend and configuration, in dtrain's library under
/// DTRAIN_SEPARATE_COMPILATION, instead of in every program for each communicator type. A view:
/// the communicator must outlive it. The cost is one indirect call per collective.
class Collectives {
 public:
  template <class Communicator>
    requires(!std::is_same_v<Communicator, Collectives>)  // a copy copies the view
  explicit Collectives(Communicator& comm) : comm_(&comm), ops_(&ops_of<Communicator>) {}

  int size() const { return ops_->size(comm_); }
  int rank() const { return ops_->rank(comm_); }
  Work allreduce(at::Tensor& t, reduce op = reduce::sum, runs where = runs::background) const {
    return ops_->allreduce(comm_, t, op, where);
  }
  Work broadcast(at::Tensor& t, int root = 0, runs where = runs::background) const {
    return ops_->broadcast(comm_, t, root, where);
  }
  /// Rank r's `in` into out[r*n, (r+1)*n), n = in.numel().
  Work allgather(at::Tensor& out, const at::Tensor& in) const { return ops_->allgather(comm_, out, in); }
  /// out (n values) receives the reduction of in[rank*n, (rank+1)*n) over the ranks.
  Work reduce_scatter(at::Tensor& out, at::Tensor& in, reduce op = reduce::sum) const {
    return ops_->reduce_scatter(comm_, out, in, op);
  }

 private:
  struct ops {
    int (*size)(void*);
    int (*rank)(void*);
    Work (*allreduce)(void*, at::Tensor&, reduce, runs);
    Work (*broadcast)(void*, at::Tensor&, int, runs);
    Work (*allgather)(void*, at::Tensor&, const at::Tensor&);
    Work (*reduce_scatter)(void*, at::Tensor&, at::Tensor&, reduce);
  };
  [[noreturn]] static Work unsupported(const char* what);
  template <class C>
  static C& as(void* c) {
    return *static_cast<C*>(c);
  }
  template <class C>
  static constexpr ops ops_of = {
      [](void* c) { return as<C>(c).size(); },
      [](void* c) { return as<C>(c).rank(); },
      [](void* c, at::Tensor& t, reduce op, runs where) { return detail::allreduce(as<C>(c), t, op, where); },
      [](void* c, at::Tensor& t, int root, runs where) { return detail::broadcast(as<C>(c), t, root, where); },
      [](void* c, at::Tensor& out, const at::Tensor& in) {
        if constexpr (requires(C& x) { x.allgather(out, in); }) return as<C>(c).allgather(out, in);
        else return unsupported("allgather");
      },
      [](void* c, at::Tensor& out, at::Tensor& in, reduce op) {
        if constexpr (requires(C& x) { x.reduce_scatter(out, in, op); }) return as<C>(c).reduce_scatter(out, in, op);
        else return unsupported("reduce_scatter");
      },
  };

  void* comm_;
  const ops* ops_;
};

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/impl/collective.ipp>
#endif
