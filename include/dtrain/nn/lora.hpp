// SPDX-License-Identifier: Apache-2.0
#pragma once
// LoRA (Hu et al., "Low-Rank Adaptation of Large Language Models") as PEFT computes and saves it:
// a layer y = W x + b gets y = W x + b + B(A(dropout(x))) * scaling, A [r, in] and B [out, r]
// trained, W frozen; scaling = alpha / r (alpha / sqrt(r) with use_rslora). A starts as PEFT's
// (kaiming-uniform) and B at zero, so an adapted model computes what its base computed until it
// trains.
//
//   dtrain::nn::LlamaForCausalLM model(dtrain::nn::LlamaConfig::from_pretrained(dir));
//   dtrain::nn::load_pretrained(model, dir);                  // the base first
//   dtrain::nn::add_lora(*model, {.r = 16, .alpha = 32});     // q/k/v/o and gate/up/down by default
//   ... train: ctx.parameters(model) is the adapters alone, and only their gradients are all-reduced
//   dtrain::nn::save_peft_adapter(*model, "adapter");         // peft.PeftModel.from_pretrained(base, "adapter")
//   dtrain::nn::merge_lora(*model);                           // W += B A * scaling: a plain model again
//
// The layers LoRA adapts are those with a LoraLayer slot: nn::Linear (the decoder families'
// projections and heads) and GPT-2's Conv1D (PEFT's fan_in_fan_out). Adapter parameters sit on
// their layer as `lora_A.weight` and `lora_B.weight`, so the names in a state_dict and in PEFT's
// adapter_model.safetensors ("base_model.model." + name) are the same.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <dtrain/nn/lora_layer.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// torch::nn::Linear's parameters (`weight` [out, in], `bias` [out] or none), initialisation and
/// arithmetic, with a LoRA slot: the decoder families' projections are these.
struct LinearImpl : torch::nn::Module, LoraLayer {
  LinearImpl(std::int64_t in_features, std::int64_t out_features, bool with_bias = true);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight_out_in() const override { return weight; }
  void pretty_print(std::ostream& stream) const override;

  torch::Tensor weight, bias;  // bias undefined without one
};
TORCH_MODULE(Linear);

/// Adds an adapter to each layer `config` names and freezes every other parameter of `model`
/// (requires_grad false: no gradient, no optimizer state, nothing all-reduced). The adapters take
/// the device and dtype of their layer's weight. Returns the adapted layers' dotted names.
/// ConfigError when a target matches no layer (listing the layers that could be adapted), when it
/// matches a module without a LoRA slot (a torch::nn::Linear, a container), or when the model
/// already has adapters.
std::vector<std::string> add_lora(torch::nn::Module& model, const LoraConfig& config = {});

/// The adapters' parameters with their dotted names (`...q_proj.lora_A.weight`), in model order.
std::vector<std::pair<std::string, torch::Tensor>> lora_parameters(const torch::nn::Module& model);

/// Folds every adapter into its base weight (W += B A * scaling, in W's dtype) and removes it: the
/// model is the plain architecture again, for save_pretrained or serving. The base parameters stay
/// frozen. Returns how many layers were merged.
std::size_t merge_lora(torch::nn::Module& model);

/// The identity add_lora records for LoraConfig::base_model: config.json's and each weight file's
/// (*.safetensors, *.bin, their index) size and CRC-32, as JSON text. ConfigError when `dir` holds
/// no config.json or no weights file.
std::string base_model_files(const std::filesystem::path& dir);

namespace detail {
/// Takes `layer`'s adapter off, folding it into the base weight when `merge`.
void remove_lora(LoraLayer& layer, bool merge);
/// LoRA's dropout: `x` with each element zeroed with probability p and the rest scaled by
/// 1 / (1 - p), in training. For a CPU float tensor the mask comes from one draw of the default
/// CPU generator (so the same generator state gives the same mask, as recomputation needs);
/// otherwise it is at::dropout.
torch::Tensor lora_dropout(const torch::Tensor& x, double p, bool training);
}  // namespace detail

}  // namespace nn

DTRAIN_NAMESPACE_END

// PEFT's adapter directories (save_peft_adapter, load_peft_adapter), after the declarations their
// bodies use.
#include <dtrain/nn/peft.hpp>

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/lora.ipp>
#endif
