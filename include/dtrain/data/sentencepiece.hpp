// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::SentencePieceTokenizer: a SentencePiece model (unigram or BPE) trained on the training
// split, as a preprocessor saved with the checkpoint like WordVocabulary.
//
// libsentencepiece is loaded at run time, never linked: Debian's libsentencepiece.so.0 carries its
// own copy of protobuf-lite, and a program linked to it beside LibTorch (libprotobuf.so.32)
// crashes before main (docs/data.md has the trace). dlopen with RTLD_LOCAL | RTLD_DEEPBIND keeps
// that copy private to the library. The entry points are found by their mangled names and called
// as functions taking the object first (the Itanium C++ ABI's member call: a util::Status result
// comes back through a hidden pointer, as for any class with a non-trivial destructor); none is
// virtual, so the class's vtable layout does not matter, and a library without one of them is a
// clear error rather than a wrong call.

#include <dlfcn.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <dtrain/data/token_ids.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

namespace detail {

// The two libraries and the entry points dtrain calls, loaded once per process.
class SentencePieceLibrary {
 public:
  // sentencepiece::util::Status: one pointer (nullptr: OK). Its destructor makes it a class
  // returned through a hidden pointer, as the library returns it.
  struct Status {
    void* rep = nullptr;
    Status() = default;
    Status(const Status&) = delete;
    Status& operator=(const Status&) = delete;
    ~Status() {
      if (rep) get().status_destroy(this);
    }
    bool ok() const { return rep == nullptr; }
    std::string message() const { return ok() ? "" : get().status_message(this); }
  };

  using Construct = void (*)(void*);
  using Destroy = void (*)(void*);
  using Load = Status (*)(void*, std::string_view);
  using Encode = Status (*)(const void*, std::string_view, std::vector<int>*);
  using PieceCount = int (*)(const void*);
  using Train = Status (*)(std::string_view, void*, std::string*);
  using StatusDestroy = void (*)(void*);
  using StatusMessage = const char* (*)(const void*);

  // The processor object: 88 bytes in 0.1.97 (a vtable pointer, four unique_ptrs, two vectors);
  // a test checks the header's sizeof against this reserve.
  static constexpr std::size_t kProcessorBytes = 1024;
  // SentencePiece's log levels: INFO 0, WARNING 1, ERROR 2, FATAL 3.
  static constexpr int kSilent = 3;

  Construct construct = nullptr;
  Destroy destroy = nullptr;
  Load load = nullptr;
  Encode encode = nullptr;
  PieceCount piece_count = nullptr;
  Train train = nullptr;
  StatusDestroy status_destroy = nullptr;
  StatusMessage status_message = nullptr;

  /// The loaded library; DataError naming the Debian packages when it cannot be loaded.
  static const SentencePieceLibrary& get() {
    static const SentencePieceLibrary library;
    return library;
  }

 private:
  SentencePieceLibrary();

  [[noreturn]] static void missing(const std::string& library, const char* why) {
    throw DataError("SentencePieceTokenizer: cannot load " + library + " (" + (why ? why : "unknown") +
                    "); install Debian's libsentencepiece0 (the library; libsentencepiece-dev brings it too): "
                    "apt-get install libsentencepiece0");
  }

  template <class F>
  static F symbol(void* library, const char* name) {
    void* f = ::dlsym(library, name);
    if (!f)
      throw DataError(std::string("SentencePieceTokenizer: the loaded libsentencepiece has no ") + name +
                      "; dtrain calls the C++ API of SentencePiece 0.1.9x (Debian bookworm's libsentencepiece0)");
    return reinterpret_cast<F>(f);
  }
};

// A sentencepiece::SentencePieceProcessor built and destroyed through the library.
class SentencePieceProcessor {
 public:
  explicit SentencePieceProcessor(std::string_view serialized_model);
  SentencePieceProcessor(const SentencePieceProcessor&) = delete;
  SentencePieceProcessor& operator=(const SentencePieceProcessor&) = delete;
  ~SentencePieceProcessor() { lib_.destroy(storage_.get()); }

  void encode(std::string_view text, std::vector<int>& ids) const;
  std::int64_t pieces() const { return lib_.piece_count(storage_.get()); }

 private:
  const SentencePieceLibrary& lib_;
  std::unique_ptr<std::max_align_t[]> storage_{
      new std::max_align_t[SentencePieceLibrary::kProcessorBytes / sizeof(std::max_align_t)]()};
};

}  // namespace detail

