// SPDX-License-Identifier: Apache-2.0
#pragma once
// LoRA adapters as PEFT's directories hold them: adapter_config.json and
// adapter_model.safetensors, with PEFT's key names ("base_model.model." + the parameter's name).
//
//   dtrain::nn::save_peft_adapter(*model, "adapter", {.base_model_name_or_path = base});
//   // later, or in Python: peft.PeftModel.from_pretrained(base_model, "adapter")
//   dtrain::nn::load_peft_adapter(*model, "adapter", base);  // `model` holds base's weights
//
// Given the base's directory, load_peft_adapter records its identity as add_lora does for
// LoraConfig::base_model: the adapters' checkpoints then refuse another base, and
// nn::from_lora_checkpoint serves them on theirs.

#include <filesystem>
#include <string>

#include <torch/nn/module.h>

#include <dtrain/nn/lora_layer.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {

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
/// adapter_model.bin) into `model` and returns the config its adapters now have:
/// - a model without adapters gets them (add_lora with the file's config) and their weights;
/// - a model with adapters of the same r, lora_alpha, lora_dropout and use_rslora (add_lora'd
///   already, for instance with LoraConfig::base_model) gets their values replaced.
/// `base_model` is the directory `model`'s base weights came from (a Hugging Face model
/// directory): its identity is recorded as add_lora records LoraConfig::base_model, so checkpoints
/// of the adapters refuse another base and nn::from_lora_checkpoint serves them. Empty: the model's
/// adapters keep the base they name (none, for a model without adapters). adapter_config.json's
/// own base_model_name_or_path is a hub name or another machine's path, and is not used.
/// Errors name the file and field for another PEFT method, options dtrain does not implement
/// (DoRA, biases, modules_to_save, rank or alpha patterns), a config other than the model's
/// adapters', a base other than theirs, a tensor whose shape is not the layer's (an adapter of
/// another base) or a missing or unexpected adapter tensor; a refused file leaves the model as it
/// was.
LoraConfig load_peft_adapter(torch::nn::Module& model, const std::filesystem::path& dir,
                             const std::filesystem::path& base_model = {});

namespace detail {
/// The LoraConfig of a PEFT adapter_config.json (a PEFT directory's, or a checkpoint's), with its
/// base_model_name_or_path as base_model. Error naming the file and the field for another PEFT
/// method or an option dtrain does not implement.
LoraConfig read_lora_config(const std::filesystem::path& file);
}  // namespace detail

}  // namespace nn
DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/peft.ipp>
#endif
