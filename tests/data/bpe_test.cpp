// SPDX-License-Identifier: Apache-2.0
// data::BpeTokenizer's C++ API on small tokenizer.json files followed by hand: the split patterns,
// merges by rank, ignore_merges, added tokens, the template's BOS and EOS, truncation and padding,
// decoding (bytes back, invalid UTF-8 as U+FFFD, byte fallback), clear errors for files it cannot
// use, and a round trip through a checkpoint into a Predictor. Ids against Hugging Face tokenizers
// on real texts: check_bpe.py (data.bpe_matches_hf_tokenizers).

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <dtrain/checkpointer/directory.hpp>
#include <dtrain/data/bpe_tokenizer.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/data/wordpiece.hpp>
#include <dtrain/error.hpp>
#include <dtrain/evaluation/predictor.hpp>
#include <dtrain/launch/group.hpp>

#include "../unit/checkpoint_support.hpp"
#include "../unit/support.hpp"

namespace d = dtrain;
namespace fs = std::filesystem;
namespace bpe = dtrain::data::detail::bpe;
using dtrain_test::MessageContains;
using dtrain_test::TempDir;
using Tokenizer = d::data::BpeTokenizer;
using Ids = std::vector<std::int64_t>;
using json = nlohmann::json;

namespace {
void write_file(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// The pieces `pattern` cuts `text` into.
std::vector<std::string> pieces(bpe::Pattern pattern, std::string_view text) {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges;
  bpe::split(pattern, text, ranges);
  std::vector<std::string> out;
  for (const auto& [b, e] : ranges) out.emplace_back(text.substr(b, e - b));
  return out;
}

// A byte-level BPE of GPT-2's kind, small enough to follow by hand: every byte as its printable
// character with the byte as its id (' ' is "Ġ", 32), then the merges below (ids 256...), "abc"
// (which no merge makes) and <|endoftext|>.
constexpr std::int64_t kBc = 256, kAb = 257, kSpaceT = 258, kHe = 259, kSpaceThe = 260, kAbc = 261, kEot = 262;
json gpt2_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[bpe::byte_chars()[static_cast<std::size_t>(b)]] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"b", "c"}, {"a", "b"}, {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}};
  json list = json::array();
  for (const auto& [a, b] : merges) {
    vocab[a + b] = static_cast<std::int64_t>(vocab.size());
    list.push_back(a + " " + b);  // the "a b" form (the [a, b] form: llama3_json)
  }
  vocab["abc"] = kAbc;
  vocab["<|endoftext|>"] = kEot;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens",
           {{{"id", kEot},
             {"content", "<|endoftext|>"},
             {"single_word", false},
             {"lstrip", false},
             {"rstrip", false},
             {"normalized", true},
             {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"post_processor",
           {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", list}}}};
}

// The same vocabulary the way Llama 3's file has it: its split pattern then ByteLevel without its
// own, ignore_merges, special tokens after the vocabulary, "<bos> $A <eos>" (Llama 3 has no EOS
// in its template; this one does, to test both ends).
constexpr std::int64_t kBos = 263, kEnd = 264;
json llama3_json() {
  auto j = gpt2_json();
  json pairs = json::array();
  for (const auto& m : j["model"]["merges"]) {
    const auto s = m.get<std::string>();
    pairs.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  j["model"]["merges"] = pairs;
  j["model"]["ignore_merges"] = true;
  j["model"]["vocab"].erase("<|endoftext|>");  // ids stay: 262 is vocab.size(), the first added token's
  j["added_tokens"] = json::array();
  for (const auto& t : {"<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>"})
    j["added_tokens"].push_back({{"id", 0},
                                 {"content", t},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", std::string(bpe::kLlama3Pattern)}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  const auto special = [](const char* name, std::int64_t id) {
    return json{{"id", name}, {"ids", {id}}, {"tokens", {name}}};
  };
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
           {{"SpecialToken", {{"id", "<|end_of_text|>"}, {"type_id", 0}}}}}},
         {"pair", json::array()},
         {"special_tokens",
          {{"<|begin_of_text|>", special("<|begin_of_text|>", kBos)},
           {"<|end_of_text|>", special("<|end_of_text|>", kEnd)}}}}}}};
  return j;
}

