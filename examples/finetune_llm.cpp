// SPDX-License-Identifier: Apache-2.0
// A Llama-family language model fine-tuned with LoRA on instruction data, on N workers: the same
// work as benchmarks/llm_peer.py (transformers + PEFT under torch DDP). Records of JSON Lines
// ("prompt", "response") through the model's BPE tokenizer, packed into rows of --seq-len
// (data::CausalLMData: labels only on the responses, each document attending to itself), LoRA
// adapters on the attention and MLP projections (every other weight frozen: only the adapters
// train, hold optimizer state and are all-reduced), each decoder layer recomputed in backward
// (--checkpointing), AdamW at a constant rate. Every epoch: the eval file's loss and perplexity,
// a checkpoint of the adapters alone (with the base's identity), the best kept by eval_loss. Then
// the best checkpoint serves: its adapters on their base (nn::from_lora_checkpoint) answer
// --generate's prompts; --export-adapter writes them as a PEFT directory, --export-merged the
// model with the adapters folded in, as a Hugging Face directory. One JSON line at the end.
//
//   finetune_llm --model-dir DIR --train FILE --eval FILE [--workers 2] [--threads-per-worker 1]
//       [--global-batch 8] [--seq-len 256] [--epochs 1] [--max-steps 0] [--lr 2e-4]
//       [--weight-decay 0] [--r 8] [--alpha 16] [--dropout 0.05] [--targets q_proj,k_proj,...]
//       [--checkpointing 1] [--seed 0] [--storage-path DIR] [--name NAME] [--resume 0]
//       [--export-adapter DIR] [--export-merged DIR] [--generate PROMPT]... [--max-new-tokens 24]
//       [--adapter DIR]
//
// DIR: a Hugging Face Llama, Mistral or Qwen2 directory (config.json, safetensors, tokenizer.json;
// examples/make_llm.py makes a small one). --resume 1 continues the run --name from its newest
// checkpoint, which must have been trained on the same base. --adapter DIR continues a PEFT adapter
// directory (adapter_config.json, adapter_model.safetensors; from PEFT, or --export-adapter's)
// instead of fresh adapters: its config replaces --r, --alpha, --dropout and --targets, and the
// base of --model-dir is recorded for its checkpoints as for fresh ones.

#include <dtrain/data/bpe_tokenizer.hpp>
#include <dtrain/data/causal_lm.hpp>
#include <dtrain/dtrain.hpp>
#include <dtrain/memory.hpp>
#include <dtrain/nn/generate.hpp>
#include <dtrain/nn/llama.hpp>
#include <dtrain/nn/lora.hpp>
#include <dtrain/nn/lora_checkpoint.hpp>
#include <dtrain/nn/loss.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace data = dtrain::data;
namespace nn = dtrain::nn;
namespace fs = std::filesystem;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Options {
  std::string model_dir, train, eval, storage = "llm_runs", name = "finetune_llm", export_adapter, export_merged, adapter;
  int workers = 2, threads = 1;
  std::int64_t global_batch = 8, seq_len = 256, epochs = 1, max_steps = 0, r = 8, max_new_tokens = 24, seed = 0;
  double lr = 2e-4, weight_decay = 0, alpha = 16, dropout = 0.05;
  std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  std::vector<std::string> prompts;
  bool checkpointing = true, resume = false;
};

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string f = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(f + " needs a value");
    const std::string v = argv[i + 1];
    if (f == "--model-dir") o.model_dir = v;
    else if (f == "--train") o.train = v;
    else if (f == "--eval") o.eval = v;
    else if (f == "--workers") o.workers = std::stoi(v);
    else if (f == "--threads-per-worker") o.threads = std::stoi(v);
    else if (f == "--global-batch") o.global_batch = std::stoll(v);
    else if (f == "--seq-len") o.seq_len = std::stoll(v);
    else if (f == "--epochs") o.epochs = std::stoll(v);
    else if (f == "--max-steps") o.max_steps = std::stoll(v);
    else if (f == "--lr") o.lr = std::stod(v);
    else if (f == "--weight-decay") o.weight_decay = std::stod(v);
    else if (f == "--r") o.r = std::stoll(v);
    else if (f == "--alpha") o.alpha = std::stod(v);
    else if (f == "--dropout") o.dropout = std::stod(v);
    else if (f == "--targets") o.targets = split_commas(v);
    else if (f == "--checkpointing") o.checkpointing = v != "0";
    else if (f == "--seed") o.seed = std::stoll(v);
    else if (f == "--storage-path") o.storage = v;
    else if (f == "--name") o.name = v;
    else if (f == "--resume") o.resume = v != "0";
    else if (f == "--export-adapter") o.export_adapter = v;
    else if (f == "--export-merged") o.export_merged = v;
    else if (f == "--generate") o.prompts.push_back(v);
    else if (f == "--max-new-tokens") o.max_new_tokens = std::stoll(v);
    else if (f == "--adapter") o.adapter = v;
    else throw std::invalid_argument("unknown flag " + f + "; see the usage at the top of examples/finetune_llm.cpp");
  }
  if (o.model_dir.empty() || o.train.empty() || o.eval.empty())
    throw std::invalid_argument("--model-dir DIR, --train FILE and --eval FILE are required");
  if (o.workers < 1 || o.global_batch < o.workers || o.global_batch % o.workers)
    throw std::invalid_argument("--global-batch must be a positive multiple of --workers");
  if (o.epochs < 1 || o.max_steps < 0) throw std::invalid_argument("--epochs must be at least 1 and --max-steps at least 0");
  if (!o.adapter.empty() && !fs::is_regular_file(fs::path(o.adapter) / "adapter_config.json"))
    throw std::invalid_argument("--adapter " + o.adapter + ": no adapter_config.json (a PEFT adapter directory)");
  return o;
}

