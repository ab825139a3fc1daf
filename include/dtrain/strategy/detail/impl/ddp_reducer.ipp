// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of ddp_reducer.hpp (docs/packaging.md: header-only or compiled once).

#include <algorithm>
#include <chrono>

#include <dtrain/strategy/assignment.hpp>
#include <dtrain/strategy/detail/ddp_reducer.hpp>
#include <dtrain/strategy/detail/row_sparse.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace strategy::detail {

struct ddp_reducer::impl {
  struct bucket {
    torch::Tensor flat;                 // the bucket's gradients, back to back
    std::vector<std::size_t> params;    // indices into impl::params
    std::vector<std::int64_t> offsets;  // where each one starts in `flat`
    int pending = 0;                    // gradients not yet copied in this backward
    Work work;
  };

  impl(Collectives c, std::int64_t first, std::int64_t cap) : comm(c), first_bucket_bytes(first), bucket_bytes_cap(cap) {}
  Collectives comm;
  std::int64_t first_bucket_bytes, bucket_bytes_cap;
  std::weak_ptr<impl> self;
  std::vector<torch::Tensor> params;      // dense: in the buckets
  std::vector<torch::Tensor> row_sparse;  // hooked after `params`, reduced row by row
  gradient_hooks<impl> hooks;
  std::vector<std::size_t> bucket_of, slot_in_bucket;
  std::vector<bool> ready;
  std::vector<bucket> buckets;
  dtrain::detail::buffer_sync buffers;
  std::size_t next_launch = 0;
  bool sync = true;
  int grads_pending = 0;
  DdpStats stats;

  void setup(torch::nn::Module& module) {
    row_sparse = row_sparse_parameters(module);
    auto is_row_sparse = [&](const torch::Tensor& p) {
      for (const auto& r : row_sparse)
        if (r.is_same(p)) return true;
      return false;
    };
    for (auto& p : module.parameters())
      if (p.requires_grad() && !is_row_sparse(p)) params.push_back(p);
    broadcast_state(module, comm);
    if (comm.size() == 1) return;  // nothing to synchronise
    buffers = dtrain::detail::buffer_sync(module);
    build_buckets();
    auto hooked = params;
    hooked.insert(hooked.end(), row_sparse.begin(), row_sparse.end());
    hooks.install(self, hooked);
  }

  // Points .grad of parameter k at its slot; the deleter keeps the bucket's memory alive for as
  // long as the gradient tensor is, even past this state.
  void alias_grad(std::size_t k) {
    auto& b = buckets[bucket_of[k]];
    auto& p = params[k];
    p.mutable_grad() = torch::from_blob(slot_ptr(k), p.sizes(), [keep = b.flat](void*) {}, b.flat.options());
  }
  void* slot_ptr(std::size_t k) {
    auto& b = buckets[bucket_of[k]];
    return static_cast<char*>(b.flat.data_ptr()) + b.offsets[slot_in_bucket[k]] * b.flat.element_size();
  }
  bool aliased(std::size_t k) {
    const auto& g = params[k].grad();
    return g.defined() && g.data_ptr() == slot_ptr(k);
  }

  void build_buckets() {
    bucket_of.assign(params.size(), 0);
    slot_in_bucket.assign(params.size(), 0);
    ready.assign(params.size(), false);
    if (params.empty()) return;
    for (auto& g : bucket_assignment(params, first_bucket_bytes, bucket_bytes_cap)) {
      bucket b;
      std::int64_t numel = 0;
      for (std::size_t k : g) {
        bucket_of[k] = buckets.size();
        slot_in_bucket[k] = b.params.size();
        b.params.push_back(k);
        b.offsets.push_back(numel);
        numel += params[k].numel();
      }
      b.flat = torch::zeros({numel}, params[g.front()].options().requires_grad(false));
      b.pending = static_cast<int>(g.size());
      buckets.push_back(std::move(b));
    }
    torch::NoGradGuard no_grad;
    for (std::size_t k = 0; k < params.size(); ++k) {
      if (params[k].grad().defined()) slot(k).copy_(params[k].grad().reshape({-1}));
      alias_grad(k);
    }
    stats.buckets = static_cast<int>(buckets.size());
    grads_pending = static_cast<int>(params.size());
  }

  torch::Tensor slot(std::size_t k) {
    auto& b = buckets[bucket_of[k]];
    return b.flat.narrow(0, b.offsets[slot_in_bucket[k]], params[k].numel());
  }

  void on_grad_ready(std::size_t k) {
    if (!sync) return;
    hooks.queue_finish();
    if (k >= params.size() || ready[k]) return;  // a row-sparse one: reduced at the end
    ready[k] = true;
    --grads_pending;
    if (!aliased(k)) {
      torch::NoGradGuard no_grad;
      write_grad(slot(k), params[k].grad(), params[k].sizes());
      alias_grad(k);
    }
    --buckets[bucket_of[k]].pending;
    launch_ready_buckets();
  }

  void launch_ready_buckets() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      if (next_launch == 0) stats.grads_pending_at_first_launch = grads_pending;
      auto& b = buckets[next_launch++];
      // The last bucket is waited for as backward ends: the waiting thread runs it.
      b.work = comm.allreduce(b.flat, reduce::mean, next_launch == buckets.size() ? runs::by_waiter : runs::background);
    }
  }

  void finish_backward() {
    // Parameters that took no part in this backward contribute zeros, so every rank still
    // issues every bucket's allreduce in the same order.
    for (std::size_t k = 0; k < params.size(); ++k)
      if (!ready[k]) {
        ready[k] = true;
        slot(k).zero_();
        if (!aliased(k)) alias_grad(k);
        --buckets[bucket_of[k]].pending;
      }
    launch_ready_buckets();
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& p : row_sparse) allreduce_rows(comm, p);
    stats.allreduce_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() +
                              wait_for_gradients(buckets, &bucket::work, buffers, comm);
    ++stats.synced_steps;
    for (auto& b : buckets) b.pending = static_cast<int>(b.params.size());
    std::fill(ready.begin(), ready.end(), false);
    grads_pending = static_cast<int>(params.size());
    next_launch = 0;
  }
};

DTRAIN_INLINE ddp_reducer::ddp_reducer(torch::nn::Module& module, Collectives comm, std::int64_t first_bucket_bytes,
                                       std::int64_t bucket_bytes_cap)
    : impl_(std::make_shared<impl>(comm, first_bucket_bytes, bucket_bytes_cap)) {
  impl_->self = impl_;
  impl_->setup(module);
}

DTRAIN_INLINE ddp_reducer::~ddp_reducer() { impl_->hooks.remove(); }

DTRAIN_INLINE void ddp_reducer::set_sync(bool on) { impl_->sync = on; }

DTRAIN_INLINE const DdpStats& ddp_reducer::stats() const { return impl_->stats; }

}  // namespace strategy::detail
DTRAIN_NAMESPACE_END
