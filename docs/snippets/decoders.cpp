// SPDX-License-Identifier: Apache-2.0
// docs/models.md's decoder blocks: a Llama-family model directory (config.json + safetensors +
// tokenizer.json) loads by name, computes transformers' labels= loss, generates greedily and by
// sampling with a KV cache, and is written back as a directory AutoModelForCausalLM loads; then it
// is fine-tuned on 2 workers and its checkpoint, with the tokenizer, serves prompts as text.
//   snippets_decoders MODEL_DIR OUT_DIR
// (tests/docs: the small random Llama and trained BPE tokenizer of tests/unit/decoder_reference.py.)

#include <dtrain/all.hpp>

#include <cmath>
#include <fstream>
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

  // [decoders serve]
  const auto tokenizer = dtrain::data::BpeTokenizer::from_directory(dir);  // its tokenizer.json
  std::vector<std::int64_t> stream;  // a few texts' ids, one after another, cut into 16-token windows
  for (const std::string text : {"Hello world, hello there.", "The quick brown fox jumps over the lazy dog."})
    for (int copy = 0; copy < 16; ++copy)
      for (auto id : tokenizer.encode(text)) stream.push_back(id);
  const auto windows = torch::tensor(stream).narrow(0, 0, stream.size() / 16 * 16).view({-1, 16});
  const dtrain::data::TensorDataset texts{windows, windows};  // the labels are the ids (shifted inside the loss)

  using Llm = dtrain::nn::LlamaForCausalLM;
  using Trainer = dtrain::Trainer<Llm, dtrain::data::TensorDataset, dtrain::checkpointer::directory<>>;
  Trainer trainer({.num_workers = 2}, {.storage_path = "runs", .name = "llm", .start = dtrain::Start::fresh});
  const auto result = trainer.fit([&](Trainer::context& ctx) {
    Llm llm(dtrain::nn::LlamaConfig::from_pretrained(dir));
    dtrain::nn::load_pretrained(llm, dir);
    auto lm = ctx.prepare_model(llm);
    torch::optim::AdamW opt(ctx.parameters(lm), torch::optim::AdamWOptions(1e-3));
    for (auto epoch : ctx.epochs(2)) {
      double loss_sum = 0;
      int steps = 0;
      for (auto batch : ctx.shard(texts, 8)) {
        opt.zero_grad();
        auto loss = dtrain::nn::causal_lm_loss(ctx.forward(lm, batch.data), batch.target);
        ctx.backward(loss);
        ctx.step(opt);
        loss_sum += loss.item<double>();
        ++steps;
      }
      ctx.report({{"epoch", epoch}, {"loss", ctx.all_reduce(loss_sum / steps)}},
                 ctx.checkpoint(lm, opt).with_object("vocab", tokenizer));  // the tokenizer serves with it
    }
  });
  // The checkpoint alone serves: the model from its model_config.json, the tokenizer from its object.
  auto served = dtrain::evaluation::Predictor<Llm>::from_checkpoint(result.latest_checkpoint()->path(),
                                                                     dtrain::evaluation::TextInputs{});
  const auto replies = served.generate({"Hello", "The quick"}, {.max_new_tokens = 8});  // each prompt's new text
  // [decoders serve]

  // [lora]
  // Instruction data: prompt and response records; only the response (and its EOS) teaches.
  {
    std::ofstream file("instructions.jsonl");
    for (int copy = 0; copy < 32; ++copy)
      file << R"({"prompt": "Say hello.", "response": " Hello world, hello there."})" "\n"
           << R"({"prompt": "Name an animal.", "response": " The quick brown fox jumps over the lazy dog."})" "\n";
  }
  const dtrain::data::CausalLMData instructions("instructions.jsonl", tokenizer, {.max_length = 32});  // packed rows

  // LoRA on 2 workers: adapters on q/k/v/o and gate/up/down, every other parameter frozen, so the
  // optimizer holds the adapters alone and only their gradients are all-reduced.
  using LoraTrainer = dtrain::Trainer<Llm, dtrain::data::CausalLMData>;
  LoraTrainer lora_trainer({.num_workers = 2}, {.storage_path = "runs", .name = "lora", .start = dtrain::Start::fresh});
  const auto lora_result = lora_trainer.fit([&](LoraTrainer::context& ctx) {
    Llm llm(dtrain::nn::LlamaConfig::from_pretrained(dir));
    dtrain::nn::load_pretrained(llm, dir);              // the base first
    dtrain::nn::add_lora(*llm, {.r = 8, .alpha = 16});  // before prepare_model
    llm->gradient_checkpointing_enable();              // each layer recomputed in backward: less memory
    auto lm = ctx.prepare_model(llm);
    torch::optim::AdamW opt(ctx.parameters(lm), torch::optim::AdamWOptions(1e-3));  // the adapters
    for (auto epoch : ctx.epochs(2)) {
      double loss_sum = 0;
      int steps = 0;
      for (auto batch : ctx.shard(instructions, 8)) {
        opt.zero_grad();
        auto loss = dtrain::nn::causal_lm_loss(ctx.forward(lm, batch), batch["labels"]);  // ids, positions, labels
        ctx.backward(loss);
        ctx.step(opt);
        loss_sum += loss.item<double>();
        ++steps;
      }
      const double loss = ctx.all_reduce(loss_sum / steps);
      ctx.report({{"epoch", epoch}, {"loss", loss}, {"perplexity", std::exp(loss)}});
    }
    // A PEFT adapter directory: peft.PeftModel.from_pretrained(base, "adapter") loads it.
    if (ctx.world_rank() == 0) dtrain::nn::save_peft_adapter(*lm, "adapter", {.base_model_name_or_path = dir.string()});
  });
  // For serving: the adapter (dtrain's or one PEFT saved) onto the base, folded into its weights.
  Llm merged(dtrain::nn::LlamaConfig::from_pretrained(dir));
  dtrain::nn::load_pretrained(merged, dir);
  dtrain::nn::load_peft_adapter(*merged, "adapter");
  dtrain::nn::merge_lora(*merged);
  dtrain::nn::save_pretrained(merged, "merged");  // a plain model directory again
  // [lora]
  std::cout << "decoders: " << report.loaded << " tensors, loss " << loss.item<double>() << ", greedy [" << greedy.size(0)
            << ", " << greedy.size(1) << "], sampled [" << sampled.size(0) << ", " << sampled.size(1) << "], exported "
            << model->config.causal_lm_architecture() << "\n";
  std::cout << "served: " << result.metrics_history.size() << " reports, " << replies.size() << " replies, the first "
            << replies[0].size() << " bytes\n";
  const auto lora_losses = lora_result.metrics_history.column("loss");
  std::cout << "lora: " << lora_losses.size() << " reports, loss " << (lora_losses.back() < lora_losses.front() ? "falls" : "does not fall")
            << ", adapter " << dtrain::weights::read("adapter/adapter_model.safetensors").size() << " tensors, merged "
            << merged->named_parameters().size() << " tensors\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "snippets_decoders: " << e.what() << "\n";
  return 1;
}
