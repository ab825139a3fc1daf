// SPDX-License-Identifier: Apache-2.0
#pragma once
// backend::gloo: collectives over c10d's ProcessGroupGloo (CPU tensors, TCP).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#if !defined(USE_C10D_GLOO)
#error "dtrain::backend::gloo needs LibTorch's Gloo process group: link the CMake target dtrain::dtrain (or torch), which defines USE_C10D_GLOO and USE_DISTRIBUTED, or pass -DUSE_C10D_GLOO -DUSE_DISTRIBUTED yourself"
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/types.h>

#include <dtrain/backend/detail/gloo_peers.hpp>
#include <dtrain/backend/detail/hierarchical.hpp>
#include <dtrain/collective.hpp>
#include <dtrain/detail/shm_allreduce.hpp>
#include <dtrain/error.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/policy/category.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace backend {

/// c10d's ProcessGroupGloo: CPU tensors over TCP, one process per rank.
///
/// The transport binds to GLOO_SOCKET_IFNAME when set, to 127.0.0.1 when MASTER_ADDR is a loopback
/// address (every rank on this machine), and otherwise to the address this host's name resolves to.
/// Its listening sockets take connections from the other ranks' hosts only (a socket filter;
/// backend/detail/gloo_peers.hpp): a stranger who finds a port cannot take a pair.
/// DTRAIN_SHARED_MEMORY=0 keeps every collective on Gloo even when all ranks share one host (the
/// sums then add up in Gloo's ring order).
///
/// When the ranks span several hosts and some host has more than one rank, float and double sum
/// and mean allreduces are hierarchical (backend/detail/hierarchical.hpp): shared memory inside a
/// host, Gloo between one leader per host, summed in rank order (bitwise the one-host channel's
/// result). Ranks are grouped by host name and boot id, or by DTRAIN_HOST_ID when set;
/// DTRAIN_HIERARCHICAL=0 (or DTRAIN_SHARED_MEMORY=0) keeps every collective on the flat Gloo group.
/// `Threads` is the number of Gloo's own worker threads, which run collectives while the training
/// thread goes on (two: one bucket's allreduce can overlap the next one's).
template <int Threads = 2>
struct gloo_with_threads {
  using category = dtrain::category::backend;
  static constexpr bool uses_cuda = false;
  static constexpr const char* name = "gloo";

  static torch::Device device(int /*local_rank*/) { return torch::kCPU; }

  class communicator {
   public:
    /// Joins the group of `who.world_size` ranks through `store`. When every rank is on this
    /// host, float allreduces and broadcasts go through shared memory instead of TCP loopback.
    communicator(const c10::intrusive_ptr<c10d::Store>& store, const launch::WorkerIdentity& who,
                 std::chrono::milliseconds timeout)
        : rank_(who.rank), size_(who.world_size) {
      group_ = detail::guarded_gloo_group(store, "gloo", rank_, size_, timeout, Threads, make_device);
      if (size_ > 1 && who.local_world_size == size_ && launch::detail::env("DTRAIN_SHARED_MEMORY") != "0")
        shm_ = std::make_unique<detail::shm_channel>(*store, "shm", rank_, size_, timeout);
      else if (size_ > 1 && launch::detail::env("DTRAIN_HIERARCHICAL") != "0" &&
               launch::detail::env("DTRAIN_SHARED_MEMORY") != "0")
        start_hierarchy(store, timeout);
    }

    /// `check` runs about once a second while a collective waits for a peer, and may throw to end
    /// the wait early (used by the worker context to notice a peer that failed or left the loop).
    void on_stall(std::function<void()> check) {
      stall_check_ = check;
      if (shm_) shm_->on_stall(check);
      if (hier_) hier_->on_stall(std::move(check));
    }

    communicator(const communicator&) = delete;
    communicator& operator=(const communicator&) = delete;
    ~communicator() {
      // A collective given up on (a silent peer, mismatched calls) may still block one of Gloo's
      // threads until the collective timeout, and destroying the process group would wait for it:
      // leave it to the process's exit, so the error is reported at once.
      if (abandoned_->load()) (void)group_.release();
    }

    int rank() const { return rank_; }
    int size() const { return size_; }

