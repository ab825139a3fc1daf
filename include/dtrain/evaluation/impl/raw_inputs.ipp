// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of raw_inputs.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/preprocess.hpp>
#include <dtrain/error.hpp>
#include <dtrain/evaluation/raw_inputs.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace evaluation::detail {

DTRAIN_INLINE std::vector<std::string> saved_class_names(const checkpointer::Checkpoint& ck, const std::string& labels) {
  data::LabelEncoder encoder;
  ck.load_object(labels, encoder);
  return encoder.classes();
}

DTRAIN_INLINE void unknown_preprocessing(const checkpointer::Checkpoint& ck, const std::string& name,
                                         const std::string& kind, const KnownKinds& k) {
  const std::string inputs = k.inputs;
  throw ConfigError("checkpoint " + ck.path().string() + ": the object \"" + name + "\" is " +
                    (kind.empty() ? std::string("not a preprocessor dtrain knows") : "a " + kind) + ", which " + inputs +
                    " does not restore by itself (it knows " + k.known + "); name its type, "
                    "Predictor<Model>::from_checkpoint<" + k.your_type + ">(dir, " + inputs + "{}), or set " + inputs +
                    "::" + k.field + " to the object that holds it");
}

}  // namespace evaluation::detail
DTRAIN_NAMESPACE_END
