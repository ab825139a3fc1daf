// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the decoder families (nn/llama.hpp, nn/gpt2.hpp) share: the KV cache generation appends to,
// the causal mask with padding and sliding windows, attention (ATen's fused scaled-dot-product
// attention on LibTorch 2.x, the same arithmetic written out on 1.13), RMSNorm, the rotary
// embedding, and loading a Hugging Face causal LM's file into a whole model or its backbone.
//
// Masks are additive: 0 where a query may look, the dtype's lowest value where it may not (never
// -inf: no NaN can reach other rows through the values); a query that sees no key at all (a left
// pad's) gets a zero attention output, as transformers' default SDPA attention gives it. A decoder's
// `attention_mask` is [batch, past + new] (1: a token, 0: padding), covering the cached tokens too.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/data/fields.hpp>
#include <dtrain/error.hpp>
#include <dtrain/weights.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// The keys and values of every token a decoder has seen, per layer, [batch, kv_heads, tokens,
/// head_dim]: what generation keeps between steps so that a step computes its new token only.
/// Each layer's buffer grows by doubling, so an append copies only the new tokens.
class KVCache {
 public:
  /// Appends `layer`'s keys and values of the new tokens and returns all of the layer's (views).
  std::pair<torch::Tensor, torch::Tensor> append(std::size_t layer, const torch::Tensor& keys, const torch::Tensor& values);
  /// The tokens cached (layer 0's count; 0 when empty).
  std::int64_t length() const { return layers_.empty() ? 0 : layers_.front().length; }
  void clear() { layers_.clear(); }

 private:
  struct Layer {
    torch::Tensor keys, values;
    std::int64_t length = 0;
  };
  std::vector<Layer> layers_;
};

/// A decoder layer's attention mask: `additive` [batch or 1, 1, new, past + new], or undefined with
/// `causal` (no padding, no window, nothing cached: SDPA's is_causal) or neither (one new token
/// that sees everything).
struct DecoderMask {
  torch::Tensor additive;
  bool causal = false;
  /// [batch, 1, new, 1], true for a query that sees no key (a left pad's): its attention output is
  /// 0, as transformers' default (SDPA) attention gives it. Undefined when there is none.
  torch::Tensor blind;
};

/// The mask of `new_tokens` queries after `past` cached tokens: causal, hiding the padding of
/// `attention_mask` ([batch, past + new_tokens] of 0/1, or undefined: no padding) and, with a
/// `window`, keys `window` or more tokens back; with `documents` ([batch, new_tokens], no cache),
/// keys of another document (packed_documents). ConfigError when the mask's shape disagrees.
DecoderMask decoder_mask(const torch::Tensor& attention_mask, std::int64_t batch, std::int64_t new_tokens, std::int64_t past,
                         std::optional<std::int64_t> window, torch::ScalarType dtype, torch::Device device,
                         const torch::Tensor& documents = {});

/// Packed sequences (several documents in one row, each one's positions counting from 0 again):
/// the document of each token, [batch, tokens], a new one wherever a position is not the one before
/// plus 1, as transformers finds them; undefined when every row is one document. transformers and
/// the decoder families apply it when `position_ids` come without an attention_mask and a cache.
torch::Tensor packed_documents(const torch::Tensor& position_ids);

/// softmax(q k^T * scale + mask) v over heads: q [batch, heads, new, head_dim], k and v [batch,
/// kv_heads, past + new, head_dim] (kv_heads divides heads: grouped-query attention repeats them).
/// Returns [batch, new, heads * head_dim].
torch::Tensor decoder_attention(const torch::Tensor& q, torch::Tensor k, torch::Tensor v, const DecoderMask& mask,
                                double scale, double dropout, bool training);

/// Positions 0, 1, ... of each token that `attention_mask` marks (padding at 0), as transformers'
/// generate() computes them, or past..past+new-1 for every row without a mask. [batch, new].
torch::Tensor decoder_positions(const torch::Tensor& attention_mask, std::int64_t batch, std::int64_t new_tokens,
                                std::int64_t past, torch::Device device);

