// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of text_inputs.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/bpe_tokenizer.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/data/sentencepiece.hpp>
#include <dtrain/data/wordpiece.hpp>
#include <dtrain/evaluation/text_inputs.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace evaluation {

DTRAIN_INLINE RawInputs TextInputs::restore(const checkpointer::Checkpoint& ck) const {
  const auto kind = ck.object_kind(vocabulary);
  if (kind == "WordPieceTokenizer") return restore<data::WordPieceTokenizer>(ck);
  if (kind == "BpeTokenizer") return restore<data::BpeTokenizer>(ck);
  if (kind == "SentencePieceTokenizer") return restore<data::SentencePieceTokenizer>(ck);
  if (kind == "WordVocabulary") return restore<data::WordVocabulary>(ck);
  detail::unknown_preprocessing(ck, vocabulary, kind,
                                {.inputs = "TextInputs", .field = "vocabulary",
                                 .known = "WordPieceTokenizer, BpeTokenizer, SentencePieceTokenizer and WordVocabulary",
                                 .your_type = "YourTokenizer"});
}

}  // namespace evaluation
DTRAIN_NAMESPACE_END
