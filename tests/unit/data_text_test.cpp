// SPDX-License-Identifier: Apache-2.0
// The text pipeline's fast path and its second tokenizer: read_csv (one read, the same rows and
// errors as CsvSource), WordVocabulary::fit_transform / encode_all (one tokenising pass, the ids
// fit + encode give), and SentencePieceTokenizer (loaded at run time beside LibTorch; the ids of
// Debian's spm_encode; a round trip through a checkpoint).

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <dtrain/checkpointer/directory.hpp>
#include <dtrain/data/csv.hpp>
#include <dtrain/data/csv_table.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/data/sentencepiece.hpp>
#include <dtrain/data/splits.hpp>
#include <dtrain/error.hpp>
#include <dtrain/launch/group.hpp>
#include <dtrain/run_directory.hpp>

#if __has_include(<sentencepiece_processor.h>)
#include <sentencepiece_processor.h>
static_assert(sizeof(sentencepiece::SentencePieceProcessor) <=
                  dtrain::data::detail::SentencePieceLibrary::kProcessorBytes,
              "SentencePieceLibrary::kProcessorBytes is smaller than this SentencePiece's processor object");
#endif

#include "checkpoint_support.hpp"
#include "support.hpp"

namespace d = dtrain;
namespace fs = std::filesystem;
using dtrain_test::MessageContains;
using dtrain_test::TempDir;

