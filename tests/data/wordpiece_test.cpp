// SPDX-License-Identifier: Apache-2.0
// data::WordPieceTokenizer's C++ API: BERT's basic tokenization and WordPiece on a small
// vocabulary, truncation and padding, pairs, clear errors for files it cannot use, and a round
// trip through a checkpoint into a Predictor. Ids against Hugging Face tokenizers on real texts:
// check_wordpiece.py (data.wordpiece_matches_hf_tokenizers).

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <dtrain/checkpointer/directory.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/data/wordpiece.hpp>
#include <dtrain/error.hpp>
#include <dtrain/evaluation/predictor.hpp>
#include <dtrain/launch/group.hpp>

#include "../unit/checkpoint_support.hpp"
#include "../unit/support.hpp"

namespace d = dtrain;
namespace fs = std::filesystem;
using dtrain_test::MessageContains;
using dtrain_test::TempDir;
using Tokenizer = d::data::WordPieceTokenizer;
using Ids = std::vector<std::int64_t>;

namespace {
void write_file(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4, then words and pieces.
const std::vector<std::string> kVocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", ",", "world", "!",
                                         "un", "##aff", "##able", "cafe", "中", "文", "strasse", "i", "##s"};

nlohmann::json small_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (std::size_t i = 0; i < kVocab.size(); ++i) vocab[kVocab[i]] = i;
  return {{"added_tokens", {{{"id", 4}, {"content", "[MASK]"}, {"normalized", false}}}},
          {"normalizer", {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true},
                          {"strip_accents", nullptr}, {"lowercase", true}}},
          {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
          {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"},
                     {"max_input_chars_per_word", 10}, {"vocab", vocab}}},
          {"post_processor", {{"type", "BertProcessing"}, {"cls", {"[CLS]", 2}}, {"sep", {"[SEP]", 3}}}},
          {"truncation", {{"max_length", 6}, {"strategy", "LongestFirst"}}},
          {"padding", {{"strategy", "BatchLongest"}, {"pad_id", 0}, {"pad_type_id", 0}, {"pad_token", "[PAD]"}}}};
}
// The checkpoint's model: a masked sum of embeddings of the ids.
struct NetImpl : torch::nn::Module {
  torch::nn::Embedding emb{nullptr};
  NetImpl() { emb = register_module("emb", torch::nn::Embedding(18, 2)); }
  torch::Tensor forward(const d::data::Fields& b) {
    const auto keep = b["attention_mask"].unsqueeze(-1).to(torch::kFloat32);
    return (emb->forward(b["input_ids"]) * keep).sum(1);
  }
};
}  // namespace

TEST_CASE("WordPieceTokenizer splits, lower-cases and strips accents as BERT does", "[data][wordpiece]") {
  auto j = small_json();
  j["truncation"] = nullptr;
  const auto tok = Tokenizer::from_json(j);
  CHECK(tok.encode("Hello, WORLD!") == Ids{2, 5, 6, 7, 8, 3});
  CHECK(tok.encode("unaffable") == Ids{2, 9, 10, 11, 3});
  CHECK(tok.encode("Café\u0000\x07") == Ids{2, 12, 3});        // accents stripped, controls dropped
  CHECK(tok.encode("中文") == Ids{2, 13, 14, 3});                // CJK characters are words of their own
  CHECK(tok.encode("unaffablex hello") == Ids{2, 1, 5, 3});     // no piece for "x": the whole word is [UNK]
  CHECK(tok.encode("helloooooooo") == Ids{2, 1, 3});            // longer than max_input_chars_per_word
  CHECK(tok.encode("hello [MASK] world") == Ids{2, 5, 4, 7, 3});  // an added token as typed
  CHECK(tok.encode("İs") == Ids{2, 16, 17, 3});                 // İ: I + dot above, the dot stripped
  CHECK(tok.encode("") == Ids{2, 3});
  CHECK(tok.encode(" \t\n ") == Ids{2, 3});
  CHECK(tok.size() == static_cast<std::int64_t>(kVocab.size()));
  CHECK(tok.pad_id() == 0);
  CHECK(tok.unk_id() == 1);
}

TEST_CASE("WordPieceTokenizer truncates pads and encodes pairs as tokenizers does", "[data][wordpiece]") {
  const auto tok = Tokenizer::from_json(small_json());
  CHECK(tok.max_length() == 6);
  CHECK(tok.encode("hello world hello world hello") == Ids{2, 5, 7, 5, 7, 3});
  const auto e = tok.encoding("hello, world", "un hello!");  // 3 + 3 ids > 6 - 3: LongestFirst keeps 1 + 2
  CHECK(e.input_ids == Ids{2, 5, 3, 9, 5, 3});
  CHECK(e.token_type_ids == Ids{0, 0, 0, 1, 1, 1});
  CHECK(e.attention_mask == Ids{1, 1, 1, 1, 1, 1});
  const auto batch = tok.encode_batch(std::vector<std::string>{"hello", "hello world !", ""});
  REQUIRE(batch.size() == 3);
  CHECK(batch[0].input_ids == Ids{2, 5, 3, 0, 0});  // BatchLongest: padded to the longest
  CHECK(batch[0].attention_mask == Ids{1, 1, 1, 0, 0});
  CHECK(batch[1].input_ids == Ids{2, 5, 7, 8, 3});
  CHECK(batch[2].input_ids == Ids{2, 3, 0, 0, 0});
  const auto all = tok.encode_all(std::vector<std::string>{"hello", "world"});
  CHECK(std::vector<std::int64_t>(all[1].begin(), all[1].end()) == Ids{2, 7, 3});
}

