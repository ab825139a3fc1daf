// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of hierarchical.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/backend/detail/hierarchical.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace detail {

DTRAIN_INLINE void wait_watching(c10d::Work& work, const std::function<void()>& stall, int rank, const CollectiveCall& call) {
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

DTRAIN_INLINE std::string host_identity() {
  if (auto id = launch::detail::env("DTRAIN_HOST_ID")) return *id;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return std::string(name) + "/" + boot;
}

DTRAIN_INLINE host_layout host_layout::exchange(c10d::Store& store, int rank, int world, const std::string& identity) {
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

DTRAIN_INLINE bool host_layout::hierarchical() const {
  return hosts.size() > 1 && std::any_of(hosts.begin(), hosts.end(), [](const auto& h) { return h.size() > 1; });
}

DTRAIN_INLINE std::string host_layout::describe() const {
  std::string s = std::to_string(hosts.size()) + " hosts (ranks ";
  for (std::size_t h = 0; h < hosts.size(); ++h)
    s += (h ? ", " : "") + std::to_string(hosts[h].front()) +
         (hosts[h].size() > 1 ? "-" + std::to_string(hosts[h].back()) : "");
  return s + ")";
}

DTRAIN_INLINE hierarchical_allreduce::hierarchical_allreduce(const c10::intrusive_ptr<c10d::Store>& store, host_layout layout, int rank, int world,
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

DTRAIN_INLINE shm_channel::pending hierarchical_allreduce::allreduce(const CollectiveCall& call, torch::Tensor t, bool mean) {
  return local_->compose(call, [this, call, t, mean]() mutable { guarded([&] { allreduce_now(call, t, mean); }); });
}

DTRAIN_INLINE shm_channel::pending hierarchical_allreduce::check(const CollectiveCall& call) {
  return local_->compose(call, [this, call] { guarded([&] { check_now(call); }); });
}

DTRAIN_INLINE void hierarchical_allreduce::allreduce_now(const CollectiveCall& call, torch::Tensor& t, bool mean) {
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

DTRAIN_INLINE void hierarchical_allreduce::check_now(const CollectiveCall& call) {
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

DTRAIN_INLINE hierarchical_allreduce::leader_calls hierarchical_allreduce::exchange(const CollectiveCall& call) {
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

DTRAIN_INLINE std::optional<int> hierarchical_allreduce::first_other(leader_calls& calls, const CollectiveCall& call) {
  if (!calls.verified) wait_watching(*calls.work, stall_, rank_, call);
  calls.verified = true;
  for (int g = 0; g < static_cast<int>(layout_.hosts.size()); ++g)
    if (!(CollectiveCall::decode(calls.all[g].data_ptr<std::int64_t>()) == call)) return g;
  return std::nullopt;
}

DTRAIN_INLINE void hierarchical_allreduce::leaders_broadcast(torch::Tensor& t, int root, leader_calls& calls, const CollectiveCall& call) {
  std::vector<torch::Tensor> v{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  auto work = leaders_->broadcast(v, o);
  if (!calls.verified)
    if (const auto other = first_other(calls, call))
      mismatch(call, layout_.hosts[*other].front(), CollectiveCall::decode(calls.all[*other].data_ptr<std::int64_t>()));
  wait_watching(*work, stall_, rank_, call);
}

DTRAIN_INLINE void hierarchical_allreduce::mismatch(const CollectiveCall& mine, int other, const CollectiveCall& theirs) {
std::vector<std::int64_t> all(static_cast<std::size_t>(world_) * CollectiveCall::words);
for (int r = 0; r < world_; ++r) {
const auto w = (r == other ? theirs : mine).encode();
std::copy(w.begin(), w.end(), all.begin() + r * CollectiveCall::words);
}
verify_same_call(rank_, mine, all.data(), world_);  // throws: theirs differs
throw CollectiveMismatch("collectives do not match: rank " + std::to_string(rank_) + " and rank " + std::to_string(other));
}

DTRAIN_INLINE void hierarchical_allreduce::scale(torch::Tensor& t) const {
  if (t.scalar_type() == torch::kFloat) t.mul_(static_cast<double>(1.0f / static_cast<float>(world_)));
  else t.mul_(1.0 / static_cast<double>(world_));
}
}  // namespace detail
DTRAIN_NAMESPACE_END
