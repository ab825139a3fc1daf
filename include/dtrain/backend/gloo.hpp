// SPDX-License-Identifier: Apache-2.0
#pragma once
// backend::gloo: collectives over c10d's ProcessGroupGloo (CPU tensors, TCP).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#if !defined(USE_C10D_GLOO)
#error "dtrain::backend::gloo needs LibTorch's Gloo process group: link the CMake target dtrain::dtrain (or torch), which defines USE_C10D_GLOO and USE_DISTRIBUTED, or pass -DUSE_C10D_GLOO -DUSE_DISTRIBUTED yourself"
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/types.h>

#include <dtrain/collective.hpp>
#include <dtrain/error.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/policy/category.hpp>

namespace c10d {
class ProcessGroupGloo;  // the communicator's ProcessGroupGloo.hpp is its bodies' (impl/gloo.ipp)
}

DTRAIN_NAMESPACE_BEGIN

namespace detail {
class shm_channel;
class hierarchical_allreduce;
}  // namespace detail

namespace backend {

/// The communicator of backend::gloo_with_threads<Threads> (below): c10d's ProcessGroupGloo
/// with `threads` worker threads of Gloo's own, and the shared-memory channel or the hierarchy.
class gloo_communicator {
 public:
  /// Joins the group of `who.world_size` ranks through `store`. When every rank is on this
  /// host, float allreduces and broadcasts go through shared memory instead of TCP loopback.
  gloo_communicator(const c10::intrusive_ptr<c10d::Store>& store, const launch::WorkerIdentity& who,
                    std::chrono::milliseconds timeout, int threads);

  /// `check` runs about once a second while a collective waits for a peer, and may throw to end
  /// the wait early (used by the worker context to notice a peer that failed or left the loop).
  void on_stall(std::function<void()> check);

  gloo_communicator(const gloo_communicator&) = delete;
  gloo_communicator& operator=(const gloo_communicator&) = delete;
  ~gloo_communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }

  /// Reduces `t` in place across ranks. mean divides the sum by size() once it is done, so
  /// callers that wait() see the mean; gloo itself has no mean.
  /// `where`: see dtrain::runs (only the shared-memory channel has a thread to run it on).
  Work allreduce(torch::Tensor& t, reduce op = reduce::sum, runs where = runs::background);

  /// Copies root's `t` into every rank's `t`.
  Work broadcast(torch::Tensor& t, int root = 0, runs where = runs::background);

  /// out[r] receives rank r's `in`; out must hold size() tensors shaped like `in`.
  Work allgather(std::vector<torch::Tensor>& out, const torch::Tensor& in);

  /// Flat allgather: rank r's `in` lands in out[r*n, (r+1)*n), n = in.numel(); `out` is
  /// contiguous and holds size()*n values. strategy::fsdp<> gathers its flat shards with it.
  ///
  /// With the shared-memory channel (every rank on this host, CPU tensors) each rank copies its
  /// piece into the shared segment and every piece out. Otherwise Gloo's allgather writes into
  /// views of `out`.
  Work allgather(torch::Tensor& out, const torch::Tensor& in);

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
  Work reduce_scatter(torch::Tensor& out, torch::Tensor& in, reduce op = reduce::sum);

  void barrier();

  /// Collectives this communicator has issued (the last one's CollectiveCall::seq).
  std::uint64_t collectives() const { return seq_; }
  /// Allreduces completed through the hierarchy (shared memory inside a host, Gloo between
  /// hosts' leaders); 0 when the group does not use it.
  std::uint64_t hierarchical_allreduces() const;

 private:
  CollectiveCall describe(CollectiveCall::op operation, std::int64_t argument, const torch::Tensor& t);
  // A collective over Gloo (`issue` starts it), preceded by the comparison of every rank's call.
  Work checked(const CollectiveCall& call, const std::function<c10::intrusive_ptr<c10d::Work>()>& issue,
               std::string what);
  c10::intrusive_ptr<c10d::Work> gloo_allreduce(torch::Tensor& t, reduce op);
  // `whole` must be the contiguous concatenation of size() pieces shaped like `piece`.
  void check_flat(const torch::Tensor& whole, const torch::Tensor& piece, const char* op) const;
  void start_hierarchy(const c10::intrusive_ptr<c10d::Store>& store, std::chrono::milliseconds timeout);

  int rank_, size_;
  std::uint64_t seq_ = 0;
  std::function<void()> stall_check_;
  std::shared_ptr<std::atomic<bool>> abandoned_ = std::make_shared<std::atomic<bool>>(false);
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  std::unique_ptr<detail::shm_channel> shm_;
  std::unique_ptr<detail::hierarchical_allreduce> hier_;
};

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

  /// A gloo_communicator with `Threads` of Gloo's worker threads.
  class communicator : public gloo_communicator {
   public:
    communicator(const c10::intrusive_ptr<c10d::Store>& store, const launch::WorkerIdentity& who,
                 std::chrono::milliseconds timeout)
        : gloo_communicator(store, who, timeout, Threads) {}
  };
};

/// Gloo with its default of two worker threads.
using gloo = gloo_with_threads<2>;

}  // namespace backend

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/backend/impl/gloo.ipp>
#endif
