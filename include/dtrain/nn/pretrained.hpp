// SPDX-License-Identifier: Apache-2.0
#pragma once
// What every Hugging Face model family here (nn/bert.hpp, nn/vit.hpp) shares about the way back:
// a directory of config.json + model.safetensors (+ files copied beside them) that transformers'
// from_pretrained loads (reading config.json is nn/hub_config.hpp). Each family's header adds its own nn::load_pretrained and
// nn::save_pretrained overloads for its modules; the handle forms (nn::BertModel, nn::ViTModel,
// ...) below forward to them.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/weights.hpp>
#include <dtrain/weights/safetensors.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

struct SavePretrainedOptions {
  /// Files copied into the directory by their names (a tokenizer's files, preprocessor_config.json).
  /// config.json and model.safetensors are refused: save_pretrained writes them.
  std::vector<std::filesystem::path> files = {};
};

namespace detail {

/// Writes `module`'s parameters and buffers as dir/model.safetensors ({"format": "pt"}), `config`
/// as dir/config.json with `architectures` = {architecture} and the weights' dtype, and copies
/// options.files beside them. Error naming the path when something cannot be written or copied,
/// and for a parameter without values (a model still sharded by strategy::fsdp<>).
inline void write_pretrained(const torch::nn::Module& module, const std::filesystem::path& dir, nlohmann::json config,
                             const std::string& architecture, const SavePretrainedOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir.string() + ": cannot create the directory (" + ec.message() + ")");

  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : module.named_parameters(true)) {
    if (p.value().numel() == 0)
      throw Error("nn::save_pretrained(" + dir.string() + "): the parameter \"" + p.key() +
                  "\" holds no values (a model sharded by fsdp<>?); export the model a checkpoint restores "
                  "(checkpointer::build_model and Checkpoint::load_model)");
    tensors.emplace_back(p.key(), p.value());
  }
  for (const auto& b : module.named_buffers(true)) tensors.emplace_back(b.key(), b.value());
  weights::save_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});

  config["architectures"] = {architecture};
  // transformers' name of the weights' dtype (the first tensor's: the model is one dtype).
  const auto dtype = tensors.empty() ? torch::kFloat : tensors.front().second.scalar_type();
  config["dtype"] = dtype == torch::kBFloat16 ? "bfloat16"
                    : dtype == torch::kHalf   ? "float16"
                    : dtype == torch::kDouble ? "float64"
                                              : "float32";
  {
    std::ofstream out(dir / "config.json");
    out << config.dump(2) << '\n';
    if (!out) throw Error((dir / "config.json").string() + ": cannot be written");
  }
  for (const auto& file : options.files) {
    const auto name = file.filename();
    if (name == "config.json" || name.string().rfind("model.safetensors", 0) == 0)
      throw Error("nn::save_pretrained: " + file.string() + " would replace the " + name.string() +
                  " save_pretrained writes; leave it out of SavePretrainedOptions::files");
    fs::copy_file(file, dir / name, fs::copy_options::overwrite_existing, ec);
    if (ec) throw Error("nn::save_pretrained: cannot copy " + file.string() + " into " + dir.string() + " (" + ec.message() + ")");
  }
}

}  // namespace detail

/// save_pretrained of a model handle (nn::BertModel, nn::ViTForImageClassification, ...): the
/// module's overload, found where its family's header declares it.
template <class M>
void save_pretrained(const torch::nn::ModuleHolder<M>& model, const std::filesystem::path& dir,
                     const SavePretrainedOptions& options = {}) {
  save_pretrained(*model, dir, options);
}

/// load_pretrained of a model handle: the module's overload.
template <class M>
weights::LoadReport load_pretrained(torch::nn::ModuleHolder<M>& model, const std::filesystem::path& path,
                                    weights::LoadOptions options = {}) {
  return load_pretrained(*model, path, std::move(options));
}

}  // namespace nn

DTRAIN_NAMESPACE_END
