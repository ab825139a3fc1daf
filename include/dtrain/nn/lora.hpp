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
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// PEFT's LoraConfig, the fields dtrain implements (the others must keep PEFT's defaults).
struct LoraConfig {
  std::int64_t r = 8;        ///< the adapters' rank
  double alpha = 8;          ///< lora_alpha
  double dropout = 0;        ///< lora_dropout, on the adapter's input only
  bool use_rslora = false;   ///< scaling alpha / sqrt(r) instead of alpha / r
  /// Layers by name: a layer matches an entry when its dotted name is the entry or ends with "." +
  /// the entry (PEFT's rule for a list). Each entry must match at least one layer.
  std::vector<std::string> target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  /// Or a regular expression (ECMAScript) the whole dotted name must match, PEFT's target_modules
  /// given as a string ("model\\.layers\\.[01]\\..*_proj"); when set, target_modules is not used.
  std::string target_pattern = "";

  double scaling() const;
  /// Throws ConfigError naming the field for r < 1, alpha <= 0, dropout outside [0, 1), or no targets.
  void validate() const;
};

/// The slot of a layer that LoRA can adapt. Empty until add_lora fills it.
struct LoraLayer {
  virtual ~LoraLayer() = default;
  /// The base weight as [out_features, in_features] (a view of it: GPT-2's Conv1D stores [in, out]).
  virtual torch::Tensor weight_out_in() const = 0;
  /// Whether the stored weight is [in, out] (PEFT's fan_in_fan_out, written to adapter_config.json).
  virtual bool fan_in_fan_out() const { return false; }
  bool has_lora() const { return static_cast<bool>(lora_config); }
  /// B(A(dropout(x))) * scaling, added to the base layer's output.
  torch::Tensor lora_delta(const torch::Tensor& x, bool training) const;

  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};  // registered on the layer under these names
  std::shared_ptr<const LoraConfig> lora_config;       // what add_lora was given (null: no adapter)
};

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

struct PeftAdapterOptions {
  /// adapter_config.json's base_model_name_or_path: the base's hub name or directory.
  std::string base_model_name_or_path = "";
  /// adapter_config.json's task_type ("CAUSAL_LM", "SEQ_CLS", ...; "" writes null).
  std::string task_type = "CAUSAL_LM";
};

/// Writes `model`'s adapters as a PEFT adapter directory: adapter_config.json and
/// adapter_model.safetensors with PEFT's key names, which peft.PeftModel.from_pretrained(base, dir)
/// loads. Error when the model has no adapter or the directory cannot be written.
void save_peft_adapter(const torch::nn::Module& model, const std::filesystem::path& dir, const PeftAdapterOptions& options = {});

/// Reads a PEFT LoRA adapter directory (adapter_config.json and adapter_model.safetensors, or
/// adapter_model.bin), adds its adapters to `model` (add_lora) and loads their weights. Returns its
/// config. Error naming the file and field for another PEFT method, options dtrain does not
/// implement (DoRA, biases, modules_to_save, rank or alpha patterns), a tensor whose shape is not
/// the layer's (an adapter of another base) or a missing or unexpected adapter tensor.
LoraConfig load_peft_adapter(torch::nn::Module& model, const std::filesystem::path& dir);

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/lora.ipp>
#endif
