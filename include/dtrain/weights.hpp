// SPDX-License-Identifier: Apache-2.0
#pragma once
// Pretrained weights loaded into a C++ module by name: a safetensors file, a sharded safetensors
// checkpoint, a Hugging Face model directory, or a state_dict saved by Python's
// `torch.save(model.state_dict(), path)`.
//
//   auto report = dtrain::weights::load(*model, "model.safetensors");                       // strict
//   auto report = dtrain::weights::load(*model, hf_dir, {.strict = false, .prefix = "bert."});
//   for (const auto& k : report.missing) ...   // the module's names the file did not have
//
// What `path` is decides how it is read (read()): a directory is a Hugging Face model directory
// (model.safetensors, else model.safetensors.index.json, else pytorch_model.bin inside); a file
// ending in .safetensors is safetensors, one ending in .json a sharded index; a zip file (or one
// ending in .pt, .pth, .bin) a torch.save pickle; any other file is read as safetensors.
//
// Names are the module's named_parameters() and named_buffers() (torch::nn's registered names, as
// PyTorch's). Prefixes (LoadOptions::prefix): by default a `module.` prefix on every key (a
// state_dict saved from a DistributedDataParallel wrapper) is removed. A named prefix ("bert.",
// "vit.") is removed from the keys that have it, to load the backbone of a task checkpoint into the
// bare model; the keys without it (the task's head) are unexpected, so such a load is non-strict, or
// strict only when every key has the prefix. A named prefix no key has is an Error.
//
// Shapes must match: a mismatch throws Error naming the key and both shapes, in strict and
// non-strict mode alike (as PyTorch refuses a shape mismatch either way). Floating-point tensors
// are converted to the parameter's floating-point dtype as PyTorch's load_state_dict does (copy_:
// an fp16 or bf16 checkpoint loads into an fp32 model; an fp64 one is rounded); any other dtype
// mismatch (an integer tensor for a float parameter) throws Error naming the key and both dtypes.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/detail/torch_pickle.hpp>
#include <dtrain/error.hpp>
#include <dtrain/weights/safetensors.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace weights {

struct LoadOptions {
  /// Strict: every name of the module is in the file and every tensor of the file is in the
  /// module, else Error listing both sets (and nothing is copied). Non-strict: the names in both
  /// are loaded, and the report lists the others.
  bool strict = true;
  /// Removed from the file's keys before they are matched: "" removes `module.` when every key has
  /// it; a named prefix ("bert.") is removed from the keys that have it (see the header's comment).
  std::string prefix = "";
};

/// What a load did not match: names of the module absent from the file, and keys of the file
/// (after the prefix was removed) absent from the module.
struct LoadReport {
  std::vector<std::string> missing, unexpected;
  /// Keys of the file whose value is not a tensor (an `_extra_state`, say): never loaded.
  std::vector<std::string> not_tensors;
  std::size_t loaded = 0;
  bool complete() const { return missing.empty() && unexpected.empty(); }
};

/// The names in `names` as "a", "b", ... (at most `limit`, then how many more).
inline std::string list_names(const std::vector<std::string>& names, std::size_t limit = 20) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < limit; ++i) out += (i ? ", \"" : "\"") + names[i] + "\"";
  if (names.size() > limit) out += " and " + std::to_string(names.size() - limit) + " more";
  return out.empty() ? "none" : out;
}

/// Copies `state` (name -> tensor, as read from a state_dict) into `module`'s parameters and
/// buffers by name; `source` names the state in errors. See the header's comment for the rules.
inline LoadReport load_state_dict(torch::nn::Module& module, std::vector<std::pair<std::string, torch::Tensor>> state,
                                  const std::string& source, LoadOptions options = {}) {
  const bool named = !options.prefix.empty();
  const std::string prefix = named ? options.prefix : "module.";
  const auto has_prefix = [&](const auto& kv) { return kv.first.rfind(prefix, 0) == 0; };
  const bool strip = named ? std::any_of(state.begin(), state.end(), has_prefix)
                           : !state.empty() && std::all_of(state.begin(), state.end(), has_prefix);
  if (named && !strip)
    throw Error(source + ": no key starts with the prefix \"" + prefix + "\" (LoadOptions::prefix); its keys are " +
                list_names([&] {
                  std::vector<std::string> keys;
                  for (const auto& kv : state) keys.push_back(kv.first);
                  return keys;
                }(), 5));
  std::map<std::string, std::pair<std::string, torch::Tensor>> by_name;  // module's name -> the file's key, tensor
  for (auto& [k, v] : state) {
    auto name = strip && k.rfind(prefix, 0) == 0 ? k.substr(prefix.size()) : k;
    if (!by_name.emplace(name, std::pair(k, v)).second) throw Error(source + ": the key \"" + k + "\" appears twice");
  }
  std::vector<std::pair<std::string, torch::Tensor>> targets;
  for (auto& p : module.named_parameters(true)) targets.emplace_back(p.key(), p.value());
  for (auto& b : module.named_buffers(true)) targets.emplace_back(b.key(), b.value());

  LoadReport report;
  std::map<std::string, bool> known;
  for (const auto& [name, dst] : targets) {
    known[name] = true;
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      report.missing.push_back(name);
      continue;
    }
    const auto& [key, src] = it->second;
    if (src.sizes() != dst.sizes())
      throw Error(source + ": \"" + key + "\" has shape " + c10::str(src.sizes()) + " and the module's " +
                  name + " has shape " + c10::str(dst.sizes()) + "; was it saved from another architecture or width?");
    if (src.scalar_type() != dst.scalar_type() &&
        !(c10::isFloatingType(src.scalar_type()) && c10::isFloatingType(dst.scalar_type())))
      throw Error(source + ": \"" + key + "\" is " + std::string(c10::toString(src.scalar_type())) +
                  " and the module's is " + std::string(c10::toString(dst.scalar_type())) +
                  "; only floating-point tensors are converted: convert the module (module->to(dtype)) or "
                  "the file before loading");
  }
  for (const auto& [name, t] : by_name)
    if (!known.count(name)) report.unexpected.push_back(name);
  if (options.strict && !report.complete())
    throw Error(source + " does not match the module (strict load): missing from the file " +
                list_names(report.missing) + "; unexpected in the file " + list_names(report.unexpected) +
                ". Load with {.strict = false} to take the names both have");
  torch::NoGradGuard no_grad;
  for (auto& [name, dst] : targets) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) continue;
    dst.copy_(it->second.second);
    ++report.loaded;
  }
  return report;
}

