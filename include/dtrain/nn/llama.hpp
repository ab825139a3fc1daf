// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::LlamaModel and nn::LlamaForCausalLM: the Llama-family decoder of Hugging Face transformers
// (Llama 2 and 3, Mistral, Qwen2: nn/llama_config.hpp), with its checkpoints' parameter names
// (`model.embed_tokens.weight`, `model.layers.0.self_attn.q_proj.weight`,
// `model.layers.0.mlp.gate_proj.weight`, `model.layers.0.input_layernorm.weight`,
// `model.norm.weight`, `lm_head.weight`), so a model directory loads by name:
//
//   auto config = dtrain::nn::LlamaConfig::from_pretrained(dir);     // dir/config.json
//   dtrain::nn::LlamaForCausalLM model(config);
//   dtrain::nn::load_pretrained(*model, dir);   // safetensors, sharded or not; bf16 and fp16 files load into fp32
//   auto logits = model(input_ids, attention_mask);              // [batch, tokens, vocab_size]
//   auto loss = dtrain::nn::causal_lm_loss(logits, labels);      // transformers' labels= loss
//
// The graph: token embedding; per layer RMSNorm, attention with the rotary embedding on q and k
// and grouped-query heads (num_key_value_heads), the residual, RMSNorm, SwiGLU (down(silu(gate(x))
// * up(x))), the residual; a final RMSNorm and the head (the embedding itself when
// tie_word_embeddings: then there is no `lm_head.weight`, as transformers saves it). Attention is
// nn/decoder.hpp's: ATen's fused scaled-dot-product attention on LibTorch 2.x, causal, hiding the
// padding of `attention_mask` and, for Mistral and Qwen2's sliding layers, tokens beyond the
// window. Positions count from 0 at the first column, padding or not (transformers' forward);
// generation (nn/generate.hpp) counts them from each row's first token. With the same weights and
// inputs the logits equal transformers' within 1e-5 in fp32 (tests/unit/decoder_test.cpp).

#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/nn/decoder.hpp>
#include <dtrain/nn/llama_config.hpp>
#include <dtrain/nn/lora.hpp>
#include <dtrain/nn/pretrained.hpp>
#include <dtrain/nn/recompute.hpp>
#include <dtrain/weights.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// `model.layers.N.self_attn`: q_proj, k_proj, v_proj (num_key_value_heads' width), o_proj.
struct LlamaAttentionImpl : torch::nn::Module {
  LlamaAttentionImpl(const LlamaConfig& c, std::int64_t layer_index);
  /// x [batch, new, hidden] -> [batch, new, hidden]; `cache` (may be null) gets the new keys and values.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, const DecoderMask& mask,
                        KVCache* cache);

  LlamaConfig config;
  std::int64_t layer_index;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};  // nn::Linear: LoRA can adapt them
};
TORCH_MODULE(LlamaAttention);

/// `model.layers.N.mlp`: down_proj(act(gate_proj(x)) * up_proj(x)).
struct LlamaMLPImpl : torch::nn::Module {
  explicit LlamaMLPImpl(const LlamaConfig& c);
  torch::Tensor forward(const torch::Tensor& x);

  std::string act;
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

/// `model.layers.N`: pre-norm attention and MLP, each added to the residual stream.
struct LlamaDecoderLayerImpl : torch::nn::Module {
  LlamaDecoderLayerImpl(const LlamaConfig& c, std::int64_t layer_index);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, const DecoderMask& mask,
                        KVCache* cache);

  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

/// transformers' LlamaModel: embed_tokens, layers.0..N-1, norm. forward returns the last hidden
/// state [batch, tokens, hidden].
struct LlamaModelImpl : torch::nn::Module {
  using Config = LlamaConfig;
  explicit LlamaModelImpl(const Config& c = {});

  /// input_ids [batch, tokens] (int64); attention_mask [batch, cached + tokens] of 1 and 0 (padding)
  /// or undefined; position_ids [batch, tokens] or undefined (cached .. cached + tokens - 1);
  /// `cache` (may be null) holds the earlier tokens' keys and values and gets these tokens'.
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                        const torch::Tensor& position_ids = {}, KVCache* cache = nullptr);