TEST_CASE("WordPieceTokenizer refuses files it cannot use and names them", "[data][wordpiece]") {
  TempDir dir;
  CHECK_THROWS_MATCHES(Tokenizer::from_file(dir / "absent.json"), d::DataError,
                       MessageContains({"absent.json", "cannot read"}));
  write_file(dir / "broken.json", "{\"model\": ");
  CHECK_THROWS_MATCHES(Tokenizer::from_file(dir / "broken.json"), d::Error, MessageContains({"broken.json", "not JSON"}));
  auto bpe = small_json();
  bpe["model"]["type"] = "BPE";
  write_file(dir / "bpe.json", bpe.dump());
  CHECK_THROWS_MATCHES(Tokenizer::from_file(dir / "bpe.json"), d::DataError,
                       MessageContains({"bpe.json", "\"BPE\"", "not WordPiece"}));
  auto no_unk = small_json();
  no_unk["model"]["vocab"].erase("[UNK]");
  write_file(dir / "no_unk.json", no_unk.dump());
  CHECK_THROWS_MATCHES(Tokenizer::from_file(dir / "no_unk.json"), d::DataError,
                       MessageContains({"no_unk.json", "[UNK]", "not in model.vocab"}));
  auto other = small_json();
  other["pre_tokenizer"] = {{"type", "ByteLevel"}};
  write_file(dir / "other.json", other.dump());
  CHECK_THROWS_MATCHES(Tokenizer::from_file(dir / "other.json"), d::DataError,
                       MessageContains({"other.json", "pre_tokenizer", "ByteLevel", "not supported"}));
  CHECK_THROWS_MATCHES(Tokenizer{}.encode("x"), d::DataError, MessageContains({"used before"}));
  CHECK_THROWS_MATCHES(Tokenizer::from_directory(dir.path()), d::DataError, MessageContains({"neither tokenizer.json nor vocab.txt"}));
}

TEST_CASE("WordPieceTokenizer from vocab.txt goes through a checkpoint into a Predictor", "[data][wordpiece]") {
  TempDir dir;
  std::string lines;
  for (const auto& t : kVocab) lines += t + "\n";
  write_file(dir / "vocab.txt", lines);
  const auto tok = Tokenizer::from_directory(dir.path(), {.max_length = 8});
  CHECK(tok.encode("Hello, unaffable World!") == Ids{2, 5, 6, 9, 10, 11, 7, 3});

  const auto labels = d::data::LabelEncoder::fit(std::vector<std::string>{"a", "b"});
  torch::manual_seed(3);
  auto net = std::make_shared<NetImpl>();
  const auto path = dtrain_test::save_checkpoint(dir / "run", *net, [&](auto& s) {
    s.with_object("vocab", tok).with_object("labels", labels);
  });
  auto ck = d::checkpointer::Checkpoint::open(path);
  REQUIRE(ck);
  Tokenizer back;
  ck->load_object("vocab", back);
  CHECK(back.encode("hello world") == tok.encode("hello world"));
  CHECK(back.json() == tok.json());
  d::data::WordVocabulary wrong;
  CHECK_THROWS_MATCHES(ck->load_object("vocab", wrong), d::Error, MessageContains({"WordPieceTokenizer", "WordVocabulary"}));

  auto p = d::evaluation::Predictor<std::shared_ptr<NetImpl>>::from_checkpoint<Tokenizer>(
      path, std::make_shared<NetImpl>(), d::evaluation::TextInputs{});
  const auto out = p.predict(std::vector<std::string>{"hello", "un world !"});
  torch::NoGradGuard no_grad;
  std::vector<d::data::Fields> samples(2);
  samples[0].set("input_ids", tok.transform("hello"));
  samples[1].set("input_ids", tok.transform("un world !"));
  const auto direct = torch::softmax(net->forward(d::data::pad_to_longest("input_ids", tok.pad_id())(samples)), 1);
  CHECK(torch::allclose(out.probabilities(), direct));
  // No type named: TextInputs reads from the checkpoint that it holds a WordPieceTokenizer (before,
  // it restored a WordVocabulary and failed with "holds a WordPieceTokenizer, not a WordVocabulary").
  auto unnamed = d::evaluation::Predictor<std::shared_ptr<NetImpl>>::from_checkpoint(
      path, std::make_shared<NetImpl>(), d::evaluation::TextInputs{});
  CHECK(torch::equal(unnamed.predict(std::vector<std::string>{"hello", "un world !"}).probabilities(),
                     out.probabilities()));
}

TEST_CASE("WordPieceTokenizer::with_max_length sets the truncation as tokenizers' enable_truncation", "[data][wordpiece]") {
  const auto tok = Tokenizer::from_json(small_json());
  const auto four = tok.with_max_length(4);
  CHECK(four.max_length() == 4);
  CHECK(four.encode("hello world hello world") == Ids{2, 5, 7, 3});  // [CLS] hello world [SEP]
  CHECK(four.json()["truncation"]["max_length"] == 4);
  CHECK(tok.with_max_length(0).max_length() == 0);
  CHECK(tok.with_max_length(0).encode("hello world hello world").size() == 6);
  CHECK_THROWS_MATCHES(tok.with_max_length(-1), d::DataError, MessageContains({"-1", "0 for no truncation"}));
  CHECK_THROWS_MATCHES(tok.with_max_length(1), d::DataError, MessageContains({"[CLS] and [SEP]", "2 or more"}));
}
