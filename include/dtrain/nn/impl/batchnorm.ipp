// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of batchnorm.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/nn/batchnorm.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {
namespace detail {

DTRAIN_INLINE torch::Tensor AllReduceSum::forward(torch::autograd::AutogradContext* ctx, torch::Tensor t, const ReduceSum* reduce) {
  // The module that owns *reduce outlives the backward pass of its own forward.
  ctx->saved_data["reduce"] = reinterpret_cast<std::int64_t>(reduce);
  auto out = t.clone();
  (*reduce)(out);
  return out;
}

DTRAIN_INLINE torch::autograd::variable_list AllReduceSum::backward(torch::autograd::AutogradContext* ctx,
                                                                    torch::autograd::variable_list grads) {
  const auto* reduce = reinterpret_cast<const ReduceSum*>(ctx->saved_data["reduce"].toInt());
  auto g = grads[0].clone();
  (*reduce)(g);
  return {g, torch::Tensor()};
}
}  // namespace detail

DTRAIN_INLINE BatchNorm2dImpl::BatchNorm2dImpl(std::int64_t channels, double momentum, double eps)
    : momentum_(momentum), eps_(eps) {
  weight = register_parameter("weight", torch::ones({channels}));
  bias = register_parameter("bias", torch::zeros({channels}));
  running_mean = register_buffer("running_mean", torch::zeros({channels}));
  running_var = register_buffer("running_var", torch::ones({channels}));
  num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
}

DTRAIN_INLINE torch::Tensor BatchNorm2dImpl::forward(const torch::Tensor& x) {
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
}  // namespace nn
DTRAIN_NAMESPACE_END
