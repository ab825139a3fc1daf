// SPDX-License-Identifier: Apache-2.0
#pragma once
// Rank 0's floating-point buffers made everyone's after a synchronised backward: shared by
// strategy::ddp<> and strategy::fsdp<>.

#include <cstdint>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/collective.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {

/// The module's floating-point buffers (BatchNorm's running statistics), packed into one flat
/// tensor so that rank 0's values reach every rank in a single broadcast (PyTorch's
/// broadcast_buffers=True). Integer buffers (num_batches_tracked) advance identically on every
/// rank and are left alone.
class buffer_sync {
 public:
  buffer_sync() = default;
  explicit buffer_sync(torch::nn::Module& module);

  /// Packs this rank's buffers and starts the broadcast from rank 0 (nothing to do alone).
  template <class Communicator>
  Work start(Communicator& comm) {
    pending_ = flat_.defined() && comm.size() > 1;
    if (!pending_) return {};
    torch::NoGradGuard no_grad;
    std::int64_t at = 0;
    for (auto& b : buffers_) {
      flat_.narrow(0, at, b.numel()).copy_(b.reshape({-1}));
      at += b.numel();
    }
    return detail::broadcast(comm, flat_, 0, runs::by_waiter);  // waited for at once
  }

  /// After the broadcast's wait(): rank 0's values back into the buffers.
  void finish();

 private:
  std::vector<torch::Tensor> buffers_;
  torch::Tensor flat_;
  bool pending_ = false;
};

}  // namespace detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/detail/impl/buffer_sync.ipp>
#endif
