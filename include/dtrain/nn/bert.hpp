// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::BertModel and nn::BertForSequenceClassification: a BERT-family encoder (BERT, MiniLM, ...)
// whose parameter names are Hugging Face transformers' own (`embeddings.word_embeddings.weight`,
// `encoder.layer.0.attention.self.query.weight`, `pooler.dense.weight`; `bert.` and `classifier.`
// for the classification head), so a model directory loads by name with no mapping table:
//
//   auto config = dtrain::nn::BertConfig::from_pretrained(dir);        // dir/config.json
//   dtrain::nn::BertForSequenceClassification model(config.with_num_labels(3));
//   dtrain::nn::load_pretrained(*model, dir);          // weights::load, strict where it can be
//   auto logits = model(input_ids, attention_mask, token_type_ids);    // [batch, 3]
//
// The modules: embeddings (word, position, token type; LayerNorm, dropout), encoder.layer.N
// (attention.self.{query,key,value}, attention.output.{dense,LayerNorm}, intermediate.dense,
// output.{dense,LayerNorm}), pooler.dense with tanh. No buffers: transformers 5's position_ids and
// token_type_ids are non-persistent (not in its state_dict), and here they are made in forward.
// With the same weights and inputs the outputs equal transformers' within 1e-5 in fp32
// (tests/unit/bert_test.cpp). Both models describe themselves (`Config config`), so dtrain's
// checkpoints rebuild them (checkpointer::build_model, Predictor::from_checkpoint), and
// nn::save_pretrained (nn/bert_export.hpp) writes a directory transformers loads.
//
// Like nn/encoder.hpp, the layers call ATen (at::linear, at::layer_norm, at::embedding) on the
// registered parameters rather than LibTorch's module forwards, which add a bias pass per Linear;
// the encoder layers are nn/encoder.hpp's HubEncoderLayer (BERT layout), which nn/vit.hpp shares.
// BertForSequenceClassification reads the pooled output only (BertModel::pooled), so on the CPU its
// layers skip padding positions (nn/packed.hpp); BertModel::forward returns every state, as transformers'.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/nn/bert_config.hpp>
#include <dtrain/nn/encoder.hpp>
#include <dtrain/nn/pretrained.hpp>
#include <dtrain/weights.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

namespace detail {

inline torch::nn::Linear bert_linear(torch::nn::Module& parent, const std::string& name, std::int64_t in,
                                     std::int64_t out, const BertConfig& c) {
  // transformers' BertPreTrainedModel._init_weights: normal(0, initializer_range), zero bias.
  return hub_linear(parent, name, in, out, c.initializer_range);
}

inline torch::nn::LayerNorm bert_norm(torch::nn::Module& parent, const BertConfig& c) {
  return hub_norm(parent, "LayerNorm", c.hidden_size, c.layer_norm_eps);
}

/// A module that only names its children (transformers' BertAttention, BertIntermediate, ...).
inline std::shared_ptr<torch::nn::Module> bert_node(torch::nn::Module& parent, const std::string& name) {
  return hub_node(parent, name);
}

}  // namespace detail

/// `embeddings`: word, position and token type embeddings summed, then LayerNorm and dropout.
struct BertEmbeddingsImpl : torch::nn::Module {
  explicit BertEmbeddingsImpl(const BertConfig& c);

  /// input_ids, token_type_ids [batch, sequence] (token_type_ids undefined: all 0).
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& token_type_ids = {});

  BertConfig config;
  torch::nn::Embedding word_embeddings{nullptr}, position_embeddings{nullptr}, token_type_embeddings{nullptr};
  torch::nn::LayerNorm LayerNorm{nullptr};
};
TORCH_MODULE(BertEmbeddings);

/// `encoder.layer.N`: self-attention (`attention.self`, `attention.output`) and the feed-forward
/// block (`intermediate`, `output`), each with a residual sum and a LayerNorm after it (post-norm):
/// nn/encoder.hpp's HubEncoderLayer in its BERT layout.
HubEncoderLayerOptions bert_layer_options(const BertConfig& c);

struct BertLayerImpl : HubEncoderLayerImpl {
  explicit BertLayerImpl(const BertConfig& c) : HubEncoderLayerImpl(bert_layer_options(c)), config(c) {}
  BertConfig config;
};
TORCH_MODULE(BertLayer);

/// The additive attention mask of transformers' attention_mask ([batch, sequence], 1 for a token,
/// 0 for padding): [batch, 1, 1, sequence], 0 for a token and the dtype's lowest value for padding,
/// as transformers' eager attention adds it. Undefined in, undefined out.
torch::Tensor bert_attention_mask(const torch::Tensor& attention_mask, at::ScalarType dtype = at::kFloat);

