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
inline void wait_watching(c10d::Work& work, const std::function<void()>& stall, int rank, const CollectiveCall& call) {
  for (;;) {
    try {
      if (work.wait(std::chrono::milliseconds(1000))) return;
    } catch (const std::exception&) {
      if (work.isCompleted()) throw;  // failed, not merely not done yet
    }
    if (!stall) continue;
    try {
      stall();
    } catch (const std::exception& e) {
      throw WorkerError(std::string(e.what()) + " [rank " + std::to_string(rank) + " was in " + call.describe() + "]");
    }
  }
}

/// This process's host, as the hierarchical allreduce groups ranks: DTRAIN_HOST_ID when set (ranks
/// with the same value must share /dev/shm), else the host name with the kernel's boot id, so two
/// machines that share a name are still two hosts.
inline std::string host_identity() {
  if (auto id = launch::detail::env("DTRAIN_HOST_ID")) return *id;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return std::string(name) + "/" + boot;
}

/// Which ranks share a host, from every rank's host_identity() exchanged through the store.
struct host_layout {
  std::vector<std::vector<int>> hosts;  // each host's ranks, ascending; hosts ordered by their lowest rank
  int host = 0;                         // this rank's host
  int local_rank = 0;                   // its place on its host (0: the host's leader)

  static host_layout exchange(c10d::Store& store, int rank, int world, const std::string& identity) {
    store.set("host/" + std::to_string(rank), std::vector<std::uint8_t>(identity.begin(), identity.end()));
    host_layout l;
    std::map<std::string, int> index;
    for (int r = 0; r < world; ++r) {
      const auto v = store.get("host/" + std::to_string(r));  // waits for rank r
      const auto [it, added] = index.emplace(std::string(v.begin(), v.end()), static_cast<int>(l.hosts.size()));
      if (added) l.hosts.emplace_back();
      l.hosts[it->second].push_back(r);
      if (r == rank) l.host = it->second, l.local_rank = static_cast<int>(l.hosts[it->second].size()) - 1;
    }
    return l;
  }
  /// Worth a hierarchy: several hosts, and some host with more than one rank.
  bool hierarchical() const {
    return hosts.size() > 1 && std::any_of(hosts.begin(), hosts.end(), [](const auto& h) { return h.size() > 1; });
  }
  /// E.g. "2 hosts (ranks 0-1, 2-3)".
  std::string describe() const {
    std::string s = std::to_string(hosts.size()) + " hosts (ranks ";
    for (std::size_t h = 0; h < hosts.size(); ++h)
      s += (h ? ", " : "") + std::to_string(hosts[h].front()) +
           (hosts[h].size() > 1 ? "-" + std::to_string(hosts[h].back()) : "");
    return s + ")";
  }
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
                         std::chrono::milliseconds timeout)
      : layout_(std::move(layout)), rank_(rank), world_(world) {
    const int here = layout_.host;
    try {
      local_ = std::make_unique<shm_channel>(*store, "hier/shm/" + std::to_string(here), layout_.local_rank,
                                             static_cast<int>(layout_.hosts[here].size()), timeout);
      local_->name_ranks(layout_.hosts[here]);
    } catch (const WorkerError& e) {
      throw WorkerError(std::string(e.what()) + " [the hierarchical allreduce took ranks with the same host name "
                        "and boot id for one host: set DTRAIN_HOST_ID to tell hosts apart, or "
                        "DTRAIN_HIERARCHICAL=0 to keep every collective on Gloo]");
    }
    if (leader())  // two threads: the calls' exchange runs beside the data
      leaders_ = guarded_gloo_group(store, "hier/leaders", here, static_cast<int>(layout_.hosts.size()), timeout, 2, make_device);
  }
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
  shm_channel::pending allreduce(const CollectiveCall& call, torch::Tensor t, bool mean) {
    return local_->compose(call, [this, call, t, mean]() mutable { guarded([&] { allreduce_now(call, t, mean); }); });
  }
  /// Only the check of every rank's call, for a collective that then runs over the flat Gloo group.
  shm_channel::pending check(const CollectiveCall& call) {
    return local_->compose(call, [this, call] { guarded([&] { check_now(call); }); });
  }

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

  void allreduce_now(const CollectiveCall& call, torch::Tensor& t, bool mean) {
    const int h = layout_.host, last = last_host();
    std::optional<leader_calls> calls;
    torch::Tensor scratch;
    auto receive = [&](int root) {
      if (!scratch.defined()) scratch = torch::empty_like(t);
      leaders_broadcast(scratch, root, *calls, call);
    };
    if (leader()) {
      calls = exchange(call);
      // The chain up to this host (every leader takes part in every leader's broadcast; host h-1's
      // holds the sum of hosts 0..h-1, added before this host's ranks).
      for (int k = 0; k < h; ++k) receive(k);
      if (h > 0) t.add_(scratch);
    }
    if (shares_host()) local_->allreduce_step(t, false);
    if (h == last) {
      if (mean) scale(t);
      if (leader()) leaders_broadcast(t, last, *calls, call);
    } else {
      if (leader()) {
        leaders_broadcast(t, h, *calls, call);
        for (int k = h + 1; k < last; ++k) receive(k);
        leaders_broadcast(t, last, *calls, call);  // the result
      }
      if (shares_host()) local_->broadcast_step(t, 0);
    }
    allreduces_->fetch_add(1);
  }

  // The leader compares the leaders' calls; its host's ranks learn the outcome from it.
  void check_now(const CollectiveCall& call) {
    auto status = torch::zeros({2 + CollectiveCall::words}, torch::kInt64);  // mismatch?, rank, call
    if (leader()) {
      auto calls = exchange(call);
      if (const auto other = first_other(calls, call)) {
        const auto words = CollectiveCall::decode(calls.all[*other].data_ptr<std::int64_t>()).encode();
        status[0] = 1;
        status[1] = layout_.hosts[*other].front();
        for (int i = 0; i < CollectiveCall::words; ++i) status[2 + i] = words[i];
      }
    }
    if (shares_host()) local_->broadcast_step(status, 0);
    const auto* s = status.data_ptr<std::int64_t>();
    if (s[0]) mismatch(call, static_cast<int>(s[1]), CollectiveCall::decode(s + 2));
  }

  // Issues the allgather of the leaders' calls; verified at the leader's first wait.
  leader_calls exchange(const CollectiveCall& call) {
    const auto words = call.encode();
    const int hosts = static_cast<int>(layout_.hosts.size());
    leader_calls c;
    c.all = torch::empty({hosts, CollectiveCall::words}, torch::kInt64);
    std::vector<torch::Tensor> views;
    for (int g = 0; g < hosts; ++g) views.push_back(c.all[g]);
    std::vector<std::vector<torch::Tensor>> outs{views};
    std::vector<torch::Tensor> ins{torch::tensor(std::vector<std::int64_t>(words.begin(), words.end()), torch::kInt64)};
    c.work = leaders_->allgather(outs, ins);
    return c;
  }

  std::optional<int> first_other(leader_calls& calls, const CollectiveCall& call) {
    if (!calls.verified) wait_watching(*calls.work, stall_, rank_, call);
    calls.verified = true;
    for (int g = 0; g < static_cast<int>(layout_.hosts.size()); ++g)
      if (!(CollectiveCall::decode(calls.all[g].data_ptr<std::int64_t>()) == call)) return g;
    return std::nullopt;
  }

  // A broadcast over the leaders, issued before the leaders' calls are verified (the data is on
  // its way meanwhile) and waited for after.
  void leaders_broadcast(torch::Tensor& t, int root, leader_calls& calls, const CollectiveCall& call) {
    std::vector<torch::Tensor> v{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    auto work = leaders_->broadcast(v, o);
    if (!calls.verified)
      if (const auto other = first_other(calls, call))
        mismatch(call, layout_.hosts[*other].front(), CollectiveCall::decode(calls.all[*other].data_ptr<std::int64_t>()));
    wait_watching(*work, stall_, rank_, call);
  }

  // CollectiveMismatch naming this rank's call and `other`'s, worded as every backend words it.
  [[noreturn]] void mismatch(const CollectiveCall& mine, int other, const CollectiveCall& theirs) {
    std::vector<std::int64_t> all(static_cast<std::size_t>(world_) * CollectiveCall::words);
    for (int r = 0; r < world_; ++r) {
      const auto w = (r == other ? theirs : mine).encode();
      std::copy(w.begin(), w.end(), all.begin() + r * CollectiveCall::words);
    }
    verify_same_call(rank_, mine, all.data(), world_);  // throws: theirs differs
    throw CollectiveMismatch("collectives do not match: rank " + std::to_string(rank_) + " and rank " + std::to_string(other));
  }

  // t *= 1 / world, the factor rounded to t's dtype first, as the one-host channel scales a mean.
  void scale(torch::Tensor& t) const {
    if (t.scalar_type() == torch::kFloat) t.mul_(static_cast<double>(1.0f / static_cast<float>(world_)));
    else t.mul_(1.0 / static_cast<double>(world_));
  }

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