    /// Reduces `t` in place across ranks. mean divides the sum by size() once it is done, so
    /// callers that wait() see the mean; gloo itself has no mean.
    /// `where`: see dtrain::runs (only the shared-memory channel has a thread to run it on).
    Work allreduce(torch::Tensor& t, reduce op = reduce::sum, runs where = runs::background) {
      const auto call = describe(CollectiveCall::op::allreduce, static_cast<std::int64_t>(op), t);
      const std::string what = "allreduce of " + std::to_string(t.numel()) + " values";
      if (shm_ && detail::shm_channel::supports(t) && (op == reduce::sum || op == reduce::mean))
        return shm_work(shm_->allreduce(call, t, op == reduce::mean, where == runs::background), what);
      if (hier_ && detail::shm_channel::supports(t) && (op == reduce::sum || op == reduce::mean))
        return shm_work(hier_->allreduce(call, t, op == reduce::mean), what);
      return checked(call, [&] { return gloo_allreduce(t, op); }, what);
    }

    /// Copies root's `t` into every rank's `t`.
    Work broadcast(torch::Tensor& t, int root = 0, runs where = runs::background) {
      const auto call = describe(CollectiveCall::op::broadcast, root, t);
      const std::string what = "broadcast from rank " + std::to_string(root);
      if (shm_ && t.device().is_cpu() && t.is_contiguous())
        return shm_work(shm_->broadcast(call, t, root, where == runs::background), what);
      return checked(call, [&] {
        std::vector<torch::Tensor> v{t};
        c10d::BroadcastOptions o;
        o.rootRank = root;
        return group_->broadcast(v, o);
      }, what);
    }

    /// out[r] receives rank r's `in`; out must hold size() tensors shaped like `in`.
    Work allgather(std::vector<torch::Tensor>& out, const torch::Tensor& in) {
      const auto call = describe(CollectiveCall::op::allgather, -1, in);
      // Gloo writes into the tensors it was given, which share storage with `out`.
      return checked(call, [&] {
        std::vector<std::vector<torch::Tensor>> outs{out};
        std::vector<torch::Tensor> ins{in};
        return group_->allgather(outs, ins);
      }, "allgather of " + std::to_string(in.numel()) + " values");
    }

    /// Flat allgather: rank r's `in` lands in out[r*n, (r+1)*n), n = in.numel(); `out` is
    /// contiguous and holds size()*n values. strategy::fsdp<> gathers its flat shards with it.
    ///
    /// With the shared-memory channel (every rank on this host, CPU tensors) each rank copies its
    /// piece into the shared segment and every piece out. Otherwise Gloo's allgather writes into
    /// views of `out`.
    Work allgather(torch::Tensor& out, const torch::Tensor& in) {
      const auto n = in.numel();
      check_flat(out, in, "allgather");
      const auto call = describe(CollectiveCall::op::allgather, -1, in);
      const std::string what = "allgather of " + std::to_string(n) + " values";
      if (shm_ && out.device().is_cpu() && in.device().is_cpu())
        return shm_work(shm_->allgather(call, out, in.contiguous()), what);
      return checked(call, [&] {
        std::vector<torch::Tensor> views;
        for (int r = 0; r < size_; ++r) views.push_back(out.narrow(0, r * n, n).view(in.sizes()));
        std::vector<std::vector<torch::Tensor>> outs{views};
        std::vector<torch::Tensor> ins{in.contiguous()};
        return group_->allgather(outs, ins);
      }, what);
    }

    /// Reduce-scatter: `in` holds size()*n values; `out` (n values) receives the reduction over
    /// ranks of in[rank*n, (rank+1)*n). `in` is used as scratch: its content afterwards is
    /// unspecified.
    ///
    /// When every rank is on this host (float or double, sum or mean) it runs through shared
    /// memory: each rank copies all of `in` into the segment once, reduces only its slice and
    /// writes only that out. Otherwise, as Gloo has no reduce-scatter, it is an allreduce of all
    /// of `in` followed by a copy of this rank's slice: about 2(N-1)/N of `in`'s bytes per rank
    /// where a ring reduce-scatter moves (N-1)/N, twice the traffic, and every rank reduces every
    /// slice. The memory is the same either way: `in` exists anyway.
    Work reduce_scatter(torch::Tensor& out, torch::Tensor& in, reduce op = reduce::sum) {
      const auto n = out.numel();
      check_flat(in, out, "reduce_scatter");
      const auto call = describe(CollectiveCall::op::reduce_scatter, static_cast<std::int64_t>(op), in);
      const std::string what = "reduce_scatter of " + std::to_string(in.numel()) + " values";
      if (shm_ && detail::shm_channel::supports(in) && out.is_contiguous() && (op == reduce::sum || op == reduce::mean))
        return shm_work(shm_->reduce_scatter(call, out, in, op == reduce::mean), what);
      auto slice = in.narrow(0, rank_ * n, n);
      return checked(call, [&] { return gloo_allreduce(in, op); }, what).then([out, slice]() mutable {
        out.view({-1}).copy_(slice);
      });
    }

