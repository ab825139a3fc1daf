// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of gloo.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <cstdio>
#include <cstdlib>
#include <utility>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <dtrain/backend/detail/gloo_peers.hpp>
#include <dtrain/backend/detail/hierarchical.hpp>
#include <dtrain/backend/gloo.hpp>
#include <dtrain/detail/shm_allreduce.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {

inline Work shm_work(shm_channel::pending p, std::string what) {
  return Work(std::move(p.done), std::move(p.help), std::move(what));
}

inline c10d::ReduceOp to_c10d(reduce op) {
  switch (op) {
    case reduce::max: return c10d::ReduceOp::MAX;
    case reduce::min: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;
  }
}

// Gloo's transport: GLOO_SOCKET_IFNAME's interface, loopback when MASTER_ADDR is, else the address
// this host's name resolves to.
inline std::shared_ptr<::gloo::transport::Device> make_gloo_device() {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  const char* addr = std::getenv("MASTER_ADDR");
  const std::string a = addr ? addr : "127.0.0.1";
  if (a == "localhost" || a.rfind("127.", 0) == 0 || a == "::1")
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace detail

namespace backend {

DTRAIN_INLINE gloo_communicator::gloo_communicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                   const launch::WorkerIdentity& who,
                                                   std::chrono::milliseconds timeout, int threads)
    : rank_(who.rank), size_(who.world_size) {
  group_ = detail::guarded_gloo_group(store, "gloo", rank_, size_, timeout, threads, detail::make_gloo_device);
  if (size_ > 1 && who.local_world_size == size_ && launch::detail::env("DTRAIN_SHARED_MEMORY") != "0")
    shm_ = std::make_unique<detail::shm_channel>(*store, "shm", rank_, size_, timeout);
  else if (size_ > 1 && launch::detail::env("DTRAIN_HIERARCHICAL") != "0" &&
           launch::detail::env("DTRAIN_SHARED_MEMORY") != "0")
    start_hierarchy(store, timeout);
}

DTRAIN_INLINE void gloo_communicator::on_stall(std::function<void()> check) {
  stall_check_ = check;
  if (shm_) shm_->on_stall(check);
  if (hier_) hier_->on_stall(std::move(check));
}

DTRAIN_INLINE gloo_communicator::~gloo_communicator() {
  // A collective given up on (a silent peer, mismatched calls) may still block one of Gloo's
  // threads until the collective timeout, and destroying the process group would wait for it:
  // leave it to the process's exit, so the error is reported at once.
  if (abandoned_->load()) (void)group_.release();
}

DTRAIN_INLINE Work gloo_communicator::allreduce(torch::Tensor& t, reduce op, runs where) {
  const auto call = describe(CollectiveCall::op::allreduce, static_cast<std::int64_t>(op), t);
  const std::string what = "allreduce of " + std::to_string(t.numel()) + " values";
  if (shm_ && detail::shm_channel::supports(t) && (op == reduce::sum || op == reduce::mean))
    return detail::shm_work(shm_->allreduce(call, t, op == reduce::mean, where == runs::background), what);
  if (hier_ && detail::shm_channel::supports(t) && (op == reduce::sum || op == reduce::mean))
    return detail::shm_work(hier_->allreduce(call, t, op == reduce::mean), what);
  return checked(call, [&] { return gloo_allreduce(t, op); }, what);
}

DTRAIN_INLINE Work gloo_communicator::broadcast(torch::Tensor& t, int root, runs where) {
  const auto call = describe(CollectiveCall::op::broadcast, root, t);
  const std::string what = "broadcast from rank " + std::to_string(root);
  if (shm_ && t.device().is_cpu() && t.is_contiguous())
    return detail::shm_work(shm_->broadcast(call, t, root, where == runs::background), what);
  return checked(call, [&] {
    std::vector<torch::Tensor> v{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return group_->broadcast(v, o);
  }, what);
}

DTRAIN_INLINE Work gloo_communicator::allgather(std::vector<torch::Tensor>& out, const torch::Tensor& in) {
  const auto call = describe(CollectiveCall::op::allgather, -1, in);
  // Gloo writes into the tensors it was given, which share storage with `out`.
  return checked(call, [&] {
    std::vector<std::vector<torch::Tensor>> outs{out};
    std::vector<torch::Tensor> ins{in};
    return group_->allgather(outs, ins);
  }, "allgather of " + std::to_string(in.numel()) + " values");
}

DTRAIN_INLINE Work gloo_communicator::allgather(torch::Tensor& out, const torch::Tensor& in) {
  const auto n = in.numel();
  check_flat(out, in, "allgather");
  const auto call = describe(CollectiveCall::op::allgather, -1, in);
  const std::string what = "allgather of " + std::to_string(n) + " values";
  if (shm_ && out.device().is_cpu() && in.device().is_cpu())
    return detail::shm_work(shm_->allgather(call, out, in.contiguous()), what);
  return checked(call, [&] {
    std::vector<torch::Tensor> views;
    for (int r = 0; r < size_; ++r) views.push_back(out.narrow(0, r * n, n).view(in.sizes()));
    std::vector<std::vector<torch::Tensor>> outs{views};
    std::vector<torch::Tensor> ins{in.contiguous()};
    return group_->allgather(outs, ins);
  }, what);
}

DTRAIN_INLINE Work gloo_communicator::reduce_scatter(torch::Tensor& out, torch::Tensor& in, reduce op) {
  const auto n = out.numel();
  check_flat(in, out, "reduce_scatter");
  const auto call = describe(CollectiveCall::op::reduce_scatter, static_cast<std::int64_t>(op), in);
  const std::string what = "reduce_scatter of " + std::to_string(in.numel()) + " values";
  if (shm_ && detail::shm_channel::supports(in) && out.is_contiguous() && (op == reduce::sum || op == reduce::mean))
    return detail::shm_work(shm_->reduce_scatter(call, out, in, op == reduce::mean), what);
  auto slice = in.narrow(0, rank_ * n, n);
  return checked(call, [&] { return gloo_allreduce(in, op); }, what).then([out, slice]() mutable {
    out.view({-1}).copy_(slice);
  });
}

DTRAIN_INLINE void gloo_communicator::barrier() {
  checked(describe(CollectiveCall::op::barrier, -1, torch::Tensor()), [&] { return group_->barrier(); }, "barrier")
      .wait();
}

DTRAIN_INLINE std::uint64_t gloo_communicator::hierarchical_allreduces() const {
  return hier_ ? hier_->allreduces() : 0;
}

DTRAIN_INLINE CollectiveCall gloo_communicator::describe(CollectiveCall::op operation, std::int64_t argument,
                                                         const torch::Tensor& t) {
  note_collective_issued();
  return {operation, argument, t.defined() ? t.scalar_type() : c10::ScalarType::Undefined,
          t.defined() ? t.numel() : 0, ++seq_};
}

// With the shared-memory channel the comparison runs there (one barrier, waited for here, so the
// channel and Gloo stay in one order); otherwise an allgather of the calls over Gloo, issued just
// before the collective (Gloo runs them in order on every rank) and checked when the collective is
// waited for: no extra round trip on the training thread.
DTRAIN_INLINE Work gloo_communicator::checked(const CollectiveCall& call,
                                              const std::function<c10::intrusive_ptr<c10d::Work>()>& issue,
                                              std::string what) {
  if (shm_ || hier_) {
    detail::shm_work(shm_ ? shm_->check(call) : hier_->check(call), what).wait();
    return {issue(), std::move(what)};
  }
  const auto words = call.encode();
  auto mine = torch::tensor(std::vector<std::int64_t>(words.begin(), words.end()), torch::kInt64);
  auto all = torch::empty({size_ * CollectiveCall::words}, torch::kInt64);
  std::vector<torch::Tensor> views;
  for (int r = 0; r < size_; ++r) views.push_back(all.narrow(0, r * CollectiveCall::words, CollectiveCall::words));
  std::vector<std::vector<torch::Tensor>> outs{views};
  std::vector<torch::Tensor> ins{mine};
  auto exchange = group_->allgather(outs, ins);
  const int rank = rank_, world = size_;
  return Work(issue(), std::move(what))
      .verified_by({}, [call, all, rank, world, exchange, stall = stall_check_, abandoned = abandoned_] {
        try {
          detail::wait_watching(*exchange, stall, rank, call);
          verify_same_call(rank, call, all.data_ptr<std::int64_t>(), world);
        } catch (...) {
          abandoned->store(true);
          throw;
        }
      });
}

DTRAIN_INLINE c10::intrusive_ptr<c10d::Work> gloo_communicator::gloo_allreduce(torch::Tensor& t, reduce op) {
  if (op == reduce::mean) {
    // Pre-dividing keeps the result exact for power-of-two world sizes and is free to do here.
    t.div_(size_);
    op = reduce::sum;
  }
  std::vector<torch::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = detail::to_c10d(op);
  return group_->allreduce(v, o);
}

DTRAIN_INLINE void gloo_communicator::check_flat(const torch::Tensor& whole, const torch::Tensor& piece,
                                                 const char* op) const {
  if (!whole.is_contiguous() || whole.numel() != piece.numel() * size_ || whole.scalar_type() != piece.scalar_type())
    throw Error(std::string("communicator::") + op + ": the flat tensor must be contiguous, of the piece's dtype, "
                "and hold size() * piece.numel() = " + std::to_string(size_) + " * " +
                std::to_string(piece.numel()) + " values; it holds " + std::to_string(whole.numel()));
}

// Groups the ranks by host; with several hosts and more than one rank on some, allreduces go
// through the hierarchy. Rank 0 says so on stderr, once per group.
DTRAIN_INLINE void gloo_communicator::start_hierarchy(const c10::intrusive_ptr<c10d::Store>& store,
                                                      std::chrono::milliseconds timeout) {
  auto layout = detail::host_layout::exchange(*store, rank_, size_, detail::host_identity());
  if (!layout.hierarchical()) return;
  hier_ = std::make_unique<detail::hierarchical_allreduce>(store, std::move(layout), rank_, size_,
                                                           detail::make_gloo_device, timeout);
  if (rank_ == 0)
    std::fprintf(stderr, "dtrain: hierarchical allreduce over %s: shared memory inside a host, Gloo between "
                 "the hosts' leaders (DTRAIN_HIERARCHICAL=0 turns it off)\n", hier_->layout().describe().c_str());
}

}  // namespace backend
DTRAIN_NAMESPACE_END