// The checkpoint's model: a masked sum of embeddings of the ids.
struct NetImpl : torch::nn::Module {
  torch::nn::Embedding emb{nullptr};
  NetImpl() { emb = register_module("emb", torch::nn::Embedding(kEnd + 1, 2)); }
  torch::Tensor forward(const d::data::Fields& b) {
    const auto keep = b["attention_mask"].unsqueeze(-1).to(torch::kFloat32);
    return (emb->forward(b["input_ids"]) * keep).sum(1);
  }
};
}  // namespace

TEST_CASE("BpeTokenizer's scanners split as GPT-2's and Llama 3's patterns do", "[data][bpe]") {
  using P = bpe::Pattern;
  using S = std::vector<std::string>;
  // ` ?\p{L}+` takes one space; a run of spaces before a word leaves that one (`\s+(?!\S)`);
  // contractions are lower case only; trailing whitespace is one piece.
  CHECK(pieces(P::gpt2, "Hello  world's 123\n\n") == S{"Hello", " ", " world", "'s", " 123", "\n\n"});
  CHECK(pieces(P::gpt2, "WORLD'S x'll ''s") == S{"WORLD", "'", "S", " x", "'ll", " ''", "s"});
  CHECK(pieces(P::gpt2, " \t a") == S{" \t", " a"});
  CHECK(pieces(P::gpt2, "(hello) 12,5") == S{"(", "hello", ")", " 12", ",", "5"});
  // Llama 3: case-insensitive contractions (and U+017F long s), a punctuation or space before a
  // word, digits three by three, newlines with the whitespace before them.
  CHECK(pieces(P::llama3, "Hello  WORLD'S 1234\r\n\tx") ==
        S{"Hello", " ", " WORLD", "'S", " ", "123", "4", "\r\n", "\tx"});
  CHECK(pieces(P::llama3, "(hello) it\u017F 'Dog") == S{"(hello", ")", " it\u017F", " '", "Dog"});
  CHECK(pieces(P::llama3, "x'\u017Fy") == S{"x", "'\u017F", "y"});
  CHECK(pieces(P::llama3, "a  \n  b.\n\nc") == S{"a", "  \n", " ", " b", ".\n\n", "c"});
  CHECK(pieces(P::qwen2, "x 1234") == S{"x", " ", "1", "2", "3", "4"});
  // Letters, numbers and whitespace are Oniguruma's: CJK and accents are letters, U+3000 is a
  // space, ² a number, emoji neither.
  CHECK(pieces(P::gpt2, "日本\u3000caf\u00e9\u00b2 😀👍") == S{"日本", "\u3000", "caf\u00e9", "\u00b2", " 😀👍"});
  // Bytes that are not UTF-8 are characters of their own, neither letters nor spaces.
  CHECK(pieces(P::gpt2, "ab\xff\xfe cd") == S{"ab", "\xff\xfe", " cd"});
  CHECK(pieces(P::gpt2, "").empty());
}

TEST_CASE("BpeTokenizer runs other patterns through PCRE2, with Oniguruma's classes", "[data][bpe]") {
  using S = std::vector<std::string>;
  using Keep = bpe::Splitter::Keep;
  const auto split = [](const char* re, Keep keep, std::string_view text) {
    bpe::Splitter s;
    s.regex = std::make_shared<const d::data::detail::Regex>(re);
    s.keep = keep;
    std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges;
    s.pieces(text, ranges);
    S out;
    for (const auto& [b, e] : ranges) out.emplace_back(text.substr(b, e - b));
    return out;
  };
  // tokenizers' behaviors: Isolated keeps the matches and what lies between them, Removed what lies
  // between, Removed inverted (CLIP's) the matches.
  CHECK(split("\\d+", Keep::all, "ab12cd3") == S{"ab", "12", "cd", "3"});
  CHECK(split("\\d+", Keep::gaps, "ab12cd3") == S{"ab", "cd"});
  CHECK(split("\\d+", Keep::matches, "ab12cd3") == S{"12", "3"});
  // Oniguruma's classes, not PCRE2's: U+1C89 is a letter (Unicode 16), U+180E is not \s and U+0085
  // is, superscript two is \w.
  CHECK(split("\\p{L}+", Keep::matches, "a\u1C89b c") == S{"a\u1C89b", "c"});
  CHECK(split("\\s+", Keep::gaps, "a\u180Eb\u0085c") == S{"a\u180Eb", "c"});
  CHECK(split("\\w+", Keep::matches, "x\u00b2 y") == S{"x\u00b2", "y"});
  CHECK(split("[^\\s\\p{L}]+", Keep::matches, "a\u1C89!?") == S{"!?"});
  // An empty match moves on one character; bytes that are not UTF-8 never match.
  CHECK(split("x*", Keep::matches, "axxb") == S{"xx"});
  CHECK(split("[^a]+", Keep::matches, "a\xff"
                                       "b") == S{"b"});

  // Through a tokenizer.json: a Split on a string is that string, its punctuation literal.
  auto j = llama3_json();
  auto& step = j["pre_tokenizer"]["pretokenizers"][0];
  step = {{"type", "Split"}, {"pattern", {{"String", "."}}}, {"behavior", "Isolated"}, {"invert", false}};
  CHECK(Tokenizer::from_json(j).encode("abc.abc", false) == Ids{kAbc, '.', kAbc});
  step = {{"type", "Split"}, {"pattern", {{"String", "b"}}}, {"behavior", "Removed"}, {"invert", false}};
  CHECK(Tokenizer::from_json(j).encode("abc", false) == Ids{'a', 'c'});
  // CLIP's normalizers: Replace of a regular expression, then Lowercase (U+0130 becomes two characters).
  j = llama3_json();
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", "b"}},
                       {{"type", "Lowercase"}}}}};
  CHECK(Tokenizer::from_json(j).encode("A \t\nC", false) == Ids{kAbc});
  std::string lower;
  bpe::lowercase("\u00c0B \u0130\xff", lower);
  CHECK(lower == "\u00e0b i\u0307\xff");
}

