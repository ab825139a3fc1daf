// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::BertConfig: a BERT-family encoder's sizes and labels as Hugging Face's `config.json` holds
// them (BertConfig of transformers), read with BertConfig::from_pretrained(dir_or_file) and
// written back as the same JSON (save_pretrained, and model_config.json in dtrain's checkpoints).
//
// The JSON form IS config.json's: the keys the model uses are fields; every other key (problem_type,
// initializer_range's siblings, a tokenizer class, ...) is kept in `extra` and written back, so a
// config read, saved in a checkpoint and exported loses nothing. Settings this implementation does
// not compute (relative position embeddings, a decoder, cross-attention, an activation other than
// GELU or ReLU) are a ConfigError naming the key and its value, never a silently different model.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/error.hpp>
#include <dtrain/nn/hub_config.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

struct BertConfig {
  std::int64_t vocab_size = 30522;
  std::int64_t hidden_size = 768;
  std::int64_t num_hidden_layers = 12;
  std::int64_t num_attention_heads = 12;
  std::int64_t intermediate_size = 3072;
  /// "gelu" (exact, erf), "gelu_new" or "gelu_pytorch_tanh" (tanh approximation), "relu".
  std::string hidden_act = "gelu";
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  std::int64_t max_position_embeddings = 512;
  std::int64_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  /// The padding token: its embedding row gets no gradient (nn.Embedding's padding_idx). None
  /// when config.json has null.
  std::optional<std::int64_t> pad_token_id = 0;
  double initializer_range = 0.02;
  /// The classification head's dropout; none: hidden_dropout_prob (as transformers).
  std::optional<double> classifier_dropout;
  /// Label names by id (config.json's id2label; label2id is its inverse). Its size is num_labels.
  std::vector<std::string> id2label = {"LABEL_0", "LABEL_1"};
  /// config.json's other keys, written back as read.
  nlohmann::json extra = nlohmann::json::object();

  std::int64_t num_labels() const { return static_cast<std::int64_t>(id2label.size()); }
  /// `n` labels named LABEL_0 ... LABEL_{n-1} (transformers' default names).
  BertConfig& with_num_labels(std::int64_t n);

  /// Parses config.json's object; `source` names it in errors. Throws ConfigError for a value of
  /// the wrong type, a size that cannot build the model, or a setting not implemented here.
  static BertConfig from_json(const nlohmann::json& j, const std::string& source = "BertConfig");
  /// Reads `path`: a Hugging Face model directory (its config.json) or a config.json file.
  static BertConfig from_pretrained(const std::filesystem::path& path);
  /// config.json's object: model_type "bert", the fields, id2label/label2id, then `extra`.
  nlohmann::json to_json() const;

  bool operator==(const BertConfig&) const = default;
};

namespace detail {

/// Keys of config.json that say what a file was, not what the model is: dropped when read, so
/// they are not carried as `extra` (save_pretrained writes its own).
const std::set<std::string>& bert_volatile_keys();

}  // namespace detail

inline BertConfig BertConfig::from_pretrained(const std::filesystem::path& path) {
  const auto [j, file] = detail::read_hub_json(path, "config.json");
  return from_json(j, file);
}

/// nlohmann::json's conversions (checkpointer::DescribedModel): config.json's form both ways.
inline void to_json(nlohmann::json& j, const BertConfig& c) { j = c.to_json(); }
inline void from_json(const nlohmann::json& j, BertConfig& c) { c = BertConfig::from_json(j); }

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/bert_config.ipp>
#endif
