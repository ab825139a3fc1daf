// SPDX-License-Identifier: Apache-2.0
#pragma once
// strategy::ddp<>: data parallelism with bucketed gradient allreduce overlapped with backward.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/collective.hpp>
#include <dtrain/detail/buffer_sync.hpp>
#include <dtrain/policy/category.hpp>
#include <dtrain/strategy/assignment.hpp>
#include <dtrain/strategy/detail/gradient_hooks.hpp>
#include <dtrain/strategy/detail/row_sparse.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace strategy {

/// The first bucket is small so that its allreduce starts early in backward (PyTorch's value).
inline constexpr std::int64_t default_first_bucket_bytes = std::int64_t{1} << 20;
/// Later buckets are large so that each collective's fixed cost is amortised (PyTorch's value).
inline constexpr std::int64_t default_bucket_bytes_cap = std::int64_t{25} << 20;

/// What the reducer saw in the last synchronised backward: for tests and per-step breakdowns.
struct DdpStats {
  /// Buckets of the model, and the gradients still awaited when the first bucket's allreduce was
  /// launched in the last synchronised backward (> 0: communication overlapped backward).
  int buckets = 0;
  int grads_pending_at_first_launch = 0;
  /// Synchronised backward passes, and the seconds spent waiting for their allreduces at the end.
  std::int64_t synced_steps = 0;
  double allreduce_wait_s = 0;
};

/// Distributed data parallel, as PyTorch's DistributedDataParallel does it.
///
/// - At prepare_model: rank 0's parameters and buffers are broadcast to every rank.
/// - Parameters are packed into buckets in reverse registration order (the order backward usually
///   produces gradients), the first up to FirstBucketBytes, the rest up to BucketBytesCap.
/// - Each parameter's `.grad` lives in its bucket (a tensor over the bucket's memory, so autograd
///   accumulates straight into it: no copy in, no copy out). A post-hook on the parameter's
///   gradient accumulator marks it ready; when a bucket is full its allreduce (mean over ranks) is
///   launched asynchronously, while backward goes on. A `.grad` that was replaced (zero_grad with
///   set_to_none, or assigned) is copied in once and pointed back at its bucket. Buckets are launched strictly in index order, so the sequence of collectives
///   is identical on every rank.
/// - An autograd engine callback at the end of backward launches buckets holding parameters that
///   got no gradient (their slots are zero) and waits for every allreduce.
/// - Under ctx.no_sync() gradients only accumulate locally (k-1 of k micro-batches).
/// - Buffers (BatchNorm's running statistics): each rank updates its own in forward; after each
///   synchronised backward rank 0's floating-point buffers are broadcast to all, so every rank (and
///   any checkpoint) holds rank 0's statistics, as PyTorch's broadcast_buffers=True gives.
///   Integer buffers (num_batches_tracked) advance identically on every rank and are left alone.
/// - The weight of an Embedding or EmbeddingBag made with `.sparse(true)` stays out of the
///   buckets: its sparse gradient is averaged over the union of the rows some rank looked up, at
///   the end of backward, and stays sparse (see detail/row_sparse.hpp). ctx.step hands the
///   optimizer its dense equal, so Adam steps it as it would the dense layer's.
template <std::int64_t FirstBucketBytes = default_first_bucket_bytes,
          std::int64_t BucketBytesCap = default_bucket_bytes_cap>
struct ddp {
  using category = dtrain::category::strategy;
  static constexpr const char* name = "ddp";
  static constexpr std::int64_t first_bucket_bytes = FirstBucketBytes;
  static constexpr std::int64_t bucket_bytes_cap = BucketBytesCap;
  static_assert(FirstBucketBytes > 0 && BucketBytesCap > 0,
                "strategy::ddp<FirstBucketBytes, BucketBytesCap>: both sizes must be positive");

  /// The reducer of one prepared model, talking through `Communicator`.
  template <class Communicator>
  class state {
   public:
    state(torch::nn::Module& module, Communicator& comm) : impl_(std::make_shared<impl>(comm)) {
      impl_->self = impl_;
      impl_->setup(module);
    }
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() { impl_->hooks.remove(); }

    void set_sync(bool on) { impl_->sync = on; }
    const DdpStats& stats() const { return impl_->stats; }

   private:
    struct bucket {
      torch::Tensor flat;                 // the bucket's gradients, back to back
      std::vector<std::size_t> params;    // indices into impl::params
      std::vector<std::int64_t> offsets;  // where each one starts in `flat`
      int pending = 0;                    // gradients not yet copied in this backward
      Work work;
    };

    struct impl {
      explicit impl(Communicator& c) : comm(c) {}
      Communicator& comm;
      std::weak_ptr<impl> self;
      std::vector<torch::Tensor> params;  // dense: in the buckets
      std::vector<torch::Tensor> row_sparse;  // hooked after `params`, reduced row by row
      detail::gradient_hooks<impl> hooks;
      std::vector<std::size_t> bucket_of, slot_in_bucket;
      std::vector<bool> ready;
      std::vector<bucket> buckets;
      dtrain::detail::buffer_sync buffers;
      std::size_t next_launch = 0;
      bool sync = true;
      int grads_pending = 0;
      DdpStats stats;

      void setup(torch::nn::Module& module) {
        row_sparse = detail::row_sparse_parameters(module);
        auto is_row_sparse = [&](const torch::Tensor& p) {
          for (const auto& r : row_sparse)
            if (r.is_same(p)) return true;
          return false;
        };
        for (auto& p : module.parameters())
          if (p.requires_grad() && !is_row_sparse(p)) params.push_back(p);
        detail::broadcast_state(module, comm);
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
        for (auto& g : bucket_assignment(params, FirstBucketBytes, BucketBytesCap)) {
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
          detail::write_grad(slot(k), params[k].grad(), params[k].sizes());
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
          b.work = dtrain::detail::allreduce(comm, b.flat, reduce::mean,
                                             next_launch == buckets.size() ? runs::by_waiter : runs::background);
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
        for (auto& p : row_sparse) detail::allreduce_rows(comm, p);
        stats.allreduce_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() +
                                  detail::wait_for_gradients(buckets, &bucket::work, buffers, comm);
        ++stats.synced_steps;
        for (auto& b : buckets) b.pending = static_cast<int>(b.params.size());
        std::fill(ready.begin(), ready.end(), false);
        grads_pending = static_cast<int>(params.size());
        next_launch = 0;
      }
    };

    std::shared_ptr<impl> impl_;
  };
};

}  // namespace strategy

DTRAIN_NAMESPACE_END