TEST_CASE("BpeTokenizer's NFC composes as tokenizers' does", "[data][bpe]") {
  std::string out;
  const auto nfc = [&](std::string_view s) {
    bpe::nfc(s, out);
    return out;
  };
  CHECK(nfc("plain ASCII, and \u00e9 below U+0300") == "plain ASCII, and \u00e9 below U+0300");
  CHECK(nfc("e\u0301") == "\u00e9");
  CHECK(nfc("A\u0301\u0316") == "\u00c1\u0316");  // marks in canonical order; the acute still joins A
  CHECK(nfc("\u1100\u1161\u11a8") == "\uac01");   // Hangul jamo: L V T
  CHECK(nfc("\u212b") == "\u00c5");               // the Angstrom sign: a singleton
  CHECK(nfc("\xff"
            "e\u0301") == "\xff\u00e9");  // a byte that is not UTF-8 stays
  auto j = llama3_json();
  j["normalizer"] = {{"type", "NFC"}};
  const auto tok = Tokenizer::from_json(j);
  CHECK(tok.encode("e\u0301", false) == Ids{0xc3, 0xa9});  // é's bytes
}

TEST_CASE("BpeTokenizer merges lowest rank first, as tokenizers does", "[data][bpe]") {
  const auto tok = Tokenizer::from_json(gpt2_json());
  // a b c: (b c) has rank 0, (a b) rank 1: bc first, then nothing joins a and bc.
  CHECK(tok.encode("abc") == Ids{'a', kBc});
  CHECK(tok.encode("x the") == Ids{'x', kSpaceThe});  // Ġ t -> Ġt, h e -> he, Ġt he -> Ġthe
  CHECK(tok.encode("the") == Ids{'t', kHe});
  CHECK(tok.encode("ab") == Ids{kAb});
  CHECK(tok.encode("") == Ids{});
  CHECK(tok.encode("\xe4\xb8\xad") == Ids{0xe4, 0xb8, 0xad});  // 中: its three bytes
  // Special tokens typed in the text are those tokens, never split.
  CHECK(tok.encode("a<|endoftext|>b") == Ids{'a', kEot, 'b'});
  CHECK(tok.encode("<|endoftext|") == Ids{'<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|'});
  // ignore_merges: a word that is in the vocabulary is that token, whatever the merges say.
  auto j = gpt2_json();
  j["model"]["ignore_merges"] = true;
  CHECK(Tokenizer::from_json(j).encode("abc") == Ids{kAbc});
  CHECK(Tokenizer::from_json(j).encode("abcabc") == Ids{'a', kBc, 'a', kBc});
  // What the tokenizer is.
  CHECK(tok.size() == kEot + 1);
  CHECK(tok.token_to_id("Ġthe") == kSpaceThe);
  CHECK(tok.token_to_id("<|endoftext|>") == kEot);
  CHECK_FALSE(tok.token_to_id("nope"));
  CHECK(tok.id_to_token(kSpaceThe) == "Ġthe");
  CHECK_FALSE(tok.id_to_token(kEot + 1));
  CHECK_FALSE(tok.id_to_token(-1));
  CHECK(tok.eos_id() == kEot);  // GPT-2's file names no EOS: the added <|endoftext|>
  CHECK_FALSE(tok.bos_id());
  CHECK_FALSE(tok.add_bos());
  CHECK_FALSE(tok.add_eos());
  CHECK(tok.pad_id() == kEot);  // no padding, no pad token: EOS
}

