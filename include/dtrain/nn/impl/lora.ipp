// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of lora.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/init.h>

#include <dtrain/checkpointer/files.hpp>
#include <dtrain/error.hpp>
#include <dtrain/nn/lora.hpp>
#include <dtrain/weights.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {

DTRAIN_INLINE double LoraConfig::scaling() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

DTRAIN_INLINE void LoraConfig::validate() const {
  if (r < 1) throw ConfigError("nn::LoraConfig: r is " + std::to_string(r) + "; the adapters' rank must be at least 1");
  if (!(alpha > 0)) throw ConfigError("nn::LoraConfig: alpha is " + std::to_string(alpha) + "; it must be positive (PEFT's default is 8)");
  if (!(dropout >= 0 && dropout < 1))
    throw ConfigError("nn::LoraConfig: dropout is " + std::to_string(dropout) + "; it must be in [0, 1)");
  if (target_pattern.empty() && target_modules.empty())
    throw ConfigError("nn::LoraConfig: no target_modules and no target_pattern; name the layers to adapt (\"q_proj\", ...)");
}

// torch's CPU bernoulli_ draws the Mersenne Twister once an element, serially: a fifth of a LoRA
// step. One draw seeds splitmix64, which gives two elements' 32-bit draws a step.
DTRAIN_INLINE torch::Tensor detail::lora_dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p <= 0) return x;
  if (!x.device().is_cpu() || x.scalar_type() != torch::kFloat) return at::dropout(x, p, training);
  std::uint64_t state;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get<at::CPUGeneratorImpl>()->random64();
  }
  auto mask = at::empty(x.sizes(), x.options().requires_grad(false));
  float* m = mask.data_ptr<float>();
  const auto n = mask.numel();
  const auto threshold = static_cast<std::uint64_t>(p * 4294967296.0);
  const float keep = static_cast<float>(1.0 / (1.0 - p));
  const auto next = [&state] {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  std::int64_t i = 0;
  for (; i + 1 < n; i += 2) {
    const auto r = next();
    m[i] = (r & 0xffffffffULL) < threshold ? 0.f : keep;
    m[i + 1] = (r >> 32) < threshold ? 0.f : keep;
  }
  if (i < n) m[i] = (next() & 0xffffffffULL) < threshold ? 0.f : keep;
  return x * mask;
}

DTRAIN_INLINE torch::Tensor LoraLayer::lora_delta(const torch::Tensor& x, bool training) const {
  // PEFT's dtypes: fp32 adapters on a half or bf16 base take the input in fp32 and give back x's dtype.
  auto in = x.scalar_type() == lora_A->weight.scalar_type() ? x : x.to(lora_A->weight.scalar_type());
  in = detail::lora_dropout(in, lora_config->dropout, training);
  const auto delta = at::linear(at::linear(in, lora_A->weight), lora_B->weight) * lora_config->scaling();
  return delta.scalar_type() == x.scalar_type() ? delta : delta.to(x.scalar_type());
}

DTRAIN_INLINE LinearImpl::LinearImpl(std::int64_t in_features, std::int64_t out_features, bool with_bias) {
  weight = register_parameter("weight", torch::empty({out_features, in_features}));
  // torch::nn::Linear's initialisation: kaiming-uniform with a = sqrt(5), the bias within 1/sqrt(in).
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (with_bias) {
    const double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
    bias = register_parameter("bias", torch::empty({out_features}).uniform_(-bound, bound));
  }
}

DTRAIN_INLINE torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  auto y = at::linear(x, weight, bias);
  return has_lora() ? y + lora_delta(x, is_training()) : y;
}

DTRAIN_INLINE void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "dtrain::nn::Linear(in_features=" << weight.size(1) << ", out_features=" << weight.size(0)
         << ", bias=" << (bias.defined() ? "true" : "false");
  if (has_lora()) stream << ", lora_r=" << lora_config->r;
  stream << ")";
}

