// SPDX-License-Identifier: Apache-2.0
#pragma once
// The LoRA types a checkpoint needs to know (nn/lora.hpp has the functions): the config and the
// slot of a layer that LoRA adapts. Light on purpose: the checkpointer includes it.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
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
  /// The base model's directory (adapter_config.json's base_model_name_or_path): add_lora records
  /// its identity, and checkpoints of the adapters refuse to load onto another base. Empty: the
  /// checkpoints name no base and the model's own weights are trusted.
  std::string base_model = "";
  /// Set by add_lora from base_model (leave it empty): the identity, config.json's and each weight
  /// file's size and CRC-32 as JSON text (nn::base_model_files).
  std::string base_files = "";

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

namespace detail {
/// Every module of `model` with a LoRA slot, by dotted name.
template <class Module>
std::vector<std::pair<std::string, LoraLayer*>> lora_layers(Module& model) {
  std::vector<std::pair<std::string, LoraLayer*>> out;
  for (const auto& m : model.named_modules("", /*include_self=*/false))
    if (auto* layer = dynamic_cast<LoraLayer*>(m.value().get())) out.emplace_back(m.key(), layer);
  return out;
}

/// The config of `model`'s adapters, or null when it has none.
inline std::shared_ptr<const LoraConfig> lora_config_of(const torch::nn::Module& model) {
  for (const auto& [name, layer] : lora_layers(model))
    if (layer->has_lora()) return layer->lora_config;
  return nullptr;
}

/// adapter_config.json as PEFT writes it for `model`'s adapters (null when it has none): PEFT's
/// defaults for what dtrain does not implement, so that PEFT reads what dtrain trained. `base` is
/// base_model_name_or_path ("": null).
inline nlohmann::json peft_adapter_config(const torch::nn::Module& model, const std::string& task_type, const std::string& base) {
  std::shared_ptr<const LoraConfig> adapters;
  bool fan_in_fan_out = false;
  for (const auto& [name, layer] : lora_layers(model))
    if (layer->has_lora()) {
      adapters = layer->lora_config;
      fan_in_fan_out = fan_in_fan_out || layer->fan_in_fan_out();
    }
  if (!adapters) return nullptr;
  const auto& config = *adapters;
  nlohmann::json j = {{"peft_type", "LORA"},
                      {"task_type", task_type.empty() ? nlohmann::json() : nlohmann::json(task_type)},
                      {"base_model_name_or_path", base.empty() ? nlohmann::json() : nlohmann::json(base)},
                      {"r", config.r},
                      {"lora_alpha", config.alpha},
                      {"lora_dropout", config.dropout},
                      {"use_rslora", config.use_rslora},
                      {"fan_in_fan_out", fan_in_fan_out},
                      {"bias", "none"},
                      {"use_dora", false},
                      {"modules_to_save", nullptr},
                      {"init_lora_weights", true},
                      {"inference_mode", true},
                      {"rank_pattern", nlohmann::json::object()},
                      {"alpha_pattern", nlohmann::json::object()}};
  j["target_modules"] = config.target_pattern.empty() ? nlohmann::json(config.target_modules) : nlohmann::json(config.target_pattern);
  return j;
}

/// What a checkpoint of an adapted model records beside its tensors (adapter_config.json): PEFT's
/// config of the adapters and, when add_lora was given base_model, the base's identity under
/// "dtrain_base_files". "" for a model without adapters.
inline std::string adapter_checkpoint_config(const torch::nn::Module& model) {
  const auto config = lora_config_of(model);
  if (!config) return {};
  auto j = peft_adapter_config(model, "", config->base_model);
  if (!config->base_files.empty()) j["dtrain_base_files"] = nlohmann::json::parse(config->base_files);
  return j.dump(2);
}
}  // namespace detail

}  // namespace nn

DTRAIN_NAMESPACE_END
