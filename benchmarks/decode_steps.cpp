// SPDX-License-Identifier: Apache-2.0
// The KV cache's decode step against the sequence length (issue 51): a Llama-family model with
// seeded random weights, for each cached length L a prompt of L tokens computed once, then
// `steps` single-token steps through nn::KVCache, timed; and, for contrast, what one step costs
// without a cache (the whole L + 1 tokens again). benchmarks/decode_steps.py runs it beside
// transformers' DynamicCache on the same sizes.
//   decode_steps [--lengths 32,128,512,1024] [--steps 32] [--threads 1]
// Prints one JSON object a length: {"length", "cached_ms", "uncached_ms"} (medians of the steps).

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <dtrain/nn/llama.hpp>

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::int64_t> lengths = {32, 128, 512, 1024};
  int steps = 32, threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--lengths") {
      lengths.clear();
      std::stringstream in(value);
      for (std::string n; std::getline(in, n, ',');) lengths.push_back(std::stoll(n));
    } else if (flag == "--steps") {
      steps = std::stoi(value);
    } else if (flag == "--threads") {
      threads = std::stoi(value);
    } else {
      std::cerr << "decode_steps: unknown flag " << flag << " (--lengths, --steps, --threads)\n";
      return 2;
    }
  }
  at::set_num_threads(threads);
  // The sizes decode_steps.py gives transformers: 4 layers of width 256, 8 heads over 4 kv heads.
  const auto config = dtrain::nn::LlamaConfig::from_json(
      {{"model_type", "llama"}, {"vocab_size", 4096}, {"hidden_size", 256}, {"intermediate_size", 688},
       {"num_hidden_layers", 4}, {"num_attention_heads", 8}, {"num_key_value_heads", 4}, {"max_position_embeddings", 4096}},
      "decode_steps");
  torch::manual_seed(0);
  dtrain::nn::LlamaForCausalLM model(config);
  model->eval();
  torch::InferenceMode inference;
  using clock = std::chrono::steady_clock;
  const auto ms = [](clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  for (const auto length : lengths) {
    const auto prompt = torch::randint(0, config.vocab_size, {1, length}, torch::kLong);
    dtrain::nn::KVCache cache;
    auto next = model->next_token_logits(prompt, {}, {}, cache).argmax(-1, true);
    std::vector<double> cached, uncached;
    for (int s = 0; s < steps; ++s) {
      const auto t0 = clock::now();
      next = model->next_token_logits(next, {}, {}, cache).argmax(-1, true);
      cached.push_back(ms(clock::now() - t0));
    }
    const auto whole = torch::randint(0, config.vocab_size, {1, length + 1}, torch::kLong);
    for (int s = 0; s < std::max(3, steps / 8); ++s) {
      dtrain::nn::KVCache fresh;
      const auto t0 = clock::now();
      model->next_token_logits(whole, {}, {}, fresh);
      uncached.push_back(ms(clock::now() - t0));
    }
    std::cout << "{\"length\": " << length << ", \"cached_ms\": " << median(cached) << ", \"uncached_ms\": " << median(uncached)
              << "}" << std::endl;
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "decode_steps: " << e.what() << "\n";
  return 1;
}