/// What BertModel's forward returns.
struct BertOutput {
  torch::Tensor last_hidden_state;  // [batch, sequence, hidden]
  torch::Tensor pooler_output;      // [batch, hidden]: tanh(pooler.dense(the first token's state))
};

/// transformers' BertModel: embeddings, encoder.layer.0..N-1, pooler.
struct BertModelImpl : torch::nn::Module {
  using Config = BertConfig;
  explicit BertModelImpl(const Config& c = {});

  /// input_ids [batch, sequence] (int64); attention_mask [batch, sequence], 1 for a token and 0
  /// for padding (undefined: no padding); token_type_ids [batch, sequence] (undefined: all 0).
  BertOutput forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                     const torch::Tensor& token_type_ids = {});

  /// forward's pooler_output alone, all that a classification head reads. On the CPU, when rows
  /// are padded (and none starts with padding), the layers run on the tokens only (nn/packed.hpp):
  /// no work for states at padding positions, which nothing here reads.
  torch::Tensor pooled(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                       const torch::Tensor& token_type_ids = {});

  Config config;
  BertEmbeddings embeddings{nullptr};
  torch::nn::ModuleList layer{nullptr};  // encoder.layer
  torch::nn::Linear pooler{nullptr};     // pooler.dense
};
TORCH_MODULE(BertModel);

/// transformers' BertForSequenceClassification: `bert` (BertModel), dropout on the pooled output,
/// `classifier` (Linear hidden -> num_labels). forward returns the logits [batch, num_labels].
struct BertForSequenceClassificationImpl : torch::nn::Module {
  using Config = BertConfig;
  explicit BertForSequenceClassificationImpl(const Config& c = {});

  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                        const torch::Tensor& token_type_ids = {});

  Config config;
  BertModel bert{nullptr};
  torch::nn::Linear classifier{nullptr};
};
TORCH_MODULE(BertForSequenceClassification);

/// Keys of a Hugging Face BERT file that are not weights: position_ids and token_type_ids, saved
/// as buffers by transformers before 4.31 (all-MiniLM-L6-v2's file has position_ids), which
/// transformers itself skips when it loads.
bool is_bert_non_weight(const std::string& key);

/// Loads a Hugging Face BERT's weights at `path` (a model directory, a .safetensors file, a
/// sharded index or a torch.save state_dict: weights::read) into `model`, as transformers'
/// from_pretrained does: the keys that are not weights (is_bert_non_weight) are skipped; a
/// BertModel file (no `bert.` prefix) loads into a BertForSequenceClassification's `bert` with
/// the classifier reported missing (keeping its initialisation), and a classification file loads
/// into a BertModel through `bert.` with the classifier reported unexpected. Otherwise
/// `options.strict` holds as in weights::load: a missing or unexpected name is an Error listing
/// them, a shape mismatch always is.
template <class M>
  requires std::is_base_of_v<BertModelImpl, M> || std::is_base_of_v<BertForSequenceClassificationImpl, M>
weights::LoadReport load_pretrained(M& model, const std::filesystem::path& path, weights::LoadOptions options = {}) {
  auto state = weights::read(path);
  std::erase_if(state, [](const auto& kv) { return is_bert_non_weight(kv.first); });
  const auto source = weights::detail::weights_format(path).second.string();
  // A task model's file (transformers' BertFor*: the encoder under `bert.`), or a bare BertModel's.
  const bool classification_file = std::any_of(state.begin(), state.end(), [](const auto& kv) { return kv.first.rfind("bert.", 0) == 0; });
  if constexpr (std::is_base_of_v<BertForSequenceClassificationImpl, M>) {
    if (!classification_file && options.prefix.empty()) {
      auto report = weights::load_state_dict(*model.bert, std::move(state), source, options);
      for (const auto& p : model.classifier->named_parameters()) report.missing.push_back("classifier." + p.key());
      for (auto& k : report.missing)
        if (k.rfind("classifier.", 0) != 0) k = "bert." + k;
      return report;
    }
  } else if constexpr (std::is_base_of_v<BertModelImpl, M>) {
    if (classification_file && options.prefix.empty()) {
      options.prefix = "bert.";
      std::vector<std::pair<std::string, torch::Tensor>> head;
      std::erase_if(state, [&](const auto& kv) {
        if (kv.first.rfind("bert.", 0) == 0) return false;
        head.push_back(kv);  // a tensor handle: no copy of the data
        return true;
      });
      auto report = weights::load_state_dict(model, std::move(state), source, options);
      for (const auto& kv : head) report.unexpected.push_back(kv.first);
      return report;
    }
  }
  return weights::load_state_dict(model, std::move(state), source, options);
}

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/bert.ipp>
#endif