namespace detail {
inline bool ends_with_component(const std::string& name, const std::string& target) {
  return name == target ||
         (name.size() > target.size() && name.compare(name.size() - target.size(), target.size(), target) == 0 &&
          name[name.size() - target.size() - 1] == '.');
}

inline std::string short_names(const std::vector<std::pair<std::string, LoraLayer*>>& layers) {
  std::set<std::string> seen;
  std::string out;
  for (const auto& [name, layer] : layers) {
    const auto last = name.substr(name.rfind('.') + 1);
    if (seen.insert(last).second) out += (out.empty() ? "" : ", ") + last;
  }
  return out.empty() ? "none (the model has no nn::Linear or GPT-2 Conv1D layer)" : out;
}
}  // namespace detail

DTRAIN_INLINE std::vector<std::string> add_lora(torch::nn::Module& model, const LoraConfig& config) {
  config.validate();
  const auto layers = detail::lora_layers(model);
  for (const auto& [name, layer] : layers)
    if (layer->has_lora())
      throw ConfigError("nn::add_lora: " + name + " already has a LoRA adapter; merge_lora first to stack another");

  std::optional<std::regex> pattern;
  if (!config.target_pattern.empty()) {
    try {
      pattern.emplace(config.target_pattern);
    } catch (const std::regex_error& e) {
      throw ConfigError("nn::LoraConfig: target_pattern \"" + config.target_pattern + "\" is not a regular expression (" + e.what() + ")");
    }
  }
  const auto matches = [&](const std::string& name) {
    if (pattern) return std::regex_match(name, *pattern);
    for (const auto& target : config.target_modules)
      if (detail::ends_with_component(name, target)) return true;
    return false;
  };
  // Modules without a slot that a target names are refused, not passed over.
  for (const auto& m : model.named_modules("", false))
    if (matches(m.key()) && !dynamic_cast<LoraLayer*>(m.value().get()))
      throw ConfigError("nn::add_lora: the target matches " + m.key() + ", a " + m.value()->name() +
                        ", which has no LoRA slot; LoRA adapts dtrain::nn::Linear and GPT-2's Conv1D layers (here: " +
                        detail::short_names(layers) + ")");
  std::vector<std::pair<std::string, LoraLayer*>> chosen;
  for (const auto& entry : layers)
    if (matches(entry.first)) chosen.push_back(entry);
  if (pattern && chosen.empty())
    throw ConfigError("nn::add_lora: target_pattern \"" + config.target_pattern + "\" matches no layer; the layers LoRA can adapt are named " +
                      detail::short_names(layers));
  if (!pattern)
    for (const auto& target : config.target_modules) {
      bool found = false;
      for (const auto& entry : chosen) found = found || detail::ends_with_component(entry.first, target);
      if (!found)
        throw ConfigError("nn::add_lora: the target module \"" + target + "\" matches no layer of the model; the layers LoRA can adapt are named " +
                          detail::short_names(layers) + " (LoraConfig::target_modules)");
    }

  auto recorded = config;
  recorded.base_files = config.base_model.empty() ? std::string() : base_model_files(config.base_model);
  for (auto& p : model.parameters()) p.requires_grad_(false);
  const auto shared = std::make_shared<const LoraConfig>(std::move(recorded));
  std::vector<std::string> names;
  for (const auto& [name, layer] : chosen) {
    auto& module = dynamic_cast<torch::nn::Module&>(*layer);
    const auto w = layer->weight_out_in();
    // PEFT's autocast_adapter_dtype: fp32 adapters on a half or bf16 base.
    const auto dtype = w.scalar_type() == torch::kHalf || w.scalar_type() == torch::kBFloat16 ? torch::kFloat : w.scalar_type();
    torch::nn::Linear a(torch::nn::LinearOptions(w.size(1), config.r).bias(false));  // kaiming-uniform, as PEFT
    torch::nn::Linear b(torch::nn::LinearOptions(config.r, w.size(0)).bias(false));
    a->to(w.device(), dtype);
    b->to(w.device(), dtype);
    {
      torch::NoGradGuard no_grad;
      b->weight.zero_();
    }
    layer->lora_A = module.register_module("lora_A", a);
    layer->lora_B = module.register_module("lora_B", b);
    layer->lora_config = shared;
    names.push_back(name);
  }
  return names;
}