// The base's config, refusing what this example does not fine-tune (the LlamaForCausalLM family).
nn::LlamaConfig base_config(const fs::path& dir, std::int64_t seq_len) {
  std::ifstream in(dir / "config.json");
  if (!in) throw std::invalid_argument("--model-dir " + dir.string() + ": no config.json (a Hugging Face model directory)");
  const auto type = nlohmann::json::parse(in).value("model_type", std::string("missing"));
  if (type != "llama" && type != "mistral" && type != "qwen2")
    throw std::invalid_argument("--model-dir " + dir.string() + " is a \"" + type +
                                "\" model; this example fine-tunes the Llama family (llama, mistral, qwen2)");
  auto config = nn::LlamaConfig::from_pretrained(dir);
  if (seq_len > config.max_position_embeddings)
    throw std::invalid_argument("--seq-len " + std::to_string(seq_len) + " is longer than the model's context (" +
                                std::to_string(config.max_position_embeddings) + " positions)");
  return config;
}

}  // namespace

int main(int argc, char** argv) try {
  dtrain::retain_freed_memory();
  const double started = now_s();
  const auto o = parse(argc, argv);
  torch::set_num_threads(o.threads);
  const fs::path base = fs::absolute(o.model_dir).lexically_normal();
  const auto config = base_config(base, o.seq_len);
  const auto tokenizer = data::BpeTokenizer::from_directory(base);
  const data::CausalLMData train(o.train, tokenizer, {.max_length = o.seq_len});
  const data::CausalLMData eval(o.eval, tokenizer, {.max_length = o.seq_len});
  const nn::LoraConfig lora{.r = o.r, .alpha = o.alpha, .dropout = o.dropout, .target_modules = o.targets,
                            .base_model = base.string()};

  using Llm = nn::LlamaForCausalLM;
  using Trainer = dtrain::Trainer<Llm, data::CausalLMData, dtrain::checkpointer::directory<>>;
  dtrain::RunConfig run{.storage_path = o.storage, .name = o.name};
  run.checkpoint = {.num_to_keep = 1, .score_attribute = "eval_loss", .score_order = dtrain::ScoreOrder::min};
  run.start = o.resume ? dtrain::Start::resume : dtrain::Start::fresh;
  Trainer trainer({.num_workers = o.workers}, run);
  auto result = trainer.fit([&](Trainer::context& ctx) {
    torch::manual_seed(static_cast<std::uint64_t>(o.seed));
    Llm llm(config);
    nn::load_pretrained(llm, base);
    // The base frozen, its identity recorded for the checkpoints: fresh adapters, or a PEFT adapter
    // continued.
    if (o.adapter.empty()) nn::add_lora(*llm, lora);
    else nn::load_peft_adapter(*llm, o.adapter, base);
    if (o.checkpointing) llm->gradient_checkpointing_enable();
    auto model = ctx.prepare_model(llm);
    auto params = ctx.parameters(model);
    torch::optim::AdamW opt(params, torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
    if (auto ck = ctx.get_checkpoint()) ctx.restore(*ck, model, opt);  // refused when trained on another base
    double trainable = 0, total = 0;
    for (const auto& p : params) trainable += static_cast<double>(p.numel());
    for (const auto& p : llm->parameters()) total += static_cast<double>(p.numel());

    double loop_s = 0, last_loss = 0, first_step = 0;
    std::int64_t rows = 0;
    for (auto epoch : ctx.epochs(o.epochs)) {
      model->train();
      (void)ctx.all_reduce(0.0);  // a barrier: the loop's time starts together
      const double e0 = now_s();
      for (auto batch : ctx.shard(train, o.global_batch)) {
        opt.zero_grad();
        auto loss = nn::causal_lm_loss(ctx.forward(model, batch), batch["labels"]);
        ctx.backward(loss);
        ctx.step(opt);
        if (!first_step) first_step = now_s();
        rows += batch["input_ids"].size(0);
        last_loss = loss.item<double>();
        if (o.max_steps && ctx.steps() >= o.max_steps) break;
      }
      (void)ctx.all_reduce(0.0);
      loop_s += now_s() - e0;
      const bool last = o.max_steps && ctx.steps() >= o.max_steps;
      if (last) ctx.end_epoch();
      // The eval file's loss over its label tokens, all ranks together: each row once (a sequential
      // shard; the checkpoint's position stays the training shard's either way).
      model->eval();
      double loss_sum = 0, tokens = 0;
      {
        torch::NoGradGuard no_grad;
        for (auto batch : ctx.shard(eval, o.global_batch, dtrain::sampler::sequential{})) {
          const auto labels = batch["labels"];
          const auto n = (labels.narrow(1, 1, labels.size(1) - 1) != -100).sum().item<double>();
          loss_sum += nn::causal_lm_loss(ctx.forward(model, batch), labels).item<double>() * n;
          tokens += n;
        }
      }
      const double eval_loss = ctx.all_reduce(loss_sum, dtrain::reduce::sum) / ctx.all_reduce(tokens, dtrain::reduce::sum);
      const double trained_rows = ctx.all_reduce(static_cast<double>(rows), dtrain::reduce::sum);
      ctx.report({{"epoch", epoch}, {"steps", ctx.steps()}, {"eval_loss", eval_loss}, {"eval_perplexity", std::exp(eval_loss)},
                  {"final_train_loss", ctx.all_reduce(last_loss)}, {"train_rows", trained_rows},
                  {"train_loop_s", loop_s}, {"startup_s", first_step - started},
                  {"trainable_parameters", trainable}, {"total_parameters", total}},
                 ctx.checkpoint(model, opt));
      if (last) break;
    }
  });
  const auto best = result.best_checkpoint();
  if (!best) throw std::runtime_error("the run saved no checkpoint");

  // The best checkpoint serves: its adapters on the base they were trained on.
  auto tuned = nn::from_lora_checkpoint<Llm>(*best);
  tuned->eval();
  nlohmann::json generations = nlohmann::json::array();
  for (const auto& prompt : o.prompts) {
    const auto ids = torch::tensor(tokenizer.encode(prompt, true), torch::kLong).unsqueeze(0);
    const auto out = nn::generate(tuned, ids, {}, {.max_new_tokens = o.max_new_tokens});
    const auto fresh = out[0].narrow(0, ids.size(1), out.size(1) - ids.size(1)).contiguous();
    generations.push_back(tokenizer.decode({fresh.data_ptr<std::int64_t>(), static_cast<std::size_t>(fresh.numel())}));
    std::cerr << "generate \"" << prompt << "\": " << generations.back().get<std::string>() << "\n";
  }
  if (!o.export_adapter.empty()) nn::save_peft_adapter(*tuned, o.export_adapter, {.base_model_name_or_path = base.string()});
  if (!o.export_merged.empty()) {
    nn::merge_lora(*tuned);
    nn::save_pretrained(tuned, o.export_merged, {.files = {base / "tokenizer.json", base / "tokenizer_config.json"}});
  }

  const auto& m = result.metrics;
  const double train_tokens = m.at("train_rows").number() * static_cast<double>(o.seq_len);
  nlohmann::json line = {
      {"model", "llama-lora"}, {"workers", o.workers}, {"global_batch", o.global_batch}, {"seq_len", o.seq_len},
      {"epochs", o.epochs}, {"steps", static_cast<std::int64_t>(m.at("steps").number())},
      {"train_rows", train.size()}, {"train_documents", train.documents()}, {"train_label_tokens", train.label_tokens()},
      {"eval_rows", eval.size()}, {"eval_documents", eval.documents()}, {"truncated", train.truncated()},
      {"trainable_parameters", static_cast<std::int64_t>(m.at("trainable_parameters").number())},
      {"total_parameters", static_cast<std::int64_t>(m.at("total_parameters").number())}, {"train_tokens", train_tokens},
      {"train_loop_s", m.at("train_loop_s").number()},
      {"train_tokens_per_s", train_tokens / m.at("train_loop_s").number()},
      {"final_train_loss", m.at("final_train_loss").number()}, {"eval_loss", m.at("eval_loss").number()},
      {"eval_perplexity", m.at("eval_perplexity").number()},
      {"best_eval_loss", best->metrics().at("eval_loss").number()}, {"best_checkpoint", best->path().string()},
      {"checkpoint_tensors", best->model_state().size()}, {"checkpointing", o.checkpointing},
      {"startup_s", m.at("startup_s").number()}, {"prompts", o.prompts}, {"generations", generations},
      {"max_new_tokens", o.max_new_tokens}, {"wall_s", now_s() - started}};
  std::cout << line.dump() << std::endl;
  return 0;
} catch (const std::exception& e) {
  std::cerr << "finetune_llm: " << e.what() << std::endl;
  return 1;
}
