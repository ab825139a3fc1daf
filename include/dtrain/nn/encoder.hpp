// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::EncoderLayer and nn::Encoder: a transformer encoder built from ATen's own ops, the layer the
// text classifier uses and BERT- and ViT-style models can share. Batch first ([batch, sequence,
// features]), post-norm (BERT) or pre-norm (ViT), ReLU or GELU. nn::HubEncoderLayer is the same
// layer with the module names of Hugging Face's checkpoints (BERT's post-norm layout and ViT's
// pre-norm one), which nn/bert.hpp and nn/vit.hpp build their encoders of; both attend() alike.
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
// On the CPU a padded batch runs packed (nn/packed.hpp): the layers see its tokens only.

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include <torch/arg.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/nn/packed.hpp>

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

/// The attention of every encoder here (SelfAttention's, and HubEncoderLayer's for BERT and ViT):
/// softmax(q kᵀ / √width + mask) v per head, q, k and v [batch, heads, sequence, width], with
/// dropout on the weights in training, as transformers' eager attention computes it. `mask`:
/// undefined, or added to the scores ([batch, 1, 1, sequence]). Returns [batch, heads, sequence, width].
torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const torch::Tensor& mask, double dropout, bool training);

/// Multi-head self-attention with one packed input projection (`in_proj_weight` [3d, d]) and
/// `out_proj`, named as torch::nn::MultiheadAttention's.
struct SelfAttentionImpl : torch::nn::Module {
  SelfAttentionImpl(std::int64_t d_model, std::int64_t heads);

  /// x [batch, sequence, d_model]; `mask`: undefined, or added to the attention scores
  /// ([batch, 1, 1, sequence]: 0 for a token, -inf for padding; padding_mask() makes it).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask, double dropout);
  /// x [tokens, d_model]: a padded batch's tokens, packed (PackedTokens); each row attends within itself.
  torch::Tensor forward_packed(const torch::Tensor& x, const PackedTokens& packing, double dropout);

  std::int64_t heads;
  torch::Tensor in_proj_weight, in_proj_bias;
  torch::nn::Linear out_proj{nullptr};
};
TORCH_MODULE(SelfAttention);

/// The additive attention mask of a padding mask ([batch, sequence], true or nonzero at padding),
/// in `dtype`: made once and given to every layer.
torch::Tensor padding_mask(const torch::Tensor& padding, at::ScalarType dtype = at::kFloat);

/// One encoder layer: self-attention and a feed-forward block, each with a residual connection and
/// a layer norm.
struct EncoderLayerImpl : torch::nn::Module {
  explicit EncoderLayerImpl(EncoderLayerOptions o);

  /// x [batch, sequence, d_model]; `mask` as SelfAttention's (padding_mask()).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask = {});
  /// x [tokens, d_model]: a padded batch's tokens, packed (PackedTokens::pack).
  torch::Tensor forward_packed(const torch::Tensor& x, const PackedTokens& packing);

  EncoderLayerOptions options;
  SelfAttention self_attn{nullptr};
  torch::nn::Linear linear1{nullptr}, linear2{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};

 private:
  template <class Mask>  // an additive mask tensor, or PackedTokens
  torch::Tensor layer(const torch::Tensor& x, const Mask& mask) {
    const double p = options.dropout();
    if (options.norm_first()) {
      auto h = x + drop(attention(norm1(x), mask, p));
      return h + drop(feedforward(norm2(h)));
    }
    auto h = norm1(x + drop(attention(x, mask, p)));
    return norm2(h + drop(feedforward(h)));
  }
  torch::Tensor attention(const torch::Tensor& x, const torch::Tensor& mask, double p) { return self_attn(x, mask, p); }
  torch::Tensor attention(const torch::Tensor& x, const PackedTokens& packing, double p) {
    return self_attn->forward_packed(x, packing, p);
  }
  torch::Tensor drop(const torch::Tensor& t);
  torch::Tensor feedforward(const torch::Tensor& x);
};
TORCH_MODULE(EncoderLayer);

/// `layers` encoder layers (`layers.0`, `layers.1`, ..., as torch::nn::TransformerEncoder names
/// them), each with its own weights.
struct EncoderImpl : torch::nn::Module {
  EncoderImpl(EncoderLayerOptions o, std::int64_t count);
  /// x [batch, sequence, d_model]; `padding` [batch, sequence], true at padding, or undefined.
  /// On the CPU a batch with padding runs packed (nn/packed.hpp), and its output is 0 at padding.
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& padding = {});
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(Encoder);

/// @name Encoder layers named as Hugging Face checkpoints name them (BERT's and ViT's)
/// @{

