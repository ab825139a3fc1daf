// SPDX-License-Identifier: Apache-2.0
#pragma once
// The text tagger of examples/text_classifier.cpp and examples/tune_text_classifier.cpp: the
// Python peer's model (benchmarks/peers/text.py), a corpus's rows and their encoded batches.

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <dtrain/data/collate.hpp>
#include <dtrain/data/csv_table.hpp>
#include <dtrain/data/pipeline.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/data/token_ids.hpp>
#include <dtrain/nn/encoder.hpp>

namespace text_tagger {

namespace data = dtrain::data;

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The peer's model: Embedding(V, 128, padding_idx 0) -> [2 x TransformerEncoderLayer(128, 4, 256,
// dropout 0.1) with the padding mask] -> mean over non-pad tokens -> Linear(128, K).
struct TextClassifierConfig {
  std::int64_t vocab = 0, classes = 0;
  bool transformer = true;
  /// Dropout on the pooled text before the head (Made-With-ML's tagger's); 0 in the peer's model.
  double dropout = 0.0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TextClassifierConfig, vocab, classes, transformer, dropout)

struct TextClassifierImpl : torch::nn::Module {
  using Config = TextClassifierConfig;
  explicit TextClassifierImpl(const Config& c) : config(c) {
    // A sparse gradient: backward writes the rows a batch looked up, ddp<> averages those rows
    // only, and ctx.step hands Adam the dense gradient they make (the peer's update, exactly).
    embedding = register_module(
        "embedding", torch::nn::Embedding(torch::nn::EmbeddingOptions(c.vocab, 128).padding_idx(0).sparse(true)));
    // dtrain's encoder: the peer's layers, named as LibTorch's (so its checkpoints load), from
    // ATen's own ops (include/dtrain/nn/encoder.hpp says what LibTorch's C++ layer costs).
    if (c.transformer)
      encoder = register_module(
          "encoder", dtrain::nn::Encoder(dtrain::nn::EncoderLayerOptions(128, 4).feedforward(256).dropout(0.1), 2));
    head = register_module("head", torch::nn::Linear(128, c.classes));
  }
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& mask) {
    auto h = embedding(ids);
    const auto pad = mask.eq(0);
    if (!encoder.is_empty()) h = encoder->forward(h, pad);
    const auto keep = mask.unsqueeze(-1).to(h.dtype());
    auto pooled = (h * keep).sum(1) / keep.sum(1).clamp_min(1);
    if (config.dropout > 0) pooled = torch::dropout(pooled, config.dropout, is_training());
    return head(pooled);
  }
  torch::Tensor forward(const data::Fields& b) { return forward(b["input_ids"], b["attention_mask"]); }
  Config config;
  torch::nn::Embedding embedding{nullptr};
  dtrain::nn::Encoder encoder{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TextClassifier);

// Token ids and labels encoded once (the pipeline's tokenising), a sample by index.
struct Encoded {
  data::TokenIds ids;
  std::vector<std::int64_t> labels;
  std::int64_t size() const { return ids.size(); }
  data::Fields operator[](std::int64_t i) const {
    return {{"input_ids", ids.tensor(i)}, {"label", torch::tensor(labels[static_cast<std::size_t>(i)])}};
  }
};

auto batches_of(Encoded e, int threads) {
  return data::pipelined(std::move(e), data::collate(data::pad_to_longest("input_ids")), {.loader_threads = threads});
}
using Batches = decltype(batches_of(Encoded{}, 0));

// A table's texts (title + " " + description) and tags, read once.
struct Rows {
  data::CsvTable table;
  std::vector<std::string> texts;
  std::vector<std::string_view> tags;  // into `table`
  explicit Rows(const std::string& path) : table(data::read_csv(path)) {
    const auto title = table.column("title"), description = table.column("description");
    texts.reserve(static_cast<std::size_t>(table.size()));
    for (std::int64_t i = 0; i < table.size(); ++i) {
      auto& t = texts.emplace_back(title[i]);
      t += ' ';
      t += description[i];
    }
    const auto tag = table.column("tag");
    tags.assign(tag.begin(), tag.end());
  }
  template <class Indices>
  std::vector<std::string_view> texts_at(const Indices& rows) const {
    std::vector<std::string_view> out;
    for (auto i : rows) out.emplace_back(texts[static_cast<std::size_t>(i)]);
    return out;
  }
  std::vector<std::int64_t> labels_at(const std::vector<std::int64_t>& rows, const data::LabelEncoder& labels) const {
    std::vector<std::int64_t> out;
    for (auto i : rows) out.push_back(labels.transform(std::string(tags[static_cast<std::size_t>(i)])));
    return out;
  }
};

}  // namespace text_tagger
