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
void write_pretrained(const torch::nn::Module& module, const std::filesystem::path& dir, nlohmann::json config,
                      const std::string& architecture, const SavePretrainedOptions& options);

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

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/pretrained.ipp>
#endif
