// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of weights.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/weights.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace weights {

DTRAIN_INLINE std::string list_names(const std::vector<std::string>& names, std::size_t limit) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < limit; ++i) out += (i ? ", \"" : "\"") + names[i] + "\"";
  if (names.size() > limit) out += " and " + std::to_string(names.size() - limit) + " more";
  return out.empty() ? "none" : out;
}

DTRAIN_INLINE LoadReport load_state_dict(torch::nn::Module& module, std::vector<std::pair<std::string, torch::Tensor>> state,
                                         const std::string& source, LoadOptions options) {
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
  const auto mismatch = [&] {
    return "missing from the file " + list_names(report.missing) + "; unexpected in the file " +
           list_names(report.unexpected) + ". ";
  };
  const std::size_t matching = targets.size() - report.missing.size();
  if (matching == 0 && !targets.empty())  // a non-strict load would load nothing, silently
    throw Error(source + ": no tensor of the file has a name of the module (0 of " + std::to_string(by_name.size()) +
                " would load): " + mismatch() +
                detail::prefix_hint(report.missing, report.unexpected, "Check that it is this model's file"));
  if (options.strict && !report.complete())
    throw Error(source + " does not match the module (strict load): " + mismatch() +
                detail::prefix_hint(report.missing, report.unexpected,
                                    "Load with {.strict = false} to take the " + std::to_string(matching) +
                                        " names both have"));
  torch::NoGradGuard no_grad;
  for (auto& [name, dst] : targets) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) continue;
    dst.copy_(it->second.second);
    ++report.loaded;
  }
  return report;
}

DTRAIN_INLINE LoadReport load_python_state_dict(torch::nn::Module& module, const std::filesystem::path& path,
                                                LoadOptions options) {
  std::vector<std::string> not_tensors;
  auto state = dtrain::detail::torch_pickle::read_tensor_dict(path, &not_tensors);
  auto report = load_state_dict(module, std::move(state), path.string(), options);
  report.not_tensors = std::move(not_tensors);
  return report;
}

namespace detail {

DTRAIN_INLINE std::string prefix_hint(const std::vector<std::string>& missing, const std::vector<std::string>& unexpected,
                                      const std::string& otherwise) {
  // The prefix that turns most unexpected keys into missing names (the module's names are longer:
  // a bare model's file into a task model), or most missing names into unexpected keys (a task
  // model's file into the bare model).
  std::map<std::string, std::size_t> module_longer, file_longer;
  std::vector<std::string> sorted_missing = missing, sorted_unexpected = unexpected;
  std::sort(sorted_missing.begin(), sorted_missing.end());
  std::sort(sorted_unexpected.begin(), sorted_unexpected.end());
  // Each name of `longer` whose tail after a dot is a name of `shorter` counts for its head.
  const auto count = [](const std::vector<std::string>& longer, const std::vector<std::string>& shorter, auto& tally) {
    for (const auto& name : longer)
      for (auto dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1))
        if (std::binary_search(shorter.begin(), shorter.end(), name.substr(dot + 1))) ++tally[name.substr(0, dot + 1)];
  };
  count(missing, sorted_unexpected, module_longer);
  count(unexpected, sorted_missing, file_longer);
  const auto best = [](const std::map<std::string, std::size_t>& tally) {
    return std::max_element(tally.begin(), tally.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  };
  if (const auto f = best(file_longer); f != file_longer.end() && f->second * 2 >= unexpected.size())
    return "The file's keys are the module's names under \"" + f->first + "\" (" + std::to_string(f->second) +
           " of them): load with {.prefix = \"" + f->first + "\"} (or nn::load_pretrained, which knows the hub's "
           "layouts)";
  if (const auto m = best(module_longer); m != module_longer.end() && m->second * 2 >= unexpected.size())
    return "The module's names are the file's keys under \"" + m->first + "\" (" + std::to_string(m->second) +
           " of them): load the file into that submodule (model->" + m->first.substr(0, m->first.size() - 1) +
           "), or use nn::load_pretrained, which knows the hub's layouts";
  return otherwise;
}

DTRAIN_INLINE std::pair<WeightsFormat, std::filesystem::path> weights_format(const std::filesystem::path& path) {
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

DTRAIN_INLINE std::vector<std::pair<std::string, torch::Tensor>> read(const std::filesystem::path& path,
                                                                      std::vector<std::string>* not_tensors) {
  const auto [format, file] = detail::weights_format(path);
  switch (format) {
    case detail::WeightsFormat::safetensors: return read_safetensors(file);
    case detail::WeightsFormat::sharded_index: return read_sharded_safetensors(file);
    case detail::WeightsFormat::torch_pickle: break;
  }
  return dtrain::detail::torch_pickle::read_tensor_dict(file, not_tensors);
}

DTRAIN_INLINE LoadReport load(torch::nn::Module& module, const std::filesystem::path& path, LoadOptions options) {
  std::vector<std::string> not_tensors;
  auto state = read(path, &not_tensors);
  auto report = load_state_dict(module, std::move(state), detail::weights_format(path).second.string(), options);
  report.not_tensors = std::move(not_tensors);
  return report;
}
}  // namespace weights
DTRAIN_NAMESPACE_END
