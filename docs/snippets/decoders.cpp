// SPDX-License-Identifier: Apache-2.0
// docs/models.md's decoder block: a Llama-family model directory (config.json + safetensors) loads
// by name, computes transformers' labels= loss, generates greedily and by sampling with a KV
// cache, and is written back as a directory AutoModelForCausalLM loads.
//   snippets_decoders MODEL_DIR OUT_DIR
// (tests/docs: the small random Llama of tests/unit/decoder_reference.py.)

#include <dtrain/models.hpp>
#include <dtrain/nn/loss.hpp>

#include <iostream>

#include <torch/torch.h>

int main(int argc, char** argv) try {
  if (argc != 3) {
    std::cerr << "usage: snippets_decoders MODEL_DIR OUT_DIR\n";
    return 2;
  }
  torch::manual_seed(0);
  // [decoders]
  const std::filesystem::path dir = argv[1];  // a Llama, Mistral or Qwen2 directory (GPT-2: nn::GPT2LMHeadModel)
  dtrain::nn::LlamaForCausalLM model(dtrain::nn::LlamaConfig::from_pretrained(dir));
  const auto report = dtrain::nn::load_pretrained(model, dir);  // bf16 / fp16 / sharded files load into fp32
  model->eval();

  const auto input_ids = torch::randint(3, model->config.vocab_size, {2, 12}, torch::kLong);
  auto attention_mask = torch::ones_like(input_ids);
  attention_mask[1].narrow(0, 8, 4).fill_(0);  // the second row is 8 tokens, right-padded
  auto labels = input_ids.masked_fill(attention_mask == 0, -100);  // padding counts for nothing
  torch::Tensor loss;
  {
    torch::NoGradGuard no_grad;
    const auto logits = model(input_ids, attention_mask);  // [2, 12, vocab_size]
    loss = dtrain::nn::causal_lm_loss(logits, labels);     // transformers' labels= loss (the shift is inside)
  }

  // Generation: the prompt once, then one token a step through the KV cache.
  const auto prompt = input_ids.narrow(1, 0, 6);
  const auto greedy = dtrain::nn::generate(model, prompt, {}, {.max_new_tokens = 16});  // [2, 6 + up to 16]
  const auto sampled = dtrain::nn::generate(
      model, prompt, {}, {.max_new_tokens = 16, .do_sample = true, .temperature = 0.8, .top_k = 20, .top_p = 0.9, .seed = 7});

  dtrain::nn::save_pretrained(model, argv[2]);  // config.json + model.safetensors for AutoModelForCausalLM
  // [decoders]
  std::cout << "decoders: " << report.loaded << " tensors, loss " << loss.item<double>() << ", greedy [" << greedy.size(0)
            << ", " << greedy.size(1) << "], sampled [" << sampled.size(0) << ", " << sampled.size(1) << "], exported "
            << model->config.causal_lm_architecture() << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "snippets_decoders: " << e.what() << "\n";
  return 1;
}
