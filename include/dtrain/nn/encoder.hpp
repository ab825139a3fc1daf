// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::EncoderLayer and nn::Encoder: a transformer encoder built from ATen's own ops, the layer the
// text classifier uses and BERT- and ViT-style models can share. Batch first ([batch, sequence,
// features]), post-norm (BERT) or pre-norm (ViT), ReLU or GELU.
//
// Why not torch::nn::TransformerEncoderLayer: LibTorch's C++ layer does work Python's does not:
//  - its F::linear computes a 3-d input as matmul and then `+= bias`, a separate pass over every
//    output, where ATen's linear (Python's nn.Linear) folds the bias into the matrix product (on an
//    H200 that pass was 11 % of a transformer block's step: docs/gpu.md, finding 5);
//  - its multi-head attention compares query, key and value elementwise (torch::equal, twice: two
//    full reads and a host sync) to find out it is self-attention, splits q/k/v with chunk and
//    copies, and averages the attention weights over heads for a return value the layer drops;
//  - it wants [sequence, batch, features], so a batch-first model transposes twice a layer.
// Here q, k and v come from one at::linear, split by a view, and the padding mask is one additive
// tensor for all layers. The parameters are named as torch::nn::TransformerEncoderLayer's and
// Python's nn.TransformerEncoderLayer's (self_attn.in_proj_weight, linear1, norm1, ...), so their
// state dicts load as they are; with the same weights the outputs agree within 1e-5 (tests/unit).

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <torch/arg.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

enum class Activation { relu, gelu };

/// `EncoderLayerOptions(d_model, heads).feedforward(256).dropout(0.1)`, as
/// torch::nn::TransformerEncoderLayerOptions with the same defaults.
struct EncoderLayerOptions {
  EncoderLayerOptions(std::int64_t d_model, std::int64_t heads) : d_model_(d_model), heads_(heads) {}
  TORCH_ARG(std::int64_t, d_model);
  TORCH_ARG(std::int64_t, heads);
  /// The hidden width of the feed-forward block.
  TORCH_ARG(std::int64_t, feedforward) = 2048;
  /// On the attention weights, the attention's output and the feed-forward block, in training.
  TORCH_ARG(double, dropout) = 0.1;
  TORCH_ARG(Activation, activation) = Activation::relu;
  /// Layer norm before each block (pre-norm, ViT) instead of after the residual sum (BERT).
  TORCH_ARG(bool, norm_first) = false;
  TORCH_ARG(double, layer_norm_eps) = 1e-5;
};

/// Multi-head self-attention with one packed input projection (`in_proj_weight` [3d, d]) and
/// `out_proj`, named as torch::nn::MultiheadAttention's.
struct SelfAttentionImpl : torch::nn::Module {
  SelfAttentionImpl(std::int64_t d_model, std::int64_t heads) : heads(heads) {
    if (d_model <= 0 || heads <= 0 || d_model % heads != 0)
      throw ConfigError("nn::EncoderLayer: d_model " + std::to_string(d_model) + " must be a positive multiple of heads " +
                        std::to_string(heads));
    in_proj_weight = register_parameter("in_proj_weight", torch::empty({3 * d_model, d_model}));
    in_proj_bias = register_parameter("in_proj_bias", torch::zeros({3 * d_model}));
    out_proj = register_module("out_proj", torch::nn::Linear(d_model, d_model));
    // torch::nn::MultiheadAttention's initialisation.
    torch::nn::init::xavier_uniform_(in_proj_weight);
    torch::nn::init::zeros_(out_proj->bias);
  }

  /// x [batch, sequence, d_model]; `mask`: undefined, or added to the attention scores
  /// ([batch, 1, 1, sequence]: 0 for a token, -inf for padding; padding_mask() makes it).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask, double dropout) {
    const auto b = x.size(0), s = x.size(1), d = x.size(2);
    const auto qkv = at::linear(x, in_proj_weight, in_proj_bias).view({b, s, 3, heads, d / heads}).permute({2, 0, 3, 1, 4});
    const auto q = qkv[0] * (1.0 / std::sqrt(static_cast<double>(d / heads)));
    auto scores = at::matmul(q, qkv[1].transpose(-2, -1));  // [batch, heads, sequence, sequence]
    if (mask.defined()) scores = scores + mask;
    auto weights = at::softmax(scores, -1);
    if (dropout > 0 && is_training()) weights = at::dropout(weights, dropout, true);
    const auto heads_out = at::matmul(weights, qkv[2]);  // [batch, heads, sequence, head width]
    return at::linear(heads_out.transpose(1, 2).reshape({b, s, d}), out_proj->weight, out_proj->bias);
  }

  std::int64_t heads;
  torch::Tensor in_proj_weight, in_proj_bias;
  torch::nn::Linear out_proj{nullptr};
};
TORCH_MODULE(SelfAttention);

