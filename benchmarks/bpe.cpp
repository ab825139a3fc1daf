// SPDX-License-Identifier: Apache-2.0
// dtrain's side of benchmarks/bpe.py: BpeTokenizer over the same texts as Hugging Face
// tokenizers, one thread and all cores.
//
//   bpe_bench TOKENIZER_JSON TEXTS_JSONL REPEATS IDS_OUT_JSONL
//
// TEXTS_JSONL: one JSON string a line. Prints one JSON line: the seconds to read the tokenizer,
// and the seconds of each repeat of encode_batch(texts, 1) and encode_batch(texts) (every core),
// after one warm-up of each, and the number of ids. Writes the last batch's ids, one
// {"input_ids", "attention_mask"} a line, for the script to compare with tokenizers'.
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/data/bpe_tokenizer.hpp>

int main(int argc, char** argv) try {
  if (argc != 5) {
    std::cerr << "usage: bpe_bench TOKENIZER_JSON TEXTS_JSONL REPEATS IDS_OUT_JSONL\n";
    return 2;
  }
  using clock = std::chrono::steady_clock;
  const auto seconds = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  std::vector<std::string> texts;
  {
    std::ifstream in(argv[2]);
    for (std::string line; std::getline(in, line);) texts.push_back(nlohmann::json::parse(line).get<std::string>());
  }
  const int repeats = std::stoi(argv[3]);
  auto t0 = clock::now();
  const auto tok = dtrain::data::BpeTokenizer::from_file(argv[1]);
  const double load_s = seconds(t0);
  nlohmann::json out{{"texts", texts.size()}, {"load_s", load_s}, {"threads", std::thread::hardware_concurrency()}};
  std::vector<dtrain::data::BpeEncoding> last;
  for (const auto& [name, threads] : {std::pair{"single_s", 1u}, std::pair{"batch_s", 0u}}) {
    std::vector<double> times;
    for (int r = -1; r < repeats; ++r) {  // r = -1: the warm-up
      t0 = clock::now();
      auto encodings = tok.encode_batch(texts, threads);
      const auto s = seconds(t0);
      if (r >= 0) times.push_back(s);
      last = std::move(encodings);
    }
    out[name] = times;
  }
  std::size_t tokens = 0;
  for (const auto& e : last) tokens += e.input_ids.size();
  out["tokens"] = tokens;
  std::ofstream ids(argv[4]);
  for (const auto& e : last)
    ids << nlohmann::json{{"input_ids", e.input_ids}, {"attention_mask", e.attention_mask}}.dump() << '\n';
  std::cout << out.dump() << std::endl;
  return ids.flush() ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << "bpe_bench: " << e.what() << '\n';
  return 1;
}
