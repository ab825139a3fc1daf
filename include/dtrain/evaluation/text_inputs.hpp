// SPDX-License-Identifier: Apache-2.0
#pragma once
// evaluation::TextInputs: raw texts into a Predictor or batch_predict restored from a checkpoint,
// through the tokenizer and the class names the training saved with it, whichever tokenizer that was:
//
//   ctx.checkpoint(model, opt).with_object("vocab", tokenizer).with_object("labels", labels)
//   auto predictor = Predictor<nn::BertForSequenceClassification>::from_checkpoint(dir, TextInputs{});
//   auto p = predictor.predict({"a text", "another"});  // p[i].label, p[i].probabilities

#include <algorithm>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/config.hpp>
#include <dtrain/data/collate.hpp>
#include <dtrain/data/fields.hpp>
#include <dtrain/data/token_ids.hpp>
#include <dtrain/evaluation/raw_inputs.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace evaluation {

/// Which checkpoint objects turn raw text into a model's batch: the tokenizer saved as `vocabulary`
/// and a data::LabelEncoder saved as `labels`. restore(ck) reads which tokenizer was saved
/// (data::WordVocabulary, data::WordPieceTokenizer, data::BpeTokenizer,
/// data::SentencePieceTokenizer) from the object itself; restore<Tokenizer>(ck) loads a tokenizer
/// type of your own. A text becomes the batch
/// fields `ids` (padded with the tokenizer's pad id) and `mask`, which the model receives as
/// forward(const data::Fields&) or forward(input_ids, attention_mask); the encoder's classes name
/// the predictions. A tokenizer that decodes (data::BpeTokenizer) serves a causal LM's
/// Predictor::generate too: prompts left-padded, the generated ids decoded.
struct TextInputs {
  // Not an aggregate: a braced list of class names still means from_checkpoint's class names.
  explicit TextInputs() = default;
  std::string vocabulary = "vocab";
  std::string labels = "labels";
  std::string ids = "input_ids";
  std::string mask = "attention_mask";

  /// The tokenizer the checkpoint holds, of the type it says it is, and the label encoder.
  /// ConfigError naming the object when it is missing or of a type TextInputs does not know.
  RawInputs restore(const checkpointer::Checkpoint& ck) const;

  /// The tokenizer as a `Tokenizer` (load(archive), transform(text) -> ids, a pad id).
  template <class Tokenizer>
  RawInputs restore(const checkpointer::Checkpoint& ck) const {
    auto tokenizer = std::make_shared<Tokenizer>();
    ck.load_object(vocabulary, *tokenizer);
    return with_tokenizer(ck, tokenizer);
  }

 private:
  // Each text's ids (the tokenizer's transform: its BOS where it adds one) at the right end of a
  // row of pad ids, as a decoder's prompts are padded, with the mask of 1s under them.
  template <class Tokenizer>
  static std::pair<torch::Tensor, torch::Tensor> left_padded(const Tokenizer& tokenizer, const std::vector<std::string>& texts) {
    std::vector<torch::Tensor> rows;
    std::int64_t longest = 0;
    for (const auto& t : texts) {
      rows.push_back(tokenizer.transform(t));
      longest = std::max(longest, rows.back().size(0));
    }
    const auto n = static_cast<std::int64_t>(rows.size());
    auto ids = torch::full({n, longest}, data::detail::pad_id_of(tokenizer), torch::kLong);
    auto mask = torch::zeros({n, longest}, torch::kLong);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto len = rows[static_cast<std::size_t>(i)].size(0);
      ids[i].narrow(0, longest - len, len).copy_(rows[static_cast<std::size_t>(i)]);
      mask[i].narrow(0, longest - len, len).fill_(1);
    }
    return {ids, mask};
  }

  template <class Tokenizer>
  RawInputs with_tokenizer(const checkpointer::Checkpoint& ck, std::shared_ptr<Tokenizer> tokenizer) const {
    RawInputs in;
    constexpr bool decodes = requires { tokenizer->decode(torch::Tensor()); };
    // A causal LM's checkpoint has no labels: its tokenizer (one that decodes) is all it needs.
    if (!decodes || ck.has_object(labels)) in.class_names = detail::saved_class_names(ck, labels);
    in.fields = [tokenizer, ids = ids, mask = mask](const std::vector<std::string>& texts) {
      std::vector<data::Fields> samples;
      for (const auto& t : texts) samples.push_back(data::Fields{{ids, tokenizer->transform(t)}});
      return data::pad_to_longest(ids, data::detail::pad_id_of(*tokenizer), mask)(samples);
    };
    if constexpr (decodes) {
      in.prompts = [tokenizer](const std::vector<std::string>& texts) { return left_padded(*tokenizer, texts); };
      in.decode = [tokenizer](const torch::Tensor& generated) { return tokenizer->decode(generated); };
    }
    return in;
  }
};

}  // namespace evaluation

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/evaluation/impl/text_inputs.ipp>
#endif
