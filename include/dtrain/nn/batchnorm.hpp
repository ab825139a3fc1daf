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
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor t, const ReduceSum* reduce) {
    // The module that owns *reduce outlives the backward pass of its own forward.
    ctx->saved_data["reduce"] = reinterpret_cast<std::int64_t>(reduce);
    auto out = t.clone();
    (*reduce)(out);
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* reduce = reinterpret_cast<const ReduceSum*>(ctx->saved_data["reduce"].toInt());
    auto g = grads[0].clone();
    (*reduce)(g);
    return {g, torch::Tensor()};
  }
};
}  // namespace detail

struct BatchNorm2dImpl : torch::nn::Module {
  explicit BatchNorm2dImpl(std::int64_t channels, double momentum = 0.1, double eps = 1e-5)
      : momentum_(momentum), eps_(eps) {
    weight = register_parameter("weight", torch::ones({channels}));
    bias = register_parameter("bias", torch::zeros({channels}));
    running_mean = register_buffer("running_mean", torch::zeros({channels}));
    running_var = register_buffer("running_var", torch::ones({channels}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
  }

  /// Statistics reduced over the workers from now on (nullptr: this worker's batch alone).
  void sync(std::shared_ptr<const ReduceSum> reduce) { reduce_ = std::move(reduce); }

  torch::Tensor forward(const torch::Tensor& x) {
    if (!is_training() || !reduce_) {
      if (is_training()) num_batches_tracked.add_(1);
      return torch::batch_norm(x, weight, bias, running_mean, running_var, is_training(), momentum_, eps_,
                               /*cudnn_enabled=*/true);
    }
    // Sums of x and x^2 per channel and the element count, in double, summed over the workers.
    const auto c = x.size(1);
    const auto xd = x.to(torch::kDouble);
    auto local = torch::cat({xd.sum({0, 2, 3}), (xd * xd).sum({0, 2, 3}),
                             torch::full({1}, static_cast<double>(x.numel() / c), xd.options())});
    const auto total = detail::AllReduceSum::apply(local, reduce_.get());
    const auto n = total[2 * c];
    const auto mean = total.slice(0, 0, c) / n;
    const auto var = total.slice(0, c, 2 * c) / n - mean * mean;  // biased, as the normalisation uses
    {
      torch::NoGradGuard no_grad;
      const double count = n.item<double>();
      running_mean.mul_(1 - momentum_).add_(mean.to(running_mean.dtype()), momentum_);
      running_var.mul_(1 - momentum_).add_((var * (count / (count - 1))).to(running_var.dtype()), momentum_);
      num_batches_tracked.add_(1);
    }
    const auto shape = std::vector<std::int64_t>{1, c, 1, 1};
    const auto y = (xd - mean.view(shape)) / torch::sqrt(var.view(shape) + eps_);
    return y.to(x.scalar_type()) * weight.view(shape) + bias.view(shape);
  }

  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  double momentum_, eps_;
  std::shared_ptr<const ReduceSum> reduce_;
};
TORCH_MODULE(BatchNorm2d);

}  // namespace nn

DTRAIN_NAMESPACE_END