  /// Activation checkpointing in training (transformers' gradient_checkpointing_enable): each
  /// layer's activations are recomputed in backward instead of kept (nn/recompute.hpp), with equal
  /// outputs and gradients and a lower peak memory. Off by default; generation never uses it.
  void gradient_checkpointing_enable(bool on = true) { gradient_checkpointing = on; }

  Config config;
  bool gradient_checkpointing = false;
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torch::Tensor inverse_frequencies;  // the rotary embedding's: computed, not a parameter (nor saved)
};
TORCH_MODULE(LlamaModel);

/// transformers' LlamaForCausalLM (MistralForCausalLM, Qwen2ForCausalLM): `model` and `lm_head`
/// (Linear hidden -> vocab_size without bias; the embedding when tie_word_embeddings).
struct LlamaForCausalLMImpl : torch::nn::Module {
  using Config = LlamaConfig;
  explicit LlamaForCausalLMImpl(const Config& c = {});

  /// The logits [batch, tokens, vocab_size] of the next token after each position. `inputs` is
  /// input_ids, or a batch of them (data::CausalLMData's) whose attention_mask and position_ids
  /// are used unless given here.
  torch::Tensor forward(const TokenInputs& inputs, const torch::Tensor& attention_mask = {},
                        const torch::Tensor& position_ids = {}, KVCache* cache = nullptr);
  /// The next token's logits [batch, vocab_size] after `input_ids` (generation's step: the head on
  /// the last position only).
  torch::Tensor next_token_logits(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                  const torch::Tensor& position_ids, KVCache& cache);
  /// The output embedding's weight [vocab_size, hidden]: lm_head's, or embed_tokens' when tied.
  const torch::Tensor& head_weight() const { return lm_head ? lm_head->weight : model->embed_tokens->weight; }
  /// LlamaModel's: each layer recomputed in backward.
  void gradient_checkpointing_enable(bool on = true) { model->gradient_checkpointing_enable(on); }

  Config config;
  LlamaModel model{nullptr};
  Linear lm_head{nullptr};  // null when config.tie_word_embeddings
};
TORCH_MODULE(LlamaForCausalLM);

/// Loads a Hugging Face Llama-family model's weights at `path` (a model directory, a
/// .safetensors file, a sharded index or a torch.save state_dict: weights::read) as transformers'
/// from_pretrained does: a bare LlamaModel's file (no `model.` prefix) loads into a
/// LlamaForCausalLM's `model` with `lm_head.weight` reported missing (untied) and keeping its
/// initialisation; a causal LM's file loads into a bare LlamaModel through `model.` with the head
/// reported unexpected; a tied model's `lm_head.weight` and old files' `rotary_emb.inv_freq` are
/// passed over and reported unexpected. Otherwise `options.strict` holds as in weights::load.
template <class M>
  requires std::is_base_of_v<LlamaModelImpl, M> || std::is_base_of_v<LlamaForCausalLMImpl, M>
weights::LoadReport load_pretrained(M& model, const std::filesystem::path& path, weights::LoadOptions options = {}) {
  detail::CausalLMLayout layout{"model.", "lm_head.weight", model.config.tie_word_embeddings,
                                [](const std::string& k) { return k.find("rotary_emb.inv_freq") != std::string::npos; }};
  if constexpr (std::is_base_of_v<LlamaForCausalLMImpl, M>) return detail::load_causal_lm(&model, *model.model, layout, path, options);
  else return detail::load_causal_lm(nullptr, model, layout, path, options);
}

/// Writes `model` to `dir` as a Hugging Face model directory that transformers'
/// AutoModelForCausalLM.from_pretrained loads with no missing or unexpected key: config.json
/// (`architectures` LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM by model_type; the
/// dtype), model.safetensors and `options.files` (a tokenizer.json) beside them.
template <class M>
  requires std::is_base_of_v<LlamaModelImpl, M> || std::is_base_of_v<LlamaForCausalLMImpl, M>
void save_pretrained(const M& model, const std::filesystem::path& dir, const SavePretrainedOptions& options = {}) {
  const auto architecture = std::is_base_of_v<LlamaModelImpl, M>
                                ? model.config.causal_lm_architecture().substr(0, model.config.causal_lm_architecture().find("For")) + "Model"
                                : model.config.causal_lm_architecture();
  detail::write_pretrained(model, dir, model.config.to_json(), architecture, options);
}

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/llama.ipp>
#endif