    void barrier() {
      checked(describe(CollectiveCall::op::barrier, -1, torch::Tensor()), [&] { return group_->barrier(); }, "barrier")
          .wait();
    }

    /// Collectives this communicator has issued (the last one's CollectiveCall::seq).
    std::uint64_t collectives() const { return seq_; }
    /// Allreduces completed through the hierarchy (shared memory inside a host, Gloo between
    /// hosts' leaders); 0 when the group does not use it.
    std::uint64_t hierarchical_allreduces() const { return hier_ ? hier_->allreduces() : 0; }

   private:
    static Work shm_work(detail::shm_channel::pending p, std::string what) {
      return Work(std::move(p.done), std::move(p.help), std::move(what));
    }

    CollectiveCall describe(CollectiveCall::op operation, std::int64_t argument, const torch::Tensor& t) {
      note_collective_issued();
      return {operation, argument, t.defined() ? t.scalar_type() : c10::ScalarType::Undefined,
              t.defined() ? t.numel() : 0, ++seq_};
    }

    // A collective over Gloo, preceded by the comparison of every rank's call. With the
    // shared-memory channel the comparison runs there (one barrier, waited for here, so the
    // channel and Gloo stay in one order); otherwise an allgather of the calls over Gloo, issued
    // just before the collective (Gloo runs them in order on every rank) and checked when the
    // collective is waited for: no extra round trip on the training thread.
    template <class Issue>
    Work checked(const CollectiveCall& call, Issue&& issue, std::string what) {
      if (shm_ || hier_) {
        shm_work(shm_ ? shm_->check(call) : hier_->check(call), what).wait();
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

    c10::intrusive_ptr<c10d::Work> gloo_allreduce(torch::Tensor& t, reduce op) {
      if (op == reduce::mean) {
        // Pre-dividing keeps the result exact for power-of-two world sizes and is free to do here.
        t.div_(size_);
        op = reduce::sum;
      }
      std::vector<torch::Tensor> v{t};
      c10d::AllreduceOptions o;
      o.reduceOp = to_c10d(op);
      return group_->allreduce(v, o);
    }

    // `whole` must be the contiguous concatenation of size() pieces shaped like `piece`.
    void check_flat(const torch::Tensor& whole, const torch::Tensor& piece, const char* op) const {
      if (!whole.is_contiguous() || whole.numel() != piece.numel() * size_ || whole.scalar_type() != piece.scalar_type())
        throw Error(std::string("communicator::") + op + ": the flat tensor must be contiguous, of the piece's dtype, "
                    "and hold size() * piece.numel() = " + std::to_string(size_) + " * " +
                    std::to_string(piece.numel()) + " values; it holds " + std::to_string(whole.numel()));
    }

    static c10d::ReduceOp to_c10d(reduce op) {
      switch (op) {
        case reduce::max: return c10d::ReduceOp::MAX;
        case reduce::min: return c10d::ReduceOp::MIN;
        default: return c10d::ReduceOp::SUM;
      }
    }

    // Groups the ranks by host; with several hosts and more than one rank on some, allreduces go
    // through the hierarchy. Rank 0 says so on stderr, once per group.
    void start_hierarchy(const c10::intrusive_ptr<c10d::Store>& store, std::chrono::milliseconds timeout) {
      auto layout = detail::host_layout::exchange(*store, rank_, size_, detail::host_identity());
      if (!layout.hierarchical()) return;
      hier_ = std::make_unique<detail::hierarchical_allreduce>(store, std::move(layout), rank_, size_, make_device, timeout);
      if (rank_ == 0)
        std::fprintf(stderr, "dtrain: hierarchical allreduce over %s: shared memory inside a host, Gloo between "
                     "the hosts' leaders (DTRAIN_HIERARCHICAL=0 turns it off)\n", hier_->layout().describe().c_str());
    }

    static std::shared_ptr<::gloo::transport::Device> make_device() {
      if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
        return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
      const char* addr = std::getenv("MASTER_ADDR");
      const std::string a = addr ? addr : "127.0.0.1";
      if (a == "localhost" || a.rfind("127.", 0) == 0 || a == "::1")
        return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
      return c10d::ProcessGroupGloo::createDefaultDevice();
    }

    int rank_, size_;
    std::uint64_t seq_ = 0;
    std::function<void()> stall_check_;
    std::shared_ptr<std::atomic<bool>> abandoned_ = std::make_shared<std::atomic<bool>>(false);
    c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
    std::unique_ptr<detail::shm_channel> shm_;
    std::unique_ptr<detail::hierarchical_allreduce> hier_;
  };
};

/// Gloo with its default of two worker threads.
using gloo = gloo_with_threads<2>;

}  // namespace backend

DTRAIN_NAMESPACE_END
