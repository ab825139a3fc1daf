// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::save_pretrained: a BERT-family model written as a Hugging Face model directory that
// transformers' from_pretrained (AutoModelForSequenceClassification, AutoModel) loads with no
// missing or unexpected key:
//
//   dtrain::nn::save_pretrained(*model, "export", {.files = {tokenizer_dir / "tokenizer.json",
//                                                             tokenizer_dir / "vocab.txt"}});
//
// writes export/config.json (the model's BertConfig: model_type "bert", id2label/label2id and
// `architectures` naming the class), export/model.safetensors (every parameter by its name, the
// module's dtype, {"format": "pt"} as transformers writes it) and copies `files` beside them (a
// tokenizer's tokenizer.json, vocab.txt, tokenizer_config.json, special_tokens_map.json). A model
// from a dtrain checkpoint comes back first: checkpointer::build_model<...>(checkpoint) and
// checkpoint.load_model(model).

#include <filesystem>
#include <fstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/nn/bert.hpp>
#include <dtrain/weights/safetensors.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

struct SavePretrainedOptions {
  /// Files copied into the directory by their names (a tokenizer's files). config.json and
  /// model.safetensors are refused: save_pretrained writes them.
  std::vector<std::filesystem::path> files = {};
};

/// Writes `model` (a BertModelImpl or BertForSequenceClassificationImpl, or a subclass) to `dir`
/// as a Hugging Face model directory (see the header's comment); `dir` is created. Throws Error
/// naming the path when a file cannot be written or copied, and for a parameter without values
/// (a model still sharded by strategy::fsdp<>: export the full model a checkpoint holds).
template <class M>
  requires std::is_base_of_v<torch::nn::Module, M>
void save_pretrained(const M& model, const std::filesystem::path& dir, const SavePretrainedOptions& options = {}) {
  static_assert(std::is_base_of_v<BertModelImpl, M> || std::is_base_of_v<BertForSequenceClassificationImpl, M>,
                "nn::save_pretrained: pass the module (*model) of an nn::BertModel or nn::BertForSequenceClassification");
  namespace fs = std::filesystem;
  const std::string architecture =
      std::is_base_of_v<BertModelImpl, M> ? "BertModel" : "BertForSequenceClassification";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir.string() + ": cannot create the directory (" + ec.message() + ")");

  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : model.named_parameters(true)) {
    if (p.value().numel() == 0)
      throw Error("nn::save_pretrained(" + dir.string() + "): the parameter \"" + p.key() +
                  "\" holds no values (a model sharded by fsdp<>?); export the model a checkpoint restores "
                  "(checkpointer::build_model and Checkpoint::load_model)");
    tensors.emplace_back(p.key(), p.value());
  }
  for (const auto& b : model.named_buffers(true)) tensors.emplace_back(b.key(), b.value());
  weights::save_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});

  auto config = model.config.to_json();
  config["architectures"] = {architecture};
  // transformers' name of the weights' dtype (the embeddings' dtype: the model is one dtype).
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

/// save_pretrained of a model handle (nn::BertModel, nn::BertForSequenceClassification).
template <class M>
void save_pretrained(const torch::nn::ModuleHolder<M>& model, const std::filesystem::path& dir,
                     const SavePretrainedOptions& options = {}) {
  save_pretrained(*model, dir, options);
}

}  // namespace nn

DTRAIN_NAMESPACE_END