TEST_CASE("BpeTokenizer decodes bytes back to text as tokenizers does", "[data][bpe]") {
  const auto tok = Tokenizer::from_json(gpt2_json());
  for (const std::string text :
       {"x the", "Hello  world's 123\n\n", "日本\u3000café 😀👍🏽", "a<|endoftext|>b", ""})
    CHECK(tok.decode(tok.encode(text), false) == text);
  CHECK(tok.decode(tok.encode("a<|endoftext|>b")) == "ab");  // special tokens skipped
  CHECK(tok.decode(Ids{0xe4, 0xb8}) == "\xEF\xBF\xBD");      // a cut character: one U+FFFD
  CHECK(tok.decode(Ids{0xff, 'a', 0xe4, 0xb8, 0xad}) ==
        "\xEF\xBF\xBD"
        "a中");
  CHECK(tok.decode(Ids{'a', 100000, -1, 'b'}) == "ab");  // ids outside the vocabulary are dropped
  CHECK(tok.decode(torch::tensor(std::vector<std::int64_t>{'x', kSpaceThe})) == "x the");
  CHECK_THROWS_MATCHES(tok.decode(torch::zeros({2, 2}, torch::kInt64)), d::DataError, MessageContains({"1-D"}));
}

TEST_CASE("BpeTokenizer adds the template's BOS and EOS, truncates and pads", "[data][bpe]") {
  const auto tok = Tokenizer::from_json(llama3_json());
  REQUIRE(tok.token_to_id("<|begin_of_text|>") == kBos);  // added after the vocabulary, in file order
  CHECK(tok.encode("abc") == Ids{kBos, kAbc, kEnd});      // ignore_merges
  CHECK(tok.encode("abc", false) == Ids{kAbc});
  CHECK(tok.encode("x the<|end_of_text|>", false) == Ids{'x', kSpaceThe, kEnd});
  CHECK(tok.add_bos());
  CHECK(tok.add_eos());
  CHECK(tok.bos_id() == kBos);
  CHECK(tok.eos_id() == kEnd);
  CHECK(tok.transform("ab").equal(torch::tensor(Ids{kBos, kAb, kEnd})));

  // max_length counts the special tokens; the text is cut on the side asked for.
  const auto three = tok.with_max_length(3);
  CHECK(three.max_length() == 3);
  CHECK(three.encode("ab the the") == Ids{kBos, kAb, kEnd});
  CHECK(three.encode("ab the the", false) == Ids{kAb, kSpaceThe, kSpaceThe});
  CHECK(tok.with_max_length(3, Tokenizer::Side::left).encode("ab the the") == Ids{kBos, kSpaceThe, kEnd});
  CHECK(three.json()["truncation"]["max_length"] == 3);
  CHECK(tok.with_max_length(2).encode("ab") == Ids{kBos, kEnd});
  CHECK(three.with_max_length(0).encode("ab the the").size() == 5);
  CHECK_THROWS_MATCHES(tok.with_max_length(1), d::DataError, MessageContains({"shorter than the 2 special tokens"}));
  CHECK_THROWS_MATCHES(tok.with_max_length(-1), d::DataError, MessageContains({"-1", "0 for no truncation"}));

  // Padding: none by default; with_padding pads a batch to its longest, on the side asked for.
  CHECK(tok.encoding("ab").attention_mask == Ids{1, 1, 1});
  const std::vector<std::string> texts = {"ab", "ab the the"};
  const auto plain = tok.encode_batch(texts);
  CHECK(plain[0].input_ids.size() == 3);
  const auto left = tok.with_padding(Tokenizer::Side::left);
  CHECK(left.pad_id() == kEnd);  // no pad token: EOS
  const auto batch = left.encode_batch(texts);
  CHECK(batch[0].input_ids == Ids{kEnd, kEnd, kBos, kAb, kEnd});
  CHECK(batch[0].attention_mask == Ids{0, 0, 1, 1, 1});
  CHECK(batch[1].input_ids == Ids{kBos, kAb, kSpaceThe, kSpaceThe, kEnd});
  const auto right = tok.with_padding(Tokenizer::Side::right).encode_batch(texts, 2, false);
  CHECK(right[0].input_ids == Ids{kAb, kEnd, kEnd});
  CHECK(right[0].attention_mask == Ids{1, 0, 0});
  CHECK(left.without_padding().encode_batch(texts)[0].input_ids.size() == 3);
  // Many texts on threads: the same as one by one.
  std::vector<std::string> many;
  for (int i = 0; i < 1000; ++i)
    many.push_back(std::string(static_cast<std::size_t>(i % 7), 'a') + " the" + std::to_string(i));
  const auto on_threads = left.encode_batch(many, 4);
  const auto one = left.encode_batch(many, 1);
  for (std::size_t i = 0; i < many.size(); ++i) REQUIRE(on_threads[i].input_ids == one[i].input_ids);

  // with_eos: another token ends a sequence (an instruct model's <|eot_id|>); it is saved.
  CHECK(tok.with_eos("<|endoftext|>").eos_id() == kEot);
  CHECK_THROWS_MATCHES(tok.with_eos("<|nope|>"), d::DataError, MessageContains({"<|nope|>", "not a token"}));
}

