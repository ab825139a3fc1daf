// SPDX-License-Identifier: Apache-2.0
#pragma once
// Serving a checkpoint of LoRA adapters: the model built from the checkpoint's model_config.json,
// the base's weights read from the directory the checkpoint names, the adapters added and loaded.
//
//   // trained with add_lora(*lm, {.base_model = dir, ...}): the checkpoint holds the adapters only
//   auto lm = dtrain::nn::from_lora_checkpoint<dtrain::nn::LlamaForCausalLM>(*result.best_checkpoint());
//   dtrain::nn::merge_lora(*lm);  // optional: plain weights, one matmul a layer

#include <filesystem>
#include <string>

#include <dtrain/checkpointer/files.hpp>
#include <dtrain/checkpointer/model_config.hpp>
#include <dtrain/error.hpp>
#include <dtrain/nn/lora.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// `Model` with the adapters of `checkpoint` on their base: built from model_config.json, the base
/// loaded with nn::load_pretrained from the directory adapter_config.json names, add_lora with the
/// saved config, the adapters loaded. ConfigError when the checkpoint holds no adapters, names no
/// base (trained without LoraConfig::base_model: build the base yourself, add_lora, load_model), or
/// when the base's files changed since (another base).
template <class Model>
Model from_lora_checkpoint(const checkpointer::Checkpoint& checkpoint) {
  const auto file = checkpoint.path() / checkpointer::files::adapter_config;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec))
    throw ConfigError("nn::from_lora_checkpoint: " + checkpoint.path().string() +
                      " holds no LoRA adapters (no adapter_config.json); load it with a Predictor or load_model");
  auto config = detail::read_lora_config(file);
  if (config.base_model.empty())
    throw ConfigError("nn::from_lora_checkpoint: " + file.string() + " names no base model (trained without "
                      "LoraConfig::base_model); build the base, add_lora with the same config and checkpoint.load_model(model)");
  if (!std::filesystem::is_directory(config.base_model, ec))
    throw ConfigError("nn::from_lora_checkpoint: the adapters' base model " + config.base_model +
                      " (" + file.string() + ") is not a directory here; the base's files must be where training read them");
  auto model = checkpointer::build_model<Model>(checkpoint);
  load_pretrained(*model, config.base_model);
  add_lora(*model, config);           // records the base's files as they are now
  checkpoint.load_model(model);       // which refuses them when they changed
  return model;
}

}  // namespace nn

DTRAIN_NAMESPACE_END
