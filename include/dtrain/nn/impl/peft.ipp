// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of peft.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <c10/util/StringUtil.h>

#include <dtrain/error.hpp>
#include <dtrain/nn/lora.hpp>
#include <dtrain/nn/peft.hpp>
#include <dtrain/weights.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {

namespace detail {
inline const char* peft_prefix() { return "base_model.model."; }
}  // namespace detail

DTRAIN_INLINE void save_peft_adapter(const torch::nn::Module& model, const std::filesystem::path& dir, const PeftAdapterOptions& options) {
  namespace fs = std::filesystem;
  const auto j = detail::peft_adapter_config(model, options.task_type, options.base_model_name_or_path);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& [name, tensor] : lora_parameters(model)) tensors.emplace_back(detail::peft_prefix() + name, tensor.detach());
  if (j.is_null()) throw ConfigError("nn::save_peft_adapter(" + dir.string() + "): the model has no LoRA adapter (nn::add_lora adds them)");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir.string() + ": cannot create the directory (" + ec.message() + ")");
  weights::save_safetensors(dir / "adapter_model.safetensors", tensors, {{"format", "pt"}});

  const auto path = dir / "adapter_config.json";
  std::ofstream out(path);
  out << j.dump(2) << '\n';
  if (!out) throw Error(path.string() + ": cannot be written");
}

DTRAIN_INLINE LoraConfig detail::read_lora_config(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw Error(file.string() + ": cannot be read (a PEFT adapter directory holds adapter_config.json)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(file.string() + ": not JSON (" + e.what() + ")");
  }
  const auto where = file.string() + ": ";
  const auto refuse_unless = [&](const char* key, auto&& is_default, const std::string& what) {
    if (j.contains(key) && !j[key].is_null() && !is_default(j[key]))
      throw ConfigError(where + key + " is " + j[key].dump() + "; " + what);
  };
  if (j.value("peft_type", std::string()) != "LORA")
    throw ConfigError(where + "peft_type is " + (j.contains("peft_type") ? j["peft_type"].dump() : std::string("missing")) +
                      "; dtrain loads LoRA adapters (\"LORA\")");
  const auto is_false = [](const nlohmann::json& v) { return v.is_boolean() && !v.get<bool>(); };
  const auto is_empty = [](const nlohmann::json& v) { return v.empty(); };
  refuse_unless("use_dora", is_false, "dtrain implements plain LoRA, not DoRA");
  refuse_unless("lora_bias", is_false, "dtrain's adapters have no bias");
  refuse_unless("bias", [](const nlohmann::json& v) { return v == "none"; }, "dtrain trains no base bias (\"none\")");
  refuse_unless("modules_to_save", is_empty, "dtrain saves no full modules beside the adapters");
  refuse_unless("rank_pattern", is_empty, "every adapter has rank r in dtrain");
  refuse_unless("alpha_pattern", is_empty, "every adapter has lora_alpha in dtrain");
  refuse_unless("layers_to_transform", is_empty, "name the layers in target_modules instead");
  refuse_unless("exclude_modules", is_empty, "name the layers in target_modules instead");
  refuse_unless("target_parameters", is_empty, "dtrain adapts layers, not parameters");

  LoraConfig config;
  try {
    config.r = j.at("r").get<std::int64_t>();
    config.alpha = j.at("lora_alpha").get<double>();
    config.dropout = j.value("lora_dropout", 0.0);
    config.use_rslora = j.value("use_rslora", false);
    const auto& targets = j.at("target_modules");
    if (targets.is_string()) config.target_pattern = targets.get<std::string>();
    else config.target_modules = targets.get<std::vector<std::string>>();
    if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string())
      config.base_model = j["base_model_name_or_path"].get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(where + "r, lora_alpha and target_modules must be there with numbers and names (" + e.what() + ")");
  }
  return config;
}