/// The additive attention mask of a padding mask ([batch, sequence], true or nonzero at padding),
/// in `dtype`: made once and given to every layer.
inline torch::Tensor padding_mask(const torch::Tensor& padding, at::ScalarType dtype = at::kFloat) {
  if (!padding.defined()) return {};
  if (padding.dim() != 2)
    throw ConfigError("nn::padding_mask: the padding mask must be [batch, sequence], got " +
                      std::to_string(padding.dim()) + " dimensions");
  return at::zeros({padding.size(0), 1, 1, padding.size(1)}, padding.options().dtype(dtype))
      .masked_fill_(padding.to(at::kBool).view({padding.size(0), 1, 1, padding.size(1)}),
                    -std::numeric_limits<double>::infinity());
}

/// One encoder layer: self-attention and a feed-forward block, each with a residual connection and
/// a layer norm.
struct EncoderLayerImpl : torch::nn::Module {
  explicit EncoderLayerImpl(EncoderLayerOptions o) : options(o) {
    self_attn = register_module("self_attn", SelfAttention(o.d_model(), o.heads()));
    linear1 = register_module("linear1", torch::nn::Linear(o.d_model(), o.feedforward()));
    linear2 = register_module("linear2", torch::nn::Linear(o.feedforward(), o.d_model()));
    norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model()}).eps(o.layer_norm_eps())));
    norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model()}).eps(o.layer_norm_eps())));
  }

  /// x [batch, sequence, d_model]; `mask` as SelfAttention's (padding_mask()).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask = {}) {
    if (x.dim() != 3 || x.size(2) != options.d_model())
      throw ConfigError("nn::EncoderLayer: the input must be [batch, sequence, " + std::to_string(options.d_model()) +
                        "] (batch first), got " + std::to_string(x.dim()) + " dimensions" +
                        (x.dim() == 3 ? " with " + std::to_string(x.size(2)) + " features" : std::string()));
    const double p = options.dropout();
    if (options.norm_first()) {
      auto h = x + drop(self_attn(norm1(x), mask, p));
      return h + drop(feedforward(norm2(h)));
    }
    auto h = norm1(x + drop(self_attn(x, mask, p)));
    return norm2(h + drop(feedforward(h)));
  }

  EncoderLayerOptions options;
  SelfAttention self_attn{nullptr};
  torch::nn::Linear linear1{nullptr}, linear2{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};

 private:
  torch::Tensor drop(const torch::Tensor& t) {
    return options.dropout() > 0 && is_training() ? at::dropout(t, options.dropout(), true) : t;
  }
  torch::Tensor feedforward(const torch::Tensor& x) {
    auto h = at::linear(x, linear1->weight, linear1->bias);
    h = options.activation() == Activation::gelu ? at::gelu(h) : at::relu(h);
    return at::linear(drop(h), linear2->weight, linear2->bias);
  }
};
TORCH_MODULE(EncoderLayer);

/// `layers` encoder layers (`layers.0`, `layers.1`, ..., as torch::nn::TransformerEncoder names
/// them), each with its own weights.
struct EncoderImpl : torch::nn::Module {
  EncoderImpl(EncoderLayerOptions o, std::int64_t count) {
    layers = register_module("layers", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < count; ++i) layers->push_back(EncoderLayer(o));
  }
  /// x [batch, sequence, d_model]; `padding` [batch, sequence], true at padding, or undefined.
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& padding = {}) {
    const auto mask = padding_mask(padding, x.scalar_type());
    for (const auto& layer : *layers) x = layer->as<EncoderLayerImpl>()->forward(x, mask);
    return x;
  }
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(Encoder);

}  // namespace nn

DTRAIN_NAMESPACE_END