DTRAIN_INLINE std::string base_model_files(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(dir / "config.json", ec))
    throw ConfigError("nn::LoraConfig::base_model: " + dir.string() + " holds no config.json; name the directory the base "
                      "model's weights were loaded from (a Hugging Face model directory)");
  // config.json and the weights (safetensors, torch.save files, their indexes), not the tokenizer.
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    const auto ext = entry.path().extension().string();
    if (entry.is_regular_file() && (name == "config.json" || ext == ".safetensors" || ext == ".bin" || name.ends_with(".index.json")))
      files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  if (files.size() < 2)
    throw ConfigError("nn::LoraConfig::base_model: " + dir.string() + " holds no weights file (*.safetensors or *.bin)");
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : files) {
    const auto [crc, size] = checkpointer::detail::crc32_of_file(f);
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08x", crc);
    j[f.filename().string()] = {{"bytes", size}, {"crc32", hex}};
  }
  return j.dump();
}

DTRAIN_INLINE std::vector<std::pair<std::string, torch::Tensor>> lora_parameters(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [name, layer] : detail::lora_layers(model))
    if (layer->has_lora()) {
      out.emplace_back(name + ".lora_A.weight", layer->lora_A->weight);
      out.emplace_back(name + ".lora_B.weight", layer->lora_B->weight);
    }
  return out;
}

namespace detail {
// Takes `layer`'s adapter off, folding it into the base weight when `merge`.
inline void remove_lora(LoraLayer& layer, bool merge) {
  if (merge) {
    torch::NoGradGuard no_grad;
    auto w = layer.weight_out_in();
    w.add_(at::matmul(layer.lora_B->weight, layer.lora_A->weight).to(w.scalar_type()), layer.lora_config->scaling());
  }
  auto& module = dynamic_cast<torch::nn::Module&>(layer);
  module.unregister_module("lora_A");
  module.unregister_module("lora_B");
  layer.lora_A = nullptr;
  layer.lora_B = nullptr;
  layer.lora_config.reset();
}
}  // namespace detail

DTRAIN_INLINE std::size_t merge_lora(torch::nn::Module& model) {
  std::size_t merged = 0;
  for (const auto& [name, layer] : detail::lora_layers(model))
    if (layer->has_lora()) {
      detail::remove_lora(*layer, /*merge=*/true);
      ++merged;
    }
  return merged;
}

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

DTRAIN_INLINE LoraConfig load_peft_adapter(torch::nn::Module& model, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const auto config_path = dir / "adapter_config.json";
  auto config = detail::read_lora_config(config_path);
  config.base_model.clear();  // a hub name or another machine's path: the model in memory is the base
  auto weights_path = dir / "adapter_model.safetensors";
  if (!fs::exists(weights_path) && fs::exists(dir / "adapter_model.bin")) weights_path = dir / "adapter_model.bin";
  if (!fs::exists(weights_path)) throw Error(weights_path.string() + ": missing (PEFT writes the adapter's weights there)");
  auto tensors = weights::read(weights_path);

  // A refused file leaves the model as it was: no adapter, the same parameters trainable.
  std::vector<bool> trainable;
  for (const auto& p : model.parameters()) trainable.push_back(p.requires_grad());
  const auto undo = [&](const std::string& message) -> Error {
    for (const auto& [name, layer] : detail::lora_layers(model))
      if (layer->has_lora()) detail::remove_lora(*layer, /*merge=*/false);
    auto params = model.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].requires_grad_(trainable[i]);
    return Error(message);
  };
  try {
    add_lora(model, config);
  } catch (const ConfigError& e) {
    throw ConfigError(config_path.string() + ": " + e.what());
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