namespace detail {
// Whether two adapter configs adapt alike: what changes the adapters' shapes or what they compute.
inline bool same_adapters(const LoraConfig& a, const LoraConfig& b) {
  return a.r == b.r && a.alpha == b.alpha && a.dropout == b.dropout && a.use_rslora == b.use_rslora;
}

inline std::string describe(const LoraConfig& c) {
  return "r " + std::to_string(c.r) + ", lora_alpha " + c10::str(c.alpha) + ", lora_dropout " + c10::str(c.dropout) +
         ", use_rslora " + (c.use_rslora ? "true" : "false");
}

// The config `model`'s adapters get: the file's (or theirs, when it has some), with the base named
// by `base_model` or the one they name.
inline LoraConfig adapters_after_load(const torch::nn::Module& model, LoraConfig file_config, const std::filesystem::path& config_path,
                                      const std::filesystem::path& base_model) {
  file_config.base_model.clear();  // a hub name or another machine's path: not the base in memory
  file_config.base_files.clear();
  const auto current = lora_config_of(model);
  if (current && !same_adapters(*current, file_config))
    throw ConfigError(config_path.string() + ": its adapters have " + describe(file_config) + "; the model's have " +
                      describe(*current) + ". Load it onto a model without adapters, or add them with its config");
  auto config = current ? *current : file_config;
  if (base_model.empty()) return config;
  config.base_model = base_model.string();
  if (!current) return config;  // add_lora records the base's identity
  config.base_files = base_model_files(base_model);
  if (!current->base_files.empty() && current->base_files != config.base_files)
    throw ConfigError("nn::load_peft_adapter: the model's adapters were added on the base model " + current->base_model + ", not " +
                      base_model.string() + "; name the directory the model's weights came from");
  return config;
}
}  // namespace detail

DTRAIN_INLINE LoraConfig load_peft_adapter(torch::nn::Module& model, const std::filesystem::path& dir, const std::filesystem::path& base_model) {
  namespace fs = std::filesystem;
  const auto config_path = dir / "adapter_config.json";
  const auto config = detail::adapters_after_load(model, detail::read_lora_config(config_path), config_path, base_model);
  auto weights_path = dir / "adapter_model.safetensors";
  if (!fs::exists(weights_path) && fs::exists(dir / "adapter_model.bin")) weights_path = dir / "adapter_model.bin";
  if (!fs::exists(weights_path)) throw Error(weights_path.string() + ": missing (PEFT writes the adapter's weights there)");
  auto tensors = weights::read(weights_path);

  // A refused file leaves the model as it was: its adapters (or none) with their values, the same
  // parameters trainable.
  const bool added = !detail::lora_config_of(model);
  std::vector<bool> trainable;
  for (const auto& p : model.parameters()) trainable.push_back(p.requires_grad());
  std::map<std::string, torch::Tensor> before;
  if (!added)
    for (auto& [name, tensor] : lora_parameters(model)) before.emplace(name, tensor.detach().clone());
  std::vector<std::pair<LoraLayer*, std::shared_ptr<const LoraConfig>>> configs;
  for (const auto& [name, layer] : detail::lora_layers(model))
    if (layer->has_lora()) configs.emplace_back(layer, layer->lora_config);
  const auto undo = [&](const std::string& message) -> Error {
    torch::NoGradGuard no_grad;
    if (added) {
      for (const auto& [name, layer] : detail::lora_layers(model))
        if (layer->has_lora()) detail::remove_lora(*layer, /*merge=*/false);
    } else {
      for (auto& [name, tensor] : lora_parameters(model)) tensor.copy_(before.at(name));
      for (auto& [layer, previous] : configs) layer->lora_config = previous;
    }
    auto params = model.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].requires_grad_(trainable[i]);
    return Error(message);
  };
  if (added) {
    try {
      add_lora(model, config);
    } catch (const ConfigError& e) {
      throw ConfigError(config_path.string() + ": " + e.what());
    }
  } else {
    const auto shared = std::make_shared<const LoraConfig>(config);  // the base now named
    for (auto& [layer, previous] : configs) layer->lora_config = shared;
  }
  std::map<std::string, torch::Tensor> ours;
  for (auto& [name, tensor] : lora_parameters(model)) ours.emplace(name, tensor);
  std::set<std::string> loaded;
  torch::NoGradGuard no_grad;
  for (auto& [key, tensor] : tensors) {
    // PEFT writes "base_model.model." + name; the adapter name ("default") is dropped on save.
    auto name = key.rfind(detail::peft_prefix(), 0) == 0 ? key.substr(std::string(detail::peft_prefix()).size()) : key;
    if (const auto at = name.find(".default."); at != std::string::npos) name.erase(at, 8);
    const auto it = ours.find(name);
    if (it == ours.end())
      throw undo(weights_path.string() + ": \"" + key + "\" is no adapter of this model (an adapter of another base?)");
    if (!it->second.sizes().equals(tensor.sizes()))
      throw undo(weights_path.string() + ": \"" + key + "\" is " + c10::str(tensor.sizes()) + " but the layer's adapter is " +
                  c10::str(it->second.sizes()) + " (an adapter of another base, or another r)");
    it->second.copy_(tensor);
    loaded.insert(name);
  }
  for (const auto& [name, tensor] : ours)
    if (!loaded.count(name))
      throw undo(weights_path.string() + ": holds no \"" + name + "\" that adapter_config.json's targets give this model");
  return config;
}

}  // namespace nn
DTRAIN_NAMESPACE_END
