// SPDX-License-Identifier: Apache-2.0
#pragma once
// Weights from Python: a state_dict saved by `torch.save(model.state_dict(), path)` (a pretrained
// model exported by its user) loaded into a C++ module by name.
//
//   auto report = dtrain::weights::load_python_state_dict(*model, "resnet18.pt");            // strict
//   auto report = dtrain::weights::load_python_state_dict(*model, "backbone.pt", {.strict = false});
//   for (const auto& k : report.missing) ...   // the module's names the file did not have
//
// Names are the module's named_parameters() and named_buffers() (torch::nn's registered names, as
// PyTorch's). A `module.` prefix on every key (a state_dict saved from a DistributedDataParallel
// wrapper) is removed. Shapes and dtypes must match exactly: a mismatch throws Error naming the key
// and both, in strict and non-strict mode alike (as PyTorch refuses a shape mismatch either way).

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/detail/torch_pickle.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace weights {

struct LoadOptions {
  /// Strict: every name of the module is in the file and every tensor of the file is in the
  /// module, else Error listing both sets (and nothing is copied). Non-strict: the names in both
  /// are loaded, and the report lists the others.
  bool strict = true;
};

/// What a load did not match: names of the module absent from the file, and keys of the file
/// (after the `module.` prefix was removed) absent from the module.
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
  const std::string prefix = "module.";
  const bool prefixed = !state.empty() && std::all_of(state.begin(), state.end(), [&](const auto& kv) {
    return kv.first.rfind(prefix, 0) == 0;
  });
  std::map<std::string, torch::Tensor> by_name;
  for (auto& [k, v] : state) {
    auto name = prefixed ? k.substr(prefix.size()) : k;
    if (!by_name.emplace(name, v).second) throw Error(source + ": the key \"" + k + "\" appears twice");
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
    const auto& src = it->second;
    if (src.sizes() != dst.sizes())
      throw Error(source + ": \"" + it->first + "\" has shape " + c10::str(src.sizes()) + " and the module's " +
                  name + " has shape " + c10::str(dst.sizes()) + "; was it saved from another architecture or width?");
    if (src.scalar_type() != dst.scalar_type())
      throw Error(source + ": \"" + name + "\" is " + std::string(c10::toString(src.scalar_type())) +
                  " and the module's is " + std::string(c10::toString(dst.scalar_type())) +
                  "; convert the module (module->to(dtype)) or the state_dict before loading");
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
    dst.copy_(it->second);
    ++report.loaded;
  }
  return report;
}

/// Reads the state_dict Python saved at `path` (torch.save, zip format) and loads it into `module`
/// (load_state_dict). Throws Error naming the file when it is not such a file.
inline LoadReport load_python_state_dict(torch::nn::Module& module, const std::filesystem::path& path,
                                         LoadOptions options = {}) {
  std::vector<std::string> not_tensors;
  auto state = detail::torch_pickle::read_tensor_dict(path, &not_tensors);
  auto report = load_state_dict(module, std::move(state), path.string(), options);
  report.not_tensors = std::move(not_tensors);
  return report;
}

/// The tensors of the state_dict Python saved at `path`, by key, in the file's order.
inline std::vector<std::pair<std::string, torch::Tensor>> read_python_state_dict(const std::filesystem::path& path) {
  return detail::torch_pickle::read_tensor_dict(path);
}

}  // namespace weights

DTRAIN_NAMESPACE_END
