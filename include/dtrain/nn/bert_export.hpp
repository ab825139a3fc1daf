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
#include <dtrain/nn/pretrained.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// Writes `model` (a BertModelImpl or BertForSequenceClassificationImpl, or a subclass) to `dir`
/// as a Hugging Face model directory (see the header's comment); `dir` is created. Throws Error
/// naming the path when a file cannot be written or copied, and for a parameter without values
/// (a model still sharded by strategy::fsdp<>: export the full model a checkpoint holds).
template <class M>
  requires std::is_base_of_v<BertModelImpl, M> || std::is_base_of_v<BertForSequenceClassificationImpl, M>
void save_pretrained(const M& model, const std::filesystem::path& dir, const SavePretrainedOptions& options = {}) {
  const std::string architecture =
      std::is_base_of_v<BertModelImpl, M> ? "BertModel" : "BertForSequenceClassification";
  detail::write_pretrained(model, dir, model.config.to_json(), architecture, options);
}

}  // namespace nn

DTRAIN_NAMESPACE_END
