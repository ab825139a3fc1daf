// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::GPT2Model and nn::GPT2LMHeadModel: GPT-2 as Hugging Face transformers has it, with its
// checkpoints' names (`transformer.wte.weight`, `transformer.wpe.weight`,
// `transformer.h.0.ln_1.weight`, `transformer.h.0.attn.c_attn.weight`, `...attn.c_proj`,
// `...mlp.c_fc`, `...mlp.c_proj`, `transformer.ln_f.weight`; the head is the token embedding):
//
//   auto config = dtrain::nn::GPT2Config::from_pretrained(dir);
//   dtrain::nn::GPT2LMHeadModel model(config);
//   dtrain::nn::load_pretrained(*model, dir);          // the hub's bare gpt2 files load too
//   auto logits = model(input_ids, attention_mask);    // [batch, tokens, vocab_size]
//
// c_attn, c_proj and c_fc are GPT-2's Conv1D: a Linear whose weight is stored transposed ([in,
// out]) and applied as x @ W + b, kept in that layout so the files load as they are. Attention is
// nn/decoder.hpp's (fused on LibTorch 2.x); positions are learned (wpe), counted from 0 at the
// first column in forward and from each row's first token in generation (nn/generate.hpp).
// GPT2Config reads config.json (n_embd, n_layer, n_head, n_positions, n_inner, activation_function,
// the dropouts, scale_attn_weights, scale_attn_by_inverse_layer_idx); its other keys (the summary_*
// of the double-heads model, n_ctx) are kept in `extra` and written back.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
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

struct GPT2Config {
  std::int64_t vocab_size = 50257;
  std::int64_t n_positions = 1024;
  std::int64_t n_embd = 768;
  std::int64_t n_layer = 12;
  std::int64_t n_head = 12;
  /// The MLP's width (config.json's n_inner; null: 4 * n_embd).
  std::optional<std::int64_t> n_inner;
  /// "gelu_new" (tanh), "gelu", "gelu_pytorch_tanh", "relu", "silu".
  std::string activation_function = "gelu_new";
  double resid_pdrop = 0.1, embd_pdrop = 0.1, attn_pdrop = 0.1;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  bool scale_attn_weights = true, scale_attn_by_inverse_layer_idx = false;
  bool tie_word_embeddings = true;
  std::optional<std::int64_t> bos_token_id = 50256, pad_token_id;
  std::vector<std::int64_t> eos_token_id = {50256};
  nlohmann::json extra = nlohmann::json::object();

  std::int64_t inner() const { return n_inner.value_or(4 * n_embd); }

  static GPT2Config from_json(const nlohmann::json& j, const std::string& source = "GPT2Config");
  static GPT2Config from_pretrained(const std::filesystem::path& path) {
    const auto [j, file] = detail::read_hub_json(path, "config.json");
    return from_json(j, file);
  }
  nlohmann::json to_json() const;

  bool operator==(const GPT2Config&) const = default;
};

inline void to_json(nlohmann::json& j, const GPT2Config& c) { j = c.to_json(); }
inline void from_json(const nlohmann::json& j, GPT2Config& c) { c = GPT2Config::from_json(j); }

/// GPT-2's Conv1D: weight [in, out], bias [out]; forward is x @ weight + bias. Its LoRA slot is
/// PEFT's fan_in_fan_out: the adapters are [r, in] and [out, r] as for a Linear.
struct GPT2Conv1DImpl : torch::nn::Module, LoraLayer {
  GPT2Conv1DImpl(std::int64_t in, std::int64_t out);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight_out_in() const override { return weight.t(); }
  bool fan_in_fan_out() const override { return true; }
  torch::Tensor weight, bias;
};
TORCH_MODULE(GPT2Conv1D);

/// `h.N.attn`: c_attn (q, k and v at once) and c_proj.
struct GPT2AttentionImpl : torch::nn::Module {
  GPT2AttentionImpl(const GPT2Config& c, std::int64_t layer_index);
  torch::Tensor forward(const torch::Tensor& x, const DecoderMask& mask, KVCache* cache);

