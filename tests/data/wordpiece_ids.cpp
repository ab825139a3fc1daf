// SPDX-License-Identifier: Apache-2.0
// dtrain's WordPiece ids of texts, for check_wordpiece.py to compare with Hugging Face tokenizers.
//
//   wordpiece_ids (--tokenizer tokenizer.json | --vocab vocab.txt [--cased] [--keep-accents])
//                 IN.jsonl OUT.jsonl
//
// IN: one {"text": ..., "pair": ... (optional)} a line. OUT: one line per input line with
// "ids" (encode(text): the pipeline's unpadded ids), "single" (encoding(text) or encoding(text, pair))
// and "batch" (encode_batch over every text without a pair, in order), each
// {"input_ids", "attention_mask", "token_type_ids"}.
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/data/wordpiece.hpp>

namespace {
nlohmann::json as_json(const dtrain::data::WordPieceEncoding& e) {
  return {{"input_ids", e.input_ids}, {"attention_mask", e.attention_mask}, {"token_type_ids", e.token_type_ids}};
}
}  // namespace

int main(int argc, char** argv) try {
  std::string tokenizer, vocab;
  dtrain::data::WordPieceTokenizer::Options options;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) tokenizer = argv[++i];
    else if (a == "--vocab" && i + 1 < argc) vocab = argv[++i];
    else if (a == "--cased") options.lowercase = false;
    else if (a == "--keep-accents") options.strip_accents = false;
    else files.push_back(a);
  }
  if (files.size() != 2 || tokenizer.empty() == vocab.empty()) {
    std::cerr << "usage: wordpiece_ids (--tokenizer tokenizer.json | --vocab vocab.txt [--cased] [--keep-accents]) "
                 "IN.jsonl OUT.jsonl\n";
    return 2;
  }
  const auto tok = tokenizer.empty() ? dtrain::data::WordPieceTokenizer::from_vocab(vocab, options)
                                     : dtrain::data::WordPieceTokenizer::from_file(tokenizer);
  std::ifstream in(files[0]);
  std::vector<nlohmann::json> rows;
  std::vector<std::string> singles;
  for (std::string line; std::getline(in, line);) {
    rows.push_back(nlohmann::json::parse(line));
    if (!rows.back().contains("pair")) singles.push_back(rows.back()["text"].get<std::string>());
  }
  const auto batch = tok.encode_batch(singles);
  std::ofstream out(files[1]);
  std::size_t b = 0;
  for (const auto& r : rows) {
    const auto text = r["text"].get<std::string>();
    nlohmann::json o;
    o["ids"] = tok.encode(text);
    if (r.contains("pair")) {
      o["single"] = as_json(tok.encoding(text, r["pair"].get<std::string>()));
    } else {
      o["single"] = as_json(tok.encoding(text));
      o["batch"] = as_json(batch.at(b++));
    }
    out << o.dump() << '\n';
  }
  if (!out.flush()) {
    std::cerr << "wordpiece_ids: cannot write " << files[1] << '\n';
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "wordpiece_ids: " << e.what() << '\n';
  return 1;
}