/// A SentencePiece tokenizer fitted on the training texts: ids 0 = <pad>, 1 = <unk>, then the
/// pieces (no BOS / EOS), so it pads like WordVocabulary. Thread-safe encoding.
class SentencePieceTokenizer : public detail::encodings<SentencePieceTokenizer> {
 public:
  static constexpr std::int64_t pad_id = 0, unk_id = 1;

  struct Options {
    std::int64_t vocab_size = 8000;
    std::string model_type = "unigram";  // or "bpe", "char", "word"
    double character_coverage = 1.0;
    std::int64_t max_len = 0;  // ids kept per text (0: all)
    std::int64_t seed_sentencepiece_size = 1000000;
    /// More trainer flags, spm_train's: "--split_digits=true --byte_fallback=true".
    std::string extra;
  };

  SentencePieceTokenizer() = default;

  /// Trains on `texts` (the training split's) with SentencePiece's trainer. A text's newlines
  /// become spaces (the trainer reads one sentence a line).
  template <class Range>
  static SentencePieceTokenizer fit(const Range& texts, const Options& options) {
    if (options.vocab_size < 3) throw DataError("SentencePieceTokenizer::fit: vocab_size must be 3 or more");
    const auto& lib = detail::SentencePieceLibrary::get();
    const auto input = scratch_file();
    {
      std::ofstream out(input, std::ios::binary);
      for (const auto& t : texts) {
        std::string line{std::string_view(t)};
        for (auto& c : line)
          if (c == '\n' || c == '\r') c = ' ';
        out << line << '\n';
      }
      if (!out) throw DataError("SentencePieceTokenizer::fit: cannot write the training text to " + input.string());
    }
    const std::string args = "--input=" + input.string() + " --vocab_size=" +
                             std::to_string(options.vocab_size) + " --model_type=" + options.model_type +
                             " --character_coverage=" + std::to_string(options.character_coverage) +
                             " --seed_sentencepiece_size=" + std::to_string(options.seed_sentencepiece_size) +
                             " --pad_id=0 --unk_id=1 --bos_id=-1 --eos_id=-1 --num_threads=1 --minloglevel=" +
                             std::to_string(detail::SentencePieceLibrary::kSilent) + " " +
                             options.extra;
    std::string model;
    const auto status = lib.train(args, nullptr, &model);
    std::error_code ignored;
    std::filesystem::remove(input, ignored);
    if (!status.ok())
      throw DataError("SentencePieceTokenizer::fit: SentencePiece's trainer failed: " + status.message() +
                      " (flags: " + args + ")");
    SentencePieceTokenizer t;
    t.model_ = std::move(model);
    t.max_len_ = options.max_len;
    t.processor_ = std::make_shared<const detail::SentencePieceProcessor>(t.model_);
    return t;
  }

  // encode(text): the ids of `text` (at most max_len; a text without pieces gives {<unk>});
  // encode_all(texts); transform(text): from detail::encodings.

  /// Ids in all (the pieces, <pad> and <unk> among them).
  std::int64_t size() const { return processor().pieces(); }
  std::int64_t max_len() const { return max_len_; }
  /// The trained model, SentencePiece's serialized ModelProto (what spm_train writes as .model).
  const std::string& model() const { return model_; }

  void save(torch::serialize::OutputArchive& a) const;
  void load(torch::serialize::InputArchive& a);

 private:
  friend class detail::encodings<SentencePieceTokenizer>;
  const detail::SentencePieceProcessor& processor() const {
    if (!processor_) throw DataError("SentencePieceTokenizer: used before fit (or load)");
    return *processor_;
  }
  template <class Out>
  void encode_into(std::string_view text, Out&& out) const {
    thread_local std::vector<int> ids;
    processor().encode(text, ids);
    std::size_t n = ids.size();
    if (max_len_ > 0 && n > static_cast<std::size_t>(max_len_)) n = static_cast<std::size_t>(max_len_);
    for (std::size_t i = 0; i < n; ++i) out(static_cast<std::int64_t>(ids[i]));
    if (n == 0) out(unk_id);
  }
  static std::filesystem::path scratch_file();

  std::string model_;
  std::int64_t max_len_ = 0;
  std::shared_ptr<const detail::SentencePieceProcessor> processor_;
};

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/sentencepiece.ipp>
#endif