TEST_CASE("BpeTokenizer's added tokens strip spaces and keep to whole words as asked", "[data][bpe]") {
  auto j = gpt2_json();
  const auto added = [&](const char* content, bool lstrip, bool rstrip, bool single_word) {
    j["added_tokens"].push_back({{"id", 0},
                                 {"content", content},
                                 {"single_word", single_word},
                                 {"lstrip", lstrip},
                                 {"rstrip", rstrip},
                                 {"normalized", false},
                                 {"special", false}});
  };
  added("<mask>", true, false, false);
  added("[R]", false, true, false);
  added("zz", false, false, true);
  const auto tok = Tokenizer::from_json(j);
  const auto mask = *tok.token_to_id("<mask>"), r = *tok.token_to_id("[R]"), zz = *tok.token_to_id("zz");
  CHECK(mask == kEot + 1);                           // the next id after the vocabulary
  CHECK(tok.encode("x  <mask>") == Ids{'x', mask});  // lstrip takes the spaces before it
  CHECK(tok.encode("[R]  x") == Ids{r, 'x'});        // rstrip the spaces after it
  CHECK(tok.encode("zz y") == Ids{zz, ' ', 'y'});
  CHECK(tok.encode("xzz") == Ids{'x', 'z', 'z'});              // single_word: not inside a word
  CHECK(tok.encode("zz_") == Ids{'z', 'z', '_'});              // '_' is a word character
  CHECK(tok.decode(tok.encode("a <mask> b")) == "a<mask> b");  // not special: kept, its space gone
}

TEST_CASE("BpeTokenizer falls back to bytes and fuses unknowns as Llama 2's BPE does", "[data][bpe]") {
  const json j = {
      {"added_tokens", {{{"id", 0}, {"content", "<unk>"}, {"normalized", false}, {"special", true}}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "▁"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}}},
      {"pre_tokenizer", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", {{"<unk>", 0}, {"<0xC3>", 1}, {"<0xA9>", 2}, {"a", 3}, {"b", 4}, {"ab", 5}, {"▁", 6}, {"▁ab", 7}}},
        {"merges", {"a b", "▁ ab"}}}}};
  const auto tok = Tokenizer::from_json(j);
  CHECK(tok.encode("abé") == Ids{7, 1, 2});    // ▁ab, then é's two bytes
  CHECK(tok.encode("ab xy") == Ids{7, 6, 0});  // x and y: one <unk>, fused
  CHECK(tok.decode(Ids{7, 1, 2}) == "abé");
  CHECK(tok.decode(Ids{7, 1}) == "ab\xEF\xBF\xBD");  // a byte that is not UTF-8 alone
  CHECK(tok.decode(Ids{7, 0}, false) == "ab<unk>");
}

