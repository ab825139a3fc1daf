// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::BatchNorm2d: torch.nn.BatchNorm2d with its state_dict names (weight, bias, running_mean,
// running_var, num_batches_tracked) and defaults (momentum 0.1, eps 1e-5), which becomes a
// SyncBatchNorm (as torch.nn.SyncBatchNorm) once given a ReduceSum.
//
// BatchNorm under DDP: each worker normalises with the statistics of its own part of the global
// batch (as PyTorch's BatchNorm2d under DistributedDataParallel): with small per-worker batches
// those statistics are noisy, and the running statistics of the workers drift apart (a checkpoint
// saves rank 0's). sync(reduce) makes the layer reduce its batch statistics over the workers while
// training: the per-channel sums of x and x^2 and the element count, in fp64, are summed with
// `reduce` (one all-reduce per forward, one in backward, whose gradient flows back to every rank),
// so 2 workers with 32 images each normalise, and update their running statistics, exactly as 1
// worker with the 64 (examples/resnet_syncbn.cpp checks it). nn::ResNet::sync_batchnorm turns it on
// for every BatchNorm of the network. Without a ReduceSum, and in eval mode, it computes what
// torch::nn::BatchNorm2d computes (torch::batch_norm).

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>
#include <torch/csrc/autograd/custom_function.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// Sums a tensor over the workers, in place (e.g. `[&](torch::Tensor& t) { ctx.all_reduce(t); }`).
using ReduceSum = std::function<void(torch::Tensor&)>;

namespace detail {
// A sum over the workers whose gradient is the sum over the workers too: the statistics a rank
// normalises with depend on every rank's images, so their gradients flow back to every rank.
struct AllReduceSum : torch::autograd::Function<AllReduceSum> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor t, const ReduceSum* reduce);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads);
};
}  // namespace detail

struct BatchNorm2dImpl : torch::nn::Module {
  explicit BatchNorm2dImpl(std::int64_t channels, double momentum = 0.1, double eps = 1e-5);

  /// Statistics reduced over the workers from now on (nullptr: this worker's batch alone).
  void sync(std::shared_ptr<const ReduceSum> reduce) { reduce_ = std::move(reduce); }

  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  double momentum_, eps_;
  std::shared_ptr<const ReduceSum> reduce_;
};
TORCH_MODULE(BatchNorm2d);

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/batchnorm.ipp>
#endif
