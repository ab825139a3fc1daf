// SPDX-License-Identifier: Apache-2.0
#pragma once
// evaluation::RawInputs: raw texts or image files made into a model's batch by the preprocessing a
// checkpoint saved (TextInputs of evaluation/text_inputs.hpp, ImageInputs of
// evaluation/image_inputs.hpp), and the concept that restores it.

#include <concepts>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/config.hpp>
#include <dtrain/data/fields.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace evaluation {

/// Raw inputs (texts, image files) made into a model's batch, and the class names, as a checkpoint's
/// objects restore them (TextInputs::restore, ImageInputs::restore). One of the two is set:
/// `tensor` for a model's forward(Tensor), `fields` for its forward(const data::Fields&) or its
/// forward(input_ids, attention_mask).
struct RawInputs {
  std::function<torch::Tensor(const std::vector<std::string>&)> tensor;
  std::function<data::Fields(const std::vector<std::string>&)> fields;
  std::vector<std::string> class_names;
  /// For a causal LM (Predictor::generate), set where the tokenizer decodes (data::BpeTokenizer):
  /// prompts as ids and attention mask, left-padded ([texts, longest]), and ids back to text.
  std::function<std::pair<torch::Tensor, torch::Tensor>(const std::vector<std::string>&)> prompts;
  std::function<std::string(const torch::Tensor&)> decode;
};

/// What restores RawInputs from a checkpoint (TextInputs, ImageInputs).
template <class T>
concept InputsFromCheckpoint = requires(const T& t, const checkpointer::Checkpoint& ck) {
  { t.restore(ck) } -> std::same_as<RawInputs>;
};

namespace detail {

/// The classes of the data::LabelEncoder `ck` saved as `labels`.
std::vector<std::string> saved_class_names(const checkpointer::Checkpoint& ck, const std::string& labels);

/// Which preprocessing kinds an inputs type restores by itself, for its error messages.
struct KnownKinds {
  const char* inputs;     // "TextInputs"
  const char* field;      // its member that names the object: "vocabulary"
  const char* known;      // "WordPieceTokenizer, SentencePieceTokenizer and WordVocabulary"
  const char* your_type;  // the placeholder in from_checkpoint<...>: "YourTokenizer"
};

/// ConfigError: `ck`'s object `name` is of `kind` (a preprocessor's kind, or "" for none), which
/// the inputs type `k` does not restore by itself.
[[noreturn]] void unknown_preprocessing(const checkpointer::Checkpoint& ck, const std::string& name,
                                        const std::string& kind, const KnownKinds& k);

}  // namespace detail

}  // namespace evaluation

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/evaluation/impl/raw_inputs.ipp>
#endif
