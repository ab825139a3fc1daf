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
DTRAIN_INLINE void remove_lora(LoraLayer& layer, bool merge) {
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

}  // namespace nn
DTRAIN_NAMESPACE_END
