// SPDX-License-Identifier: Apache-2.0
#pragma once
// The reducer of strategy::ddp<>: one prepared model's gradient buckets, their allreduces launched
// from autograd's hooks during backward and awaited as it ends. Written against Collectives, so it
// is compiled once for every Backend and bucket size (ddp.hpp's state<Communicator> holds one).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/collective.hpp>
#include <dtrain/detail/buffer_sync.hpp>
#include <dtrain/strategy/detail/gradient_hooks.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace strategy {

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

namespace detail {

class ddp_reducer {
 public:
  /// Broadcasts rank 0's parameters and buffers, packs the parameters that require gradients into
  /// buckets (the first up to `first_bucket_bytes`, the rest up to `bucket_bytes_cap`) and hooks
  /// them. `comm` must outlive the reducer.
  ddp_reducer(torch::nn::Module& module, Collectives comm, std::int64_t first_bucket_bytes,
              std::int64_t bucket_bytes_cap);
  ddp_reducer(const ddp_reducer&) = delete;
  ddp_reducer& operator=(const ddp_reducer&) = delete;
  ~ddp_reducer();

  void set_sync(bool on);
  const DdpStats& stats() const;

  struct impl;  // shared with the autograd hooks, which may outlive the reducer

 private:
  std::shared_ptr<impl> impl_;
};

}  // namespace detail

}  // namespace strategy

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/strategy/detail/impl/ddp_reducer.ipp>
#endif
