// SPDX-License-Identifier: Apache-2.0
#pragma once
// strategy::ddp<>: data parallelism with bucketed gradient allreduce overlapped with backward.

#include <cstdint>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/collective.hpp>
#include <dtrain/policy/category.hpp>
#include <dtrain/strategy/detail/ddp_reducer.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace strategy {

/// The first bucket is small so that its allreduce starts early in backward (PyTorch's value).
inline constexpr std::int64_t default_first_bucket_bytes = std::int64_t{1} << 20;
/// Later buckets are large so that each collective's fixed cost is amortised (PyTorch's value).
inline constexpr std::int64_t default_bucket_bytes_cap = std::int64_t{25} << 20;

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

  /// The reducer of one prepared model, talking through `Communicator` (detail/ddp_reducer.hpp).
  template <class Communicator>
  class state {
   public:
    state(torch::nn::Module& module, Communicator& comm)
        : reducer_(module, Collectives(comm), FirstBucketBytes, BucketBytesCap) {}

    void set_sync(bool on) { reducer_.set_sync(on); }
    const DdpStats& stats() const { return reducer_.stats(); }

   private:
    detail::ddp_reducer reducer_;
  };
};

}  // namespace strategy

DTRAIN_NAMESPACE_END
