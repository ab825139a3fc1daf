// SPDX-License-Identifier: Apache-2.0
#pragma once
// evaluation::TextInputs: raw texts into a Predictor or batch_predict restored from a checkpoint,
// through the tokenizer and the class names the training saved with it, whichever tokenizer that was:
//
//   ctx.checkpoint(model, opt).with_object("vocab", tokenizer).with_object("labels", labels)
//   auto predictor = Predictor<nn::BertForSequenceClassification>::from_checkpoint(dir, TextInputs{});
//   auto p = predictor.predict({"a text", "another"});  // p[i].label, p[i].probabilities

#include <memory>
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
/// the predictions.
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
  template <class Tokenizer>
  RawInputs with_tokenizer(const checkpointer::Checkpoint& ck, std::shared_ptr<Tokenizer> tokenizer) const {
    RawInputs in;
    in.class_names = detail::saved_class_names(ck, labels);
    in.fields = [tokenizer, ids = ids, mask = mask](const std::vector<std::string>& texts) {
      std::vector<data::Fields> samples;
      for (const auto& t : texts) samples.push_back(data::Fields{{ids, tokenizer->transform(t)}});
      return data::pad_to_longest(ids, data::detail::pad_id_of(*tokenizer), mask)(samples);
    };
    return in;
  }
};

}  // namespace evaluation

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/evaluation/impl/text_inputs.ipp>
#endif
