// SPDX-License-Identifier: Apache-2.0
// dtrain's byte-level BPE ids of texts, for check_bpe.py to compare with Hugging Face tokenizers.
//
//   bpe_ids TOKENIZER_JSON IN.jsonl OUT.jsonl
//
// IN: one JSON string (a text) a line. OUT: one line per text with
//   "ids"      encode(text): the post-processor's special tokens, truncated, unpadded
//   "plain"    encode(text, false): no special tokens
//   "single"   encoding(text): {"input_ids", "attention_mask"}, padded as the file says
//   "batch"    encode_batch over every text, in order (the same fields)
//   "decoded"  decode(single's input_ids) (special tokens skipped)
//   "raw"      decode(single's input_ids, false)
// and a last line {"bos", "eos", "pad", "size", "add_bos", "add_eos"}.
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/data/bpe_tokenizer.hpp>

namespace {
nlohmann::json as_json(const dtrain::data::BpeEncoding& e) {
  return {{"input_ids", e.input_ids}, {"attention_mask", e.attention_mask}};
}
nlohmann::json maybe(const std::optional<std::int64_t>& id) { return id ? nlohmann::json(*id) : nlohmann::json(); }
}  // namespace

int main(int argc, char** argv) try {
  if (argc != 4) {
    std::cerr << "usage: bpe_ids TOKENIZER_JSON IN.jsonl OUT.jsonl\n";
    return 2;
  }
  const auto tok = dtrain::data::BpeTokenizer::from_file(argv[1]);
  std::ifstream in(argv[2], std::ios::binary);
  std::vector<std::string> texts;
  for (std::string line; std::getline(in, line);) texts.push_back(nlohmann::json::parse(line).get<std::string>());
  const auto batch = tok.encode_batch(texts);
  std::ofstream out(argv[3], std::ios::binary);
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const auto single = tok.encoding(texts[i]);
    nlohmann::json o{{"ids", tok.encode(texts[i])},
                     {"plain", tok.encode(texts[i], false)},
                     {"single", as_json(single)},
                     {"batch", as_json(batch[i])},
                     {"decoded", tok.decode(single.input_ids)},
                     {"raw", tok.decode(single.input_ids, false)}};
    out << o.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace) << '\n';
  }
  out << nlohmann::json{{"bos", maybe(tok.bos_id())}, {"eos", maybe(tok.eos_id())}, {"pad", tok.pad_id()},
                        {"size", tok.size()},         {"add_bos", tok.add_bos()},   {"add_eos", tok.add_eos()}}
             .dump()
      << '\n';
  if (!out.flush()) {
    std::cerr << "bpe_ids: cannot write " << argv[3] << '\n';
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "bpe_ids: " << e.what() << '\n';
  return 1;
}
