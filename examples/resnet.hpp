// SPDX-License-Identifier: Apache-2.0
#pragma once
// ResNet-18 for small images (CIFAR-style stem: a 3x3 stride-1 first convolution, no max-pool),
// with BasicBlocks and BatchNorm2d, its parameters and buffers named as torchvision's resnet18
// state_dict (conv1.weight, bn1.running_mean, layer2.0.downsample.0.weight, fc.bias, ...), so that
// dtrain::weights::load_python_state_dict loads a torchvision model saved in Python.
//
// Width: the stages have width, 2*width, 4*width, 8*width channels; 64 is the standard network.
//
// torchvision's own ResNets (the ImageNet stem: 7x7 stride-2 convolution and max-pool; ResNet-18 to
// -152) are dtrain::nn::ResNet (include/dtrain/nn/resnet.hpp, docs/models.md). This one stays for
// what that one has not: the small-image stem, grey images, a width, and SyncBatchNorm.
//
// BatchNorm under DDP: each worker normalises with the statistics of its own part of the global
// batch (as PyTorch's BatchNorm2d under DistributedDataParallel): with small per-worker batches
// those statistics are noisy, and the running statistics of the workers drift apart (a checkpoint
// saves rank 0's). ResNet::sync_batchnorm(reduce_sum) makes every BatchNorm reduce its batch
// statistics over the workers (as torch.nn.SyncBatchNorm): 2 workers with 32 images each then
// normalise, and update their running statistics, exactly as 1 worker with the 64.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace resnet {

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

/// BatchNorm2d with torch::nn::BatchNorm2d's names (weight, bias, running_mean, running_var,
/// num_batches_tracked) and its defaults (momentum 0.1, eps 1e-5), which reduces its batch
/// statistics over the workers while training once given a ReduceSum.
class BatchNorm2dImpl : public torch::nn::Module {
 public:
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

inline torch::nn::Conv2d conv3x3(std::int64_t in, std::int64_t out, std::int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

/// torchvision's BasicBlock: conv3x3-bn-relu-conv3x3-bn, plus the input (through a 1x1 convolution
/// and a BatchNorm, `downsample`, when the stride or the width changes), then relu.
class BasicBlockImpl : public torch::nn::Module {
 public:
  BasicBlockImpl(std::int64_t in, std::int64_t out, std::int64_t stride)
      : conv1(register_module("conv1", conv3x3(in, out, stride))),
        bn1(register_module("bn1", BatchNorm2d(out))),
        conv2(register_module("conv2", conv3x3(out, out, 1))),
        bn2(register_module("bn2", BatchNorm2d(out))) {
    if (stride != 1 || in != out)
      downsample = register_module(
          "downsample", torch::nn::Sequential(
                            torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                            BatchNorm2d(out)));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (downsample ? downsample->forward(x) : x));
  }

  torch::nn::Conv2d conv1, conv2;
  BatchNorm2d bn1, bn2;
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

struct Options {
  /// Channels of the first stage; 64 is the standard ResNet-18.
  std::int64_t width = 64;
  std::int64_t num_classes = 10;
  /// 3 for colour images, 1 for grey ones.
  std::int64_t in_channels = 3;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Options, width, num_classes, in_channels)

/// ResNet-18 with the small-image stem. Stages layer1..layer4 (two BasicBlocks each, strides
/// 1, 2, 2, 2) are members, so that a strategy may wrap each as a unit. It describes itself
/// (`Config config`): a checkpoint rebuilds it with no sizes given (checkpointer/model_config.hpp).
class ResNetImpl : public torch::nn::Module {
 public:
  using Config = Options;
  explicit ResNetImpl(Options o = {})
      : config(o),
        conv1(register_module("conv1", conv3x3(o.in_channels, o.width, 1))),
        bn1(register_module("bn1", BatchNorm2d(o.width))),
        layer1(register_module("layer1", stage(o.width, o.width, 1))),
        layer2(register_module("layer2", stage(o.width, 2 * o.width, 2))),
        layer3(register_module("layer3", stage(2 * o.width, 4 * o.width, 2))),
        layer4(register_module("layer4", stage(4 * o.width, 8 * o.width, 2))),
        fc(register_module("fc", torch::nn::Linear(8 * o.width, o.num_classes))) {
    // torchvision's initialisation: Kaiming-normal (fan_out, relu) convolutions, BatchNorm 1 and 0.
    for (auto& m : modules(/*include_self=*/false))
      if (auto* conv = m->as<torch::nn::Conv2d>())
        torch::nn::init::kaiming_normal_(conv->weight, 0, torch::kFanOut, torch::kReLU);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(bn1(conv1(x)));  // no max-pool: small images keep their resolution
    y = layer4->forward(layer3->forward(layer2->forward(layer1->forward(y))));
    return fc(torch::adaptive_avg_pool2d(y, {1, 1}).flatten(1));
  }

  /// Every BatchNorm reduces its batch statistics over the workers with `reduce` while training
  /// (SyncBatchNorm); an empty function turns it off again.
  void sync_batchnorm(ReduceSum reduce) {
    auto shared = reduce ? std::make_shared<const ReduceSum>(std::move(reduce)) : nullptr;
    for (auto& m : modules(/*include_self=*/false))
      if (auto* bn = m->as<BatchNorm2dImpl>()) bn->sync(shared);
  }

  Config config;
  torch::nn::Conv2d conv1;
  BatchNorm2d bn1;
  torch::nn::Sequential layer1, layer2, layer3, layer4;
  torch::nn::Linear fc;

 private:
  static torch::nn::Sequential stage(std::int64_t in, std::int64_t out, std::int64_t stride) {
    return torch::nn::Sequential(BasicBlock(in, out, stride), BasicBlock(out, out, 1));
  }
};
TORCH_MODULE(ResNet);

}  // namespace resnet
