// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of text_inputs.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/sentencepiece.hpp>
#include <dtrain/data/wordpiece.hpp>
#include <dtrain/error.hpp>
#include <dtrain/evaluation/text_inputs.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace evaluation {

DTRAIN_INLINE RawInputs TextInputs::restore(const checkpointer::Checkpoint& ck) const {
  const auto kind = ck.object_kind(vocabulary);
  if (kind == "WordPieceTokenizer") return restore<data::WordPieceTokenizer>(ck);
  if (kind == "SentencePieceTokenizer") return restore<data::SentencePieceTokenizer>(ck);
  if (kind == "WordVocabulary") return restore<data::WordVocabulary>(ck);
  throw ConfigError("checkpoint " + ck.path().string() + ": the object \"" + vocabulary + "\" is " +
                    (kind.empty() ? std::string("not one of dtrain's tokenizers") : "a " + kind) +
                    ", which TextInputs does not restore by itself (it knows WordPieceTokenizer, "
                    "SentencePieceTokenizer and WordVocabulary); name its type, "
                    "Predictor<Model>::from_checkpoint<YourTokenizer>(dir, TextInputs{}), or set "
                    "TextInputs::vocabulary to the object that holds the tokenizer");
}

}  // namespace evaluation
DTRAIN_NAMESPACE_END
