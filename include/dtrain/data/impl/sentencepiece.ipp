// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of sentencepiece.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/sentencepiece.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {
namespace detail {

DTRAIN_INLINE SentencePieceLibrary::SentencePieceLibrary() {
  constexpr int flags = RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND;
  void* spm = ::dlopen("libsentencepiece.so.0", flags);
  if (!spm) missing("libsentencepiece.so.0", ::dlerror());
  void* trainer = ::dlopen("libsentencepiece_train.so.0", flags);
  if (!trainer) missing("libsentencepiece_train.so.0", ::dlerror());
  construct = symbol<Construct>(spm, "_ZN13sentencepiece22SentencePieceProcessorC1Ev");
  destroy = symbol<Destroy>(spm, "_ZN13sentencepiece22SentencePieceProcessorD1Ev");
  load = symbol<Load>(spm, "_ZN13sentencepiece22SentencePieceProcessor23LoadFromSerializedProtoESt17basic_string_"
                           "viewIcSt11char_traitsIcEE");
  encode = symbol<Encode>(spm, "_ZNK13sentencepiece22SentencePieceProcessor6EncodeESt17basic_string_viewIcSt11char_"
                               "traitsIcEEPSt6vectorIiSaIiEE");
  piece_count = symbol<PieceCount>(spm, "_ZNK13sentencepiece22SentencePieceProcessor12GetPieceSizeEv");
  status_destroy = symbol<StatusDestroy>(spm, "_ZN13sentencepiece4util6StatusD1Ev");
  status_message = symbol<StatusMessage>(spm, "_ZNK13sentencepiece4util6Status13error_messageEv");
  // SentencePiece logs to std::cerr. Under RTLD_DEEPBIND its std::cerr is libstdc++'s own
  // object, which stays unconstructed when the program uses std::cerr itself (the program then
  // holds the stream as a copy relocation, and libstdc++ constructs that copy): writing to it
  // crashes. Errors come back as Status messages, so the library is kept silent (FATAL only).
  symbol<void (*)(int)>(spm, "_ZN13sentencepiece7logging14SetMinLogLevelEi")(kSilent);
  train = symbol<Train>(trainer, "_ZN13sentencepiece20SentencePieceTrainer5TrainESt17basic_string_viewIcSt11char_"
                                 "traitsIcEEPNS_16SentenceIteratorEPNSt7__cxx1112basic_stringIcS3_SaIcEEE");
}

DTRAIN_INLINE SentencePieceProcessor::SentencePieceProcessor(std::string_view serialized_model) : lib_(SentencePieceLibrary::get()) {
  lib_.construct(storage_.get());
  const auto status = lib_.load(storage_.get(), serialized_model);
  if (!status.ok()) {
    lib_.destroy(storage_.get());
    throw DataError("SentencePieceTokenizer: the model does not load: " + status.message());
  }
}

DTRAIN_INLINE void SentencePieceProcessor::encode(std::string_view text, std::vector<int>& ids) const {
  ids.clear();
  const auto status = lib_.encode(storage_.get(), text, &ids);
  if (!status.ok()) throw DataError("SentencePieceTokenizer: encoding failed: " + status.message());
}
}  // namespace detail

DTRAIN_INLINE void SentencePieceTokenizer::save(torch::serialize::OutputArchive& a) const {
  a.write("kind", c10::IValue(std::string("SentencePieceTokenizer")));
  a.write("max_len", c10::IValue(max_len_));
  a.write("model", c10::IValue(model_));
}

DTRAIN_INLINE void SentencePieceTokenizer::load(torch::serialize::InputArchive& a) {
  c10::IValue k, m, n;
  a.read("kind", k);
  if (!k.isString() || k.toStringRef() != "SentencePieceTokenizer")
    throw DataError(std::string("this object holds a ") + (k.isString() ? k.toStringRef() : "non-preprocessor") +
                    ", not a SentencePieceTokenizer; load it into the type it was saved from");
  a.read("max_len", n);
  a.read("model", m);
  model_ = m.toStringRef();
  max_len_ = n.toInt();
  processor_ = std::make_shared<const detail::SentencePieceProcessor>(model_);
}

DTRAIN_INLINE std::filesystem::path SentencePieceTokenizer::scratch_file() {
  auto dir = std::filesystem::temp_directory_path();
  std::string name = (dir / "dtrain_sentencepiece_XXXXXX").string();
  const int fd = ::mkstemp(name.data());
  if (fd < 0) throw DataError("SentencePieceTokenizer::fit: cannot create a scratch file in " + dir.string());
  ::close(fd);
  return name;
}
}  // namespace data
DTRAIN_NAMESPACE_END