TEST_CASE("BpeTokenizer refuses files it cannot use and names them", "[data][bpe]") {
  TempDir dir;
  CHECK_THROWS_MATCHES(Tokenizer::from_file(dir / "missing.json"), d::DataError,
                       MessageContains({"missing.json", "cannot read"}));
  write_file(dir / "bad.json", "{nope");
  CHECK_THROWS_MATCHES(Tokenizer::from_file(dir / "bad.json"), d::DataError,
                       MessageContains({"bad.json", "is not JSON"}));
  write_file(dir / "wordpiece.json", json{{"model", {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}}}}.dump());
  CHECK_THROWS_MATCHES(Tokenizer::from_file(dir / "wordpiece.json"), d::DataError,
                       MessageContains({"wordpiece.json", "\"WordPiece\"", "not BPE"}));
  CHECK_THROWS_MATCHES(Tokenizer::from_directory(dir.path()), d::DataError, MessageContains({"has no tokenizer.json"}));
  CHECK_THROWS_MATCHES(Tokenizer{}.encode("x"), d::DataError, MessageContains({"used before"}));

  const auto refused = [](const std::function<void(json&)>& edit) {
    auto j = gpt2_json();
    edit(j);
    return [j] { Tokenizer::from_json(j, "edited.json"); };
  };
  const auto split = [](const char* kind, const char* pattern, const char* behavior = "Isolated") {
    return [=](json& j) {
      j["pre_tokenizer"] = {{"type", "Sequence"},
                            {"pretokenizers",
                             {{{"type", "Split"}, {"pattern", {{kind, pattern}}}, {"behavior", behavior}, {"invert", false}},
                              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    };
  };
  CHECK_THROWS_MATCHES(refused(split("Regex", "(a|b"))(), d::DataError,
                       MessageContains({"edited.json", "pre_tokenizer Split", "\"(a|b\" does not compile", "PCRE2"}));
  CHECK_THROWS_MATCHES(refused(split("Regex", "[^\\S\\d]+"))(), d::DataError,
                       MessageContains({"edited.json", "\\S inside a character class"}));
  CHECK_THROWS_MATCHES(refused(split("Regex", "\\w+", "MergedWithPrevious"))(), d::DataError,
                       MessageContains({"edited.json", "behavior \"MergedWithPrevious\"", "Isolated, or Removed"}));
  CHECK_THROWS_MATCHES(refused([](json& j) {
                         j["pre_tokenizer"] = {{"type", "Whitespace"}};
                       })(),
                       d::DataError, MessageContains({"pre_tokenizer \"Whitespace\" is not supported"}));
  CHECK_THROWS_MATCHES(refused([](json& j) {
                         j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", "a{2,1}"}}}, {"content", ""}};
                       })(),
                       d::DataError, MessageContains({"edited.json", "normalizer Replace", "does not compile"}));
  CHECK_THROWS_MATCHES(refused([](json& j) {
                         j["normalizer"] = {{"type", "NFKC"}};
                       })(),
                       d::DataError, MessageContains({"normalizer \"NFKC\" is not supported"}));
  CHECK_THROWS_MATCHES(refused([](json& j) {
                         j["decoder"] = {{"type", "WordPiece"}};
                       })(),
                       d::DataError, MessageContains({"decoder \"WordPiece\" is not supported"}));
  CHECK_THROWS_MATCHES(refused([](json& j) {
                         j["post_processor"] = {{"type", "Whatever"}};
                       })(),
                       d::DataError, MessageContains({"post_processor \"Whatever\" is not supported"}));
  CHECK_THROWS_MATCHES(refused([](json& j) { j["model"]["dropout"] = 0.1; })(), d::DataError,
                       MessageContains({"dropout"}));
  CHECK_THROWS_MATCHES(refused([](json& j) { j["model"]["merges"].push_back("abc"); })(), d::DataError,
                       MessageContains({"model.merges[5] \"abc\"", "not two tokens separated by one space"}));
  CHECK_THROWS_MATCHES(refused([](json& j) {
                         j["model"]["merges"].push_back(json::array({"a", "b"}));
                       })(),
                       d::DataError, MessageContains({"model.merges[5]", "every merge is"}));
  CHECK_THROWS_MATCHES(refused([](json& j) { j["model"]["merges"].push_back("a <nope>"); })(), d::DataError,
                       MessageContains({"\"<nope>\", which model.vocab lacks"}));
  CHECK_THROWS_MATCHES(refused([](json& j) { j["model"]["merges"].push_back("c b"); })(), d::DataError,
                       MessageContains({"makes \"cb\", which model.vocab lacks"}));
  CHECK_THROWS_MATCHES(refused([](json& j) { j["model"]["vocab"] = json::object(); })(), d::DataError,
                       MessageContains({"model.vocab is missing or empty"}));
  CHECK_THROWS_MATCHES(refused([](json& j) { j["model"]["vocab"]["x"] = -3; })(), d::DataError,
                       MessageContains({"model.vocab[\"x\"] is -3, not an id"}));
  CHECK_THROWS_MATCHES(refused([](json& j) {
                         j["truncation"] = {{"max_length", 8}, {"strategy", "OnlySecond"}};
                       })(),
                       d::DataError, MessageContains({"OnlySecond"}));
  CHECK_THROWS_MATCHES(refused([](json& j) { j["added_tokens"][0]["content"] = 5; })(), d::DataError,
                       MessageContains({"edited.json", "unexpected content"}));
  // An unk_token the vocabulary lacks: the file reads (as in tokenizers), a text that needs it fails.
  const json no_unk = {
      {"model", {{"type", "BPE"}, {"unk_token", "<unk>"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}}};
  const auto tok = Tokenizer::from_json(no_unk);
  CHECK(tok.encode("aa") == Ids{0, 0});
  CHECK_THROWS_MATCHES(tok.encode("ab"), d::DataError, MessageContains({"unk_token <unk> is not in model.vocab"}));
}

TEST_CASE("BpeTokenizer reads a model directory's tokenizer_config.json and goes through a checkpoint into a Predictor",
          "[data][bpe]") {
  TempDir dir;
  write_file(dir / "tokenizer.json", llama3_json().dump());
  write_file(dir / "tokenizer_config.json",
             json{{"bos_token", "<|begin_of_text|>"}, {"eos_token", {{"content", "<|endoftext|>"}}}}.dump());
  const auto tok = Tokenizer::from_directory(dir.path());
  CHECK(tok.eos_id() == kEot);  // the config's eos_token, over the template's
  CHECK(tok.bos_id() == kBos);
  CHECK(tok.encode("abc") == Ids{kBos, kAbc, kEnd});
  write_file(dir / "tokenizer_config.json", json{{"eos_token", "<|gone|>"}}.dump());
  CHECK_THROWS_MATCHES(Tokenizer::from_directory(dir.path()), d::DataError, MessageContains({"eos_token <|gone|>"}));

  // Saved and loaded: the same tokenizer, the names from tokenizer_config.json included.
  const auto padded = tok.with_padding(Tokenizer::Side::right);
  torch::serialize::OutputArchive out;
  padded.save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  Tokenizer back;
  back.load(in);
  CHECK(back.json() == padded.json());
  CHECK(back.eos_id() == kEot);
  CHECK(back.encode_batch(std::vector<std::string>{"ab", "x the"})[0].input_ids == Ids{kBos, kAb, kEnd, kEot});

  const auto labels = d::data::LabelEncoder::fit(std::vector<std::string>{"a", "b"});
  torch::manual_seed(3);
  auto net = std::make_shared<NetImpl>();
  const auto path = dtrain_test::save_checkpoint(
      dir / "run", *net, [&](auto& s) { s.with_object("vocab", padded).with_object("labels", labels); });
  auto ck = d::checkpointer::Checkpoint::open(path);
  REQUIRE(ck);
  d::data::WordPieceTokenizer wrong;
  CHECK_THROWS_MATCHES(ck->load_object("vocab", wrong), d::Error,
                       MessageContains({"BpeTokenizer", "WordPieceTokenizer"}));
  // No type named: TextInputs reads from the checkpoint that it holds a BpeTokenizer.
  auto p = d::evaluation::Predictor<std::shared_ptr<NetImpl>>::from_checkpoint(path, std::make_shared<NetImpl>(),
                                                                               d::evaluation::TextInputs{});
  const auto got = p.predict(std::vector<std::string>{"ab", "x the abc"});
  torch::NoGradGuard no_grad;
  std::vector<d::data::Fields> samples(2);
  samples[0].set("input_ids", tok.transform("ab"));
  samples[1].set("input_ids", tok.transform("x the abc"));
  const auto direct = torch::softmax(net->forward(d::data::pad_to_longest("input_ids", tok.pad_id())(samples)), 1);
  CHECK(torch::allclose(got.probabilities(), direct));
}