namespace {
void write_file(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST_CASE("read_csv gives CsvSource's rows lines and errors", "[data][csv]") {
  TempDir dir;
  const d::data::CsvOptions typed{.types = {{"id", d::data::column_type::integer}, {"score", d::data::column_type::real}}};
  const std::vector<std::string> good = {
      "id,title,score\r\n1,plain,0.5\r\n2,\"with, comma\",1.5\r\n\n3,\"say \"\"hi\"\"\",\r\n4,\"two\nlines\",-2\n5,\"\",7",
      "id,title,score\n\n\n1,a\rb,+3\n\r\n2,\"x\"\r,1e3\n3,,\n",
      "id,title,score\n7,\"\"\"\"\"\",\" 8\"\n"};
  for (const auto& text : good) {
    write_file(dir / "g.csv", text);
    const d::data::CsvSource src(dir / "g.csv", typed);
    const auto table = d::data::read_csv(dir / "g.csv", typed);
    REQUIRE(table.size() == src.size());
    CHECK(table.columns() == src.columns());
    for (std::int64_t i = 0; i < src.size(); ++i) {
      const auto a = src.row(i), b = table.row(i);
      CHECK(a.line() == b.line());
      for (std::size_t c = 0; c < a.size(); ++c) CHECK(a.at(c) == b.at(c));
      CHECK(table.column("title")[i] == a.text("title"));
    }
  }
  write_file(dir / "g.csv", good[0]);
  const auto t = d::data::read_csv(dir / "g.csv", typed);
  CHECK(t.row(1).text("title") == "with, comma");
  CHECK(t.row(2).text("title") == "say \"hi\"");
  CHECK(t.row(3).text("title") == "two\nlines");
  CHECK(t.row(4).line() == 8);
  CHECK(t.row(0).number("score") == 0.5);
  CHECK_THROWS_MATCHES(t.column("name"), d::DataError, MessageContains({"g.csv", "\"name\"", "\"title\""}));

  // Every malformed file: the same message from both (the table checks typed cells when it reads).
  const std::vector<std::string> bad = {"a,n\nx,1\n\"open,2\n",  "a,n\n\"q\"x,1\n",       "a,n\nok,1\nx,a\"b\n",
                                        "a,n\nok,1\nx,1,extra\n", "",                       "a,n\nok,1\n\"multi\nline\",twelve\n",
                                        "a,n\nok,1\nx\n",         "a,n\n\"a\nb\"\"\",\"c"};
  for (const auto& text : bad) {
    write_file(dir / "bad.csv", text);
    const d::data::CsvOptions n_typed{.types = {{"n", d::data::column_type::integer}}};
    const auto expected = message_of([&] {
      const d::data::CsvSource src(dir / "bad.csv", n_typed);
      for (std::int64_t i = 0; i < src.size(); ++i) (void)src.row(i);
    });
    INFO(text);
    CHECK(expected.find("bad.csv") != std::string::npos);
    CHECK(message_of([&] { (void)d::data::read_csv(dir / "bad.csv", n_typed); }) == expected);
  }
}

TEST_CASE("Typed CSV cells parse without the locale and reject trailing text", "[data][csv]") {
  CHECK(std::get<double>(d::data::detail::typed_cell("2.5", d::data::column_type::real, "f", 1, 0, "x")) == 2.5);
  CHECK(std::get<double>(d::data::detail::typed_cell("-1e-3", d::data::column_type::real, "f", 1, 0, "x")) == -1e-3);
  CHECK(std::get<std::int64_t>(d::data::detail::typed_cell(" +42", d::data::column_type::integer, "f", 1, 0, "x")) == 42);
  CHECK_THROWS_MATCHES(d::data::detail::typed_cell("2,5", d::data::column_type::real, "f.csv", 3, 1, "x"), d::DataError,
                       MessageContains({"f.csv: line 3, column 2", "\"2,5\"", "real number"}));
  CHECK_THROWS_MATCHES(d::data::detail::typed_cell("7 ", d::data::column_type::integer, "f.csv", 3, 1, "x"), d::DataError,
                       MessageContains({"whole number"}));
  CHECK_THROWS_MATCHES(d::data::detail::typed_cell("+-1", d::data::column_type::integer, "f.csv", 3, 1, "x"), d::DataError,
                       MessageContains({"whole number"}));
}

TEST_CASE("fit_transform gives fit's vocabulary and encode_all's ids from one pass", "[data][preprocess]") {
  // 3,000 texts over 5,000 words (the token table grows many times); Zipf-like counts, so ties and
  // the max_words cut are both exercised.
  d::data::PythonRandom rng(7);
  std::vector<std::string> texts;
  for (int i = 0; i < 3000; ++i) {
    std::string t;
    const auto n = rng.below(40);
    for (std::uint64_t k = 0; k < n; ++k) {
      const auto w = rng.below(1 + rng.below(5000));
      t += (k % 7 == 3 ? "W" : "w") + std::to_string(w) + (k % 5 == 0 ? ", " : " ");
    }
    texts.push_back(t);
  }
  const auto [vocab, ids] = d::data::WordVocabulary::fit_transform(texts, 1000, 24);
  // The reference: count with std::map, rank by count then word.
  std::map<std::string, std::int64_t> counts;
  for (const auto& t : texts)
    for (const auto& tok : d::data::WordVocabulary::tokens(t, 24)) ++counts[tok];
  std::vector<std::pair<std::string, std::int64_t>> ranked(counts.begin(), counts.end());
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  ranked.resize(1000);
  REQUIRE(vocab.words().size() == 1000);
  for (std::size_t k = 0; k < 1000; ++k) CHECK(vocab.words()[k] == ranked[k].first);
  CHECK(vocab.words() == d::data::WordVocabulary::fit(texts, 1000, 24).words());
  const auto again = vocab.encode_all(texts);
  REQUIRE(ids.size() == 3000);
  REQUIRE(again.size() == 3000);
  std::int64_t empty = 0;
  for (std::int64_t i = 0; i < ids.size(); ++i) {
    const auto expected = vocab.encode(texts[static_cast<std::size_t>(i)]);
    CHECK(std::vector<std::int64_t>(ids[i].begin(), ids[i].end()) == expected);
    CHECK(std::vector<std::int64_t>(again[i].begin(), again[i].end()) == expected);
    CHECK(torch::equal(ids.tensor(i), torch::tensor(expected)));
    empty += texts[static_cast<std::size_t>(i)].empty();
  }
  CHECK(empty > 0);  // texts without tokens encode as {<unk>} on both paths
  CHECK_THROWS_MATCHES(ids[3000], d::DataError, MessageContains({"3000", "[0, 3000)"}));
}

namespace {
// Sentences from a fixed grammar: enough shared sub-words for a 50-piece model.
std::vector<std::string> sentences(int n) {
  const std::vector<std::string> stems = {"network", "partition", "manager", "daemon", "library", "server",
                                          "editor",  "compiler",  "game",    "puzzle", "backup",  "monitor"};
  const std::vector<std::string> tails = {"", "s", "ing", "ed", "er", "ly"};
  d::data::PythonRandom rng(3);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string s;
    for (std::uint64_t k = 0, m = 3 + rng.below(10); k < m; ++k)
      s += stems[rng.below(stems.size())] + tails[rng.below(tails.size())] + " ";
    s += "v" + std::to_string(rng.below(100));
    out.push_back(s);
  }
  return out;
}

}  // namespace

TEST_CASE("SentencePieceTokenizer fits beside LibTorch and encodes as spm_encode does", "[data][preprocess][sentencepiece]") {
  TempDir dir;
  const auto texts = sentences(2000);
  const auto tok = d::data::SentencePieceTokenizer::fit(texts, {.vocab_size = 50, .max_len = 0});
  CHECK(tok.size() == 50);
  const auto ids = tok.encode(texts[0]);
  REQUIRE(!ids.empty());
  for (auto id : ids) CHECK((id > d::data::SentencePieceTokenizer::unk_id && id < 50));
  CHECK(tok.encode("") == std::vector<std::int64_t>{d::data::SentencePieceTokenizer::unk_id});

  // Debian's command-line encoder (package sentencepiece) on the same model and texts.
  write_file(dir / "m.model", tok.model());
  std::string lines;
  for (int i = 0; i < 50; ++i) lines += texts[static_cast<std::size_t>(i)] + "\n";
  lines += "unseen Wörter und Zeichen: ünïcödé, QQQ\n";
  write_file(dir / "in.txt", lines);
  const auto cmd = "spm_encode --model=" + (dir / "m.model").string() + " --output_format=id < " +
                   (dir / "in.txt").string() + " > " + (dir / "out.txt").string();
  INFO("spm_encode failed; install Debian's sentencepiece (scripts/install-deps, the test set)");
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream out(dir / "out.txt");
  std::istringstream in(lines);
  std::string expected_line, text;
  int compared = 0;
  while (std::getline(in, text) && std::getline(out, expected_line)) {
    std::istringstream nums(expected_line);
    std::vector<std::int64_t> expected;
    for (std::int64_t v; nums >> v;) expected.push_back(v);
    INFO(text);
    CHECK(tok.encode(text) == expected);
    ++compared;
  }
  CHECK(compared == 51);

  // max_len cuts the ids; encode_all is encode per text.
  const auto cut = d::data::SentencePieceTokenizer::fit(texts, {.vocab_size = 50, .max_len = 3});
  CHECK(cut.encode(texts[0]).size() == std::min<std::size_t>(3, ids.size()));
  const auto all = tok.encode_all(std::vector<std::string>{texts[0], ""});
  CHECK(std::vector<std::int64_t>(all[0].begin(), all[0].end()) == ids);

  // Through a checkpoint: the same model bytes and ids; another type's object is refused.
  torch::nn::Linear model(2, 2);
  const auto path = dtrain_test::save_checkpoint(dir / "run", *model, [&](auto& s) { s.with_object("tokenizer", tok); });
  auto ck = d::checkpointer::Checkpoint::open(path);
  REQUIRE(ck);
  d::data::SentencePieceTokenizer back;
  CHECK_THROWS_MATCHES(back.encode("x"), d::DataError, MessageContains({"before fit"}));
  ck->load_object("tokenizer", back);
  CHECK(back.model() == tok.model());
  CHECK(back.encode(texts[1]) == tok.encode(texts[1]));
  d::data::WordVocabulary wrong;
  CHECK_THROWS_MATCHES(ck->load_object("tokenizer", wrong), d::Error, MessageContains({"SentencePieceTokenizer", "WordVocabulary"}));

  // A damaged model is an error from SentencePiece, not a crash; so are bad trainer flags.
  CHECK_THROWS_MATCHES(d::data::detail::SentencePieceProcessor("not a model"), d::DataError, MessageContains({"does not load"}));
  CHECK_THROWS_MATCHES(d::data::SentencePieceTokenizer::fit(texts, {.vocab_size = 50, .model_type = "nonsense"}),
                       d::DataError, MessageContains({"trainer failed", "nonsense"}));
}
