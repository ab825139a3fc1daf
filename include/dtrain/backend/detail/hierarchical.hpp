// SPDX-License-Identifier: Apache-2.0
#pragma once
// backend::gloo's hierarchical allreduce, for a group whose ranks span several hosts with more than
// one rank on a host: shared memory among a host's ranks, Gloo's TCP only between one leader per
// host. A flat Gloo allreduce of 2 hosts x 2 ranks takes 2 x 3 ring steps over TCP, each a round of
// the network's latency; this takes two TCP hops (the partial sum there, the result back).

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/types.h>

#include <dtrain/backend/detail/gloo_peers.hpp>
#include <dtrain/collective.hpp>
#include <dtrain/detail/shm_allreduce.hpp>
#include <dtrain/error.hpp>
#include <dtrain/launch/environment.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {

/// Waits for a Gloo collective, running `stall` about once a second meanwhile (the context's check
/// for failed, departed or silent peers), so a peer that stopped is named within the heartbeat
/// timeout, not at the collective timeout.
void wait_watching(c10d::Work& work, const std::function<void()>& stall, int rank, const CollectiveCall& call);

/// This process's host, as the hierarchical allreduce groups ranks: DTRAIN_HOST_ID when set (ranks
/// with the same value must share /dev/shm), else the host name with the kernel's boot id, so two
/// machines that share a name are still two hosts.
std::string host_identity();

/// Which ranks share a host, from every rank's host_identity() exchanged through the store.
struct host_layout {
  std::vector<std::vector<int>> hosts;  // each host's ranks, ascending; hosts ordered by their lowest rank
  int host = 0;                         // this rank's host
  int local_rank = 0;                   // its place on its host (0: the host's leader)

  static host_layout exchange(c10d::Store& store, int rank, int world, const std::string& identity);
  /// Worth a hierarchy: several hosts, and some host with more than one rank.
  bool hierarchical() const;
  /// E.g. "2 hosts (ranks 0-1, 2-3)".
  std::string describe() const;
};

/// The allreduce (sum or mean of float or double) over hosts: the shared-memory sum of each host's
/// ranks, passed along the hosts' leaders (host h adds its ranks to the sum of hosts 0..h-1), so
/// every element adds up in rank order when each host's ranks are consecutive (as under torchrun,
/// Slurm's block distribution and mpirun's by-slot mapping): bitwise the one-host shared-memory
/// channel's result. The last host scales a mean and its leader broadcasts the result to the
/// other leaders, which copy it to their hosts' ranks.
///
/// Every collective of the communicator passes through here in order (the others only for the
/// check): each rank's call is compared with its host's ranks' (the shared-memory barrier) and the
/// leaders exchange theirs (an allgather over the leaders, the first thing a leader does in every
/// collective, so a leader in another collective is found, not waited for).
class hierarchical_allreduce {
 public:
  hierarchical_allreduce(const c10::intrusive_ptr<c10d::Store>& store, host_layout layout, int rank, int world,
                         const std::function<std::shared_ptr<::gloo::transport::Device>()>& make_device,
                         std::chrono::milliseconds timeout);
  hierarchical_allreduce(const hierarchical_allreduce&) = delete;
  hierarchical_allreduce& operator=(const hierarchical_allreduce&) = delete;
  ~hierarchical_allreduce() {
    local_.reset();  // its thread runs the queued collectives, which use the leaders' group
    if (abandoned_->load()) (void)leaders_.release();  // may block in a collective given up on
  }

  void on_stall(std::function<void()> check) {
    stall_ = check;
    local_->on_stall(std::move(check));
  }
  const host_layout& layout() const { return layout_; }
  /// Allreduces this rank has completed through the hierarchy.
  std::uint64_t allreduces() const { return allreduces_->load(); }

  /// Sums `t` (contiguous float or double, CPU) over all ranks in place, divided by the world
  /// size if `mean`.
  shm_channel::pending allreduce(const CollectiveCall& call, torch::Tensor t, bool mean);
  /// Only the check of every rank's call, for a collective that then runs over the flat Gloo group.
  shm_channel::pending check(const CollectiveCall& call);

 private:
  struct leader_calls {
    c10::intrusive_ptr<c10d::Work> work;
    torch::Tensor all;  // hosts x CollectiveCall::words
    bool verified = false;
  };

  bool leader() const { return layout_.local_rank == 0; }
  bool shares_host() const { return layout_.hosts[layout_.host].size() > 1; }
  int last_host() const { return static_cast<int>(layout_.hosts.size()) - 1; }

  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {
      abandoned_->store(true);
      throw;
    }
  }

  void allreduce_now(const CollectiveCall& call, torch::Tensor& t, bool mean);

  // The leader compares the leaders' calls; its host's ranks learn the outcome from it.
  void check_now(const CollectiveCall& call);

  // Issues the allgather of the leaders' calls; verified at the leader's first wait.
  leader_calls exchange(const CollectiveCall& call);

  std::optional<int> first_other(leader_calls& calls, const CollectiveCall& call);

  // A broadcast over the leaders, issued before the leaders' calls are verified (the data is on
  // its way meanwhile) and waited for after.
  void leaders_broadcast(torch::Tensor& t, int root, leader_calls& calls, const CollectiveCall& call);

  // CollectiveMismatch naming this rank's call and `other`'s, worded as every backend words it.
  [[noreturn]] void mismatch(const CollectiveCall& mine, int other, const CollectiveCall& theirs);

  // t *= 1 / world, the factor rounded to t's dtype first, as the one-host channel scales a mean.
  void scale(torch::Tensor& t) const;

  host_layout layout_;
  int rank_, world_;
  std::function<void()> stall_;
  std::shared_ptr<std::atomic<bool>> abandoned_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::atomic<std::uint64_t>> allreduces_ = std::make_shared<std::atomic<std::uint64_t>>(0);
  c10::intrusive_ptr<c10d::ProcessGroupGloo> leaders_;  // on leaders only
  std::unique_ptr<shm_channel> local_;                   // this host's ranks
};

}  // namespace detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/backend/detail/impl/hierarchical.ipp>
#endif