  GPT2Config config;
  std::int64_t layer_index;
  GPT2Conv1D c_attn{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(GPT2Attention);

/// `h.N`: ln_1, attn, ln_2, mlp (c_fc, the activation, c_proj), each half added to the residual.
struct GPT2BlockImpl : torch::nn::Module {
  GPT2BlockImpl(const GPT2Config& c, std::int64_t layer_index);
  torch::Tensor forward(const torch::Tensor& x, const DecoderMask& mask, KVCache* cache);

  GPT2Config config;
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  GPT2Attention attn{nullptr};
  GPT2Conv1D c_fc{nullptr}, c_proj{nullptr};  // mlp.c_fc, mlp.c_proj
};
TORCH_MODULE(GPT2Block);

/// transformers' GPT2Model: wte, wpe, h.0..N-1, ln_f. forward returns the last hidden state.
struct GPT2ModelImpl : torch::nn::Module {
  using Config = GPT2Config;
  explicit GPT2ModelImpl(const Config& c = {});
  /// As LlamaModel's forward: attention_mask [batch, cached + tokens], position_ids [batch, tokens].
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                        const torch::Tensor& position_ids = {}, KVCache* cache = nullptr);

  /// Activation checkpointing in training (transformers' gradient_checkpointing_enable): each
  /// block's activations are recomputed in backward instead of kept (nn/recompute.hpp), with equal
  /// outputs and gradients and a lower peak memory. Off by default; generation never uses it.
  void gradient_checkpointing_enable(bool on = true) { gradient_checkpointing = on; }

  Config config;
  bool gradient_checkpointing = false;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(GPT2Model);

/// transformers' GPT2LMHeadModel: `transformer` and the head, tied to wte (an untied config gets
/// its own `lm_head`).
struct GPT2LMHeadModelImpl : torch::nn::Module {
  using Config = GPT2Config;
  explicit GPT2LMHeadModelImpl(const Config& c = {});
  /// As LlamaForCausalLM's forward: input_ids, or a batch of them (data::CausalLMData's).
  torch::Tensor forward(const TokenInputs& inputs, const torch::Tensor& attention_mask = {},
                        const torch::Tensor& position_ids = {}, KVCache* cache = nullptr);
  torch::Tensor next_token_logits(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                  const torch::Tensor& position_ids, KVCache& cache);
  const torch::Tensor& head_weight() const { return lm_head ? lm_head->weight : transformer->wte->weight; }
  /// GPT2Model's: each block recomputed in backward.
  void gradient_checkpointing_enable(bool on = true) { transformer->gradient_checkpointing_enable(on); }

  Config config;
  GPT2Model transformer{nullptr};
  Linear lm_head{nullptr};  // null when tied (always, for the hub's GPT-2s)
};
TORCH_MODULE(GPT2LMHeadModel);

/// Loads a GPT-2's weights at `path` as transformers' from_pretrained does: an LM file
/// (`transformer.` keys) or a bare GPT2Model's (the hub's `gpt2` itself: `h.0.attn.c_attn.weight`)
/// into either model; the causal-mask buffers of old files (`h.N.attn.bias`, `h.N.attn.masked_bias`)
/// and a tied `lm_head.weight` are passed over and reported unexpected.
template <class M>
  requires std::is_base_of_v<GPT2ModelImpl, M> || std::is_base_of_v<GPT2LMHeadModelImpl, M>
weights::LoadReport load_pretrained(M& model, const std::filesystem::path& path, weights::LoadOptions options = {}) {
  const auto ends = [](const std::string& k, const std::string& tail) {
    return k.size() >= tail.size() && k.compare(k.size() - tail.size(), tail.size(), tail) == 0;
  };
  detail::CausalLMLayout layout{"transformer.", "lm_head.weight", model.config.tie_word_embeddings, [=](const std::string& k) {
                                  return k.rfind("h.", 0) == 0 && (ends(k, ".attn.bias") || ends(k, ".attn.masked_bias"));
                                }};
  if constexpr (std::is_base_of_v<GPT2LMHeadModelImpl, M>) return detail::load_causal_lm(&model, *model.transformer, layout, path, options);
  else return detail::load_causal_lm(nullptr, model, layout, path, options);
}

/// Writes `model` as a model directory that AutoModelForCausalLM.from_pretrained loads (config.json
/// with `architectures` GPT2LMHeadModel or GPT2Model, model.safetensors, `options.files`).
template <class M>
  requires std::is_base_of_v<GPT2ModelImpl, M> || std::is_base_of_v<GPT2LMHeadModelImpl, M>
void save_pretrained(const M& model, const std::filesystem::path& dir, const SavePretrainedOptions& options = {}) {
  detail::write_pretrained(model, dir, model.config.to_json(),
                           std::is_base_of_v<GPT2ModelImpl, M> ? "GPT2Model" : "GPT2LMHeadModel", options);
}

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/gpt2.ipp>
#endif