/// Reads the state_dict Python saved at `path` (torch.save, zip format) and loads it into `module`
/// (load_state_dict). Throws Error naming the file when it is not such a file.
inline LoadReport load_python_state_dict(torch::nn::Module& module, const std::filesystem::path& path,
                                         LoadOptions options = {}) {
  std::vector<std::string> not_tensors;
  auto state = dtrain::detail::torch_pickle::read_tensor_dict(path, &not_tensors);
  auto report = load_state_dict(module, std::move(state), path.string(), options);
  report.not_tensors = std::move(not_tensors);
  return report;
}

/// The tensors of the state_dict Python saved at `path`, by key, in the file's order.
inline std::vector<std::pair<std::string, torch::Tensor>> read_python_state_dict(const std::filesystem::path& path) {
  return dtrain::detail::torch_pickle::read_tensor_dict(path);
}

namespace detail {

/// How read() takes `path`, with the file it reads (a directory's model file).
enum class WeightsFormat { safetensors, sharded_index, torch_pickle };

inline std::pair<WeightsFormat, std::filesystem::path> weights_format(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& [name, format] : {std::pair{"model.safetensors", WeightsFormat::safetensors},
                                       std::pair{"model.safetensors.index.json", WeightsFormat::sharded_index},
                                       std::pair{"pytorch_model.bin", WeightsFormat::torch_pickle}})
      if (fs::is_regular_file(path / name, ec)) return {format, path / name};
    throw Error(path.string() + ": a directory without model.safetensors, model.safetensors.index.json or "
                "pytorch_model.bin; is it a Hugging Face model directory (save_pretrained's output)?");
  }
  if (!fs::exists(path, ec)) throw Error(path.string() + ": no such file or directory");
  const auto ext = path.extension().string();
  if (ext == ".safetensors") return {WeightsFormat::safetensors, path};
  if (ext == ".json") return {WeightsFormat::sharded_index, path};
  char magic[4] = {};
  std::ifstream(path, std::ios::binary).read(magic, 4);
  if (std::string_view(magic, 4) == std::string_view("PK\x03\x04", 4) || ext == ".pt" || ext == ".pth" || ext == ".bin")
    return {WeightsFormat::torch_pickle, path};
  return {WeightsFormat::safetensors, path};
}

}  // namespace detail

/// The tensors at `path`, by key: a safetensors file, a sharded index, a Hugging Face model
/// directory or a torch.save state_dict (see the header's comment). `not_tensors`, when given,
/// receives a pickle's keys whose values are not tensors.
inline std::vector<std::pair<std::string, torch::Tensor>> read(const std::filesystem::path& path,
                                                               std::vector<std::string>* not_tensors = nullptr) {
  const auto [format, file] = detail::weights_format(path);
  switch (format) {
    case detail::WeightsFormat::safetensors: return read_safetensors(file);
    case detail::WeightsFormat::sharded_index: return read_sharded_safetensors(file);
    case detail::WeightsFormat::torch_pickle: break;
  }
  return dtrain::detail::torch_pickle::read_tensor_dict(file, not_tensors);
}

/// Reads the weights at `path` (read()) and loads them into `module` (load_state_dict); errors
/// name the file read.
inline LoadReport load(torch::nn::Module& module, const std::filesystem::path& path, LoadOptions options = {}) {
  std::vector<std::string> not_tensors;
  auto state = read(path, &not_tensors);
  auto report = load_state_dict(module, std::move(state), detail::weights_format(path).second.string(), options);
  report.not_tensors = std::move(not_tensors);
  return report;
}

}  // namespace weights

DTRAIN_NAMESPACE_END