/// Where a HubEncoderLayer's layer norms sit, and what its modules are called:
///  - bert: post-norm (a LayerNorm after each residual sum), as transformers' BertLayer:
///    attention.self.{query,key,value}, attention.output.{dense,LayerNorm}, intermediate.dense,
///    output.{dense,LayerNorm};
///  - vit: pre-norm (a LayerNorm before each block), as transformers' ViTLayer in its checkpoints:
///    attention.attention.{query,key,value}, attention.output.dense, intermediate.dense,
///    output.dense, layernorm_before, layernorm_after.
enum class HubLayout { bert, vit };

/// `HubEncoderLayerOptions(hidden, heads, intermediate).layout(HubLayout::vit)`.
struct HubEncoderLayerOptions {
  HubEncoderLayerOptions(std::int64_t hidden, std::int64_t heads, std::int64_t intermediate)
      : hidden_(hidden), heads_(heads), intermediate_(intermediate) {}
  TORCH_ARG(std::int64_t, hidden);
  TORCH_ARG(std::int64_t, heads);
  TORCH_ARG(std::int64_t, intermediate);
  TORCH_ARG(HubLayout, layout) = HubLayout::bert;
  /// config.json's hidden_act: "gelu" (exact), "gelu_new" or "gelu_pytorch_tanh" (tanh), "relu".
  TORCH_ARG(std::string, activation) = "gelu";
  /// After the attention's output projection and after the feed-forward block, in training.
  TORCH_ARG(double, hidden_dropout) = 0.1;
  /// On the attention weights, in training.
  TORCH_ARG(double, attention_dropout) = 0.1;
  TORCH_ARG(double, layer_norm_eps) = 1e-12;
  /// The Linear weights' initial normal(0, initializer_range) (biases 0), as transformers'.
  TORCH_ARG(double, initializer_range) = 0.02;
  /// Biases on query, key and value (ViT's qkv_bias).
  TORCH_ARG(bool, qkv_bias) = true;
};

/// Whether HubEncoderLayer computes config.json's hidden_act `name`.
inline bool hub_activation_supported(const std::string& name) {
  return name == "gelu" || name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "relu";
}

namespace detail {

/// A module that only names its children (transformers' BertAttention, ViTIntermediate, ...).
inline std::shared_ptr<torch::nn::Module> hub_node(torch::nn::Module& parent, const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>());
}

torch::nn::Linear hub_linear(torch::nn::Module& parent, const std::string& name, std::int64_t in, std::int64_t out,
                             double initializer_range, bool bias = true);

torch::nn::LayerNorm hub_norm(torch::nn::Module& parent, const std::string& name, std::int64_t width, double eps);

inline torch::Tensor apply(const torch::nn::Linear& l, const torch::Tensor& x) { return at::linear(x, l->weight, l->bias); }

torch::Tensor apply(const torch::nn::LayerNorm& n, const torch::Tensor& x, double eps);

}  // namespace detail

/// One encoder layer of a Hugging Face checkpoint (HubLayout says which): self-attention with
/// separate query, key and value projections (attend()), then a feed-forward block, each with a
/// residual sum; the parameter names are the checkpoint's, so its tensors load by name.
struct HubEncoderLayerImpl : torch::nn::Module {
  explicit HubEncoderLayerImpl(HubEncoderLayerOptions o);

  /// x [batch, sequence, hidden]; `mask` undefined or additive [batch, 1, 1, sequence].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask = {}) { return layer(x, mask); }
  /// x [tokens, hidden]: a padded batch's tokens, packed (PackedTokens::pack).
  torch::Tensor forward_packed(const torch::Tensor& x, const PackedTokens& packing);

  HubEncoderLayerOptions options;
  torch::nn::Linear query{nullptr}, key{nullptr}, value{nullptr};
  torch::nn::Linear attention_dense{nullptr}, intermediate{nullptr}, output_dense{nullptr};
  /// bert: attention.output.LayerNorm and output.LayerNorm; vit: layernorm_before and layernorm_after.
  torch::nn::LayerNorm attention_norm{nullptr}, output_norm{nullptr};

 private:
  template <class Mask>  // an additive mask tensor, or PackedTokens
  torch::Tensor layer(const torch::Tensor& x, const Mask& mask) {
    const double eps = options.layer_norm_eps();
    if (options.layout() == HubLayout::bert) {
      const auto h = detail::apply(attention_norm, drop(self_attention(x, mask)) + x, eps);
      return detail::apply(output_norm, drop(feedforward(h)) + h, eps);
    }
    const auto h = drop(self_attention(detail::apply(attention_norm, x, eps), mask)) + x;
    return drop(feedforward(detail::apply(output_norm, h, eps))) + h;
  }
  torch::Tensor drop(const torch::Tensor& t);
  /// The attention's output projection of its heads' result.
  torch::Tensor self_attention(const torch::Tensor& x, const torch::Tensor& mask);
  torch::Tensor self_attention(const torch::Tensor& x, const PackedTokens& packing);
  torch::Tensor feedforward(const torch::Tensor& x);
};
TORCH_MODULE(HubEncoderLayer);

/// @}

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/encoder.ipp>
#endif