/// What a causal LM's forward takes first: input_ids [batch, tokens], or a batch of named tensors
/// (data::CausalLMData's) with input_ids and, when it has them, attention_mask and position_ids.
struct TokenInputs {
  TokenInputs(torch::Tensor ids) : input_ids(std::move(ids)) {}  // NOLINT: implicit, model(ids) reads as before
  TokenInputs(const data::Fields& batch)                         // NOLINT: implicit, model(batch)
      : input_ids(batch["input_ids"]),
        attention_mask(batch.contains("attention_mask") ? batch["attention_mask"] : torch::Tensor()),
        position_ids(batch.contains("position_ids") ? batch["position_ids"] : torch::Tensor()) {}
  /// `given` when defined, else the batch's own.
  static const torch::Tensor& either(const torch::Tensor& given, const torch::Tensor& own) { return given.defined() ? given : own; }

  torch::Tensor input_ids, attention_mask, position_ids;
};

/// `RMSNorm` (transformers' LlamaRMSNorm): weight * x / sqrt(mean(x^2) + eps), computed in fp32.
struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(std::int64_t size, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

/// The rotary position embedding's inverse frequencies, [head_dim / 2] fp32, computed as
/// transformers computes them: "default" (theta^(-2i/d)), "linear" (divided by factor) or "llama3"
/// (long wavelengths divided by factor, the middle band interpolated).
torch::Tensor rope_inverse_frequencies(std::int64_t head_dim, double theta, const std::string& type, double factor,
                                       double low_freq_factor, double high_freq_factor, std::int64_t original_max_positions);

/// cos and sin [batch, 1, new, head_dim] of `positions` [batch, new], in `dtype`.
std::pair<torch::Tensor, torch::Tensor> rope_cos_sin(const torch::Tensor& inverse_frequencies, const torch::Tensor& positions,
                                                     torch::ScalarType dtype);

/// x * cos + rotate_half(x) * sin (transformers' apply_rotary_pos_emb), x [batch, heads, new, head_dim].
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

namespace detail {

/// config.json's hidden_act on x: silu (swish), gelu (erf), gelu_pytorch_tanh / gelu_new (tanh),
/// quick_gelu (CLIP's x * sigmoid(1.702 x)), relu.
torch::Tensor hub_activation(const std::string& name, const torch::Tensor& x);
/// transformers' _init_weights for a decoder: 2-D weights (Linear, Embedding) normal(0, std),
/// biases zero, the rest (norms) as built.
void init_decoder_weights(torch::nn::Module& m, double std);
/// The lowest finite value of `dtype`: what additive masks put where a query may not look.
double lowest_of(torch::ScalarType dtype);

/// How a Hugging Face causal LM's file meets a dtrain module: the whole model's keys carry
/// `backbone_prefix` ("model.", "transformer.") and its head is `head` ("lm_head.weight").
struct CausalLMLayout {
  std::string backbone_prefix, head = "lm_head.weight";
  /// The head is the input embedding (tie_word_embeddings): a file's head is passed over.
  bool tied = false;
  /// Keys (without the backbone prefix) of tensors the model computes rather than loads (GPT-2's
  /// causal-mask buffers `h.N.attn.bias`, old Llamas' `rotary_emb.inv_freq`): passed over, reported.
  std::function<bool(const std::string&)> computed = {};
};

/// Loads `path` into `whole` (a causal LM whose backbone is `backbone`, or the backbone itself
/// when `whole` is null) as transformers' from_pretrained does: a backbone's file loads into the
/// LM's backbone with the head reported missing, an LM's file into a bare backbone with the head
/// reported unexpected; the layout's computed tensors and a tied head are passed over and reported
/// unexpected. Otherwise options.strict as in weights::load.
weights::LoadReport load_causal_lm(torch::nn::Module* whole, torch::nn::Module& backbone, const CausalLMLayout& layout,
                                   const std::filesystem::path& path, weights::LoadOptions options);

}  // namespace detail

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/decoder.ipp>
#endif
