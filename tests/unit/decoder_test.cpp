// SPDX-License-Identifier: Apache-2.0
// nn/llama*.hpp, nn/gpt2.hpp, nn/decoder.hpp, nn/generate.hpp: configs from config.json (both rope
// spellings, and their refusals), parameter names that are transformers' names, the KV cache's
// step equal to the whole forward, padding that changes nothing else, sampling that a seed
// repeats; and, through the Python environment of scripts/python-env (tests/unit/decoder_reference.py
// makes small Llama, Mistral, Qwen2 and GPT-2 models with seeded random weights: no downloads),
// logits, labels= losses and greedy generation equal to transformers', dtrain's exports loading
// in transformers with equal logits, and a checkpoint with its BPE tokenizer serving prompts as
// text through the Predictor, equal to what transformers and tokenizers generate and decode.

#include "../dtrain_catch.hpp"
#include "checkpoint_support.hpp"
#include "support.hpp"
#include "vit_test_support.hpp"

#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <dtrain/checkpointer/model_config.hpp>
#include <dtrain/data/bpe_tokenizer.hpp>
#include <dtrain/evaluation/predictor.hpp>
#include <dtrain/nn/generate.hpp>
#include <dtrain/nn/gpt2.hpp>
#include <dtrain/nn/llama.hpp>
#include <dtrain/nn/loss.hpp>
#include <dtrain/weights.hpp>

namespace fs = std::filesystem;
namespace nn = dtrain::nn;
namespace weights = dtrain::weights;
using vit_test::Dir;
using vit_test::error_of;

static_assert(dtrain::checkpointer::DescribedModel<nn::LlamaForCausalLM>);
static_assert(dtrain::checkpointer::DescribedModel<nn::GPT2LMHeadModel>);
static_assert(nn::CausalLM<nn::LlamaForCausalLMImpl>);
static_assert(nn::CausalLM<nn::GPT2LMHeadModelImpl>);

namespace {

nlohmann::json llama_json() {
  return {{"model_type", "llama"}, {"vocab_size", 50}, {"hidden_size", 32}, {"intermediate_size", 64},
          {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"max_position_embeddings", 64}, {"eos_token_id", 2}, {"pad_token_id", 0}, {"initializer_range", 0.3},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}, {"pretraining_tp", 1}};
}

nlohmann::json gpt2_json() {
  return {{"model_type", "gpt2"}, {"vocab_size", 50}, {"n_embd", 32}, {"n_layer", 2}, {"n_head", 4}, {"n_positions", 40},
          {"eos_token_id", 2}, {"initializer_range", 0.3}, {"summary_type", "cls_index"}};
}

using dtrain_test::max_diff;

std::vector<std::string> names_of(const torch::nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& p : m.named_parameters()) names.push_back(p.key());
  return names;
}

/// decoder_reference.py make DIR [names].
void make_reference(const fs::path& dir, const std::string& names = "") {
  const auto r = dtrain_test::run_command(std::string(DTRAIN_VENV_PYTHON) + " " + DTRAIN_DECODER_REFERENCE + " make " +
                                          dir.string() + " " + names);
  INFO(r.output);
  REQUIRE(r.status == 0);
}

struct Reference {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  torch::Tensor operator[](const std::string& name) const {
    for (const auto& [k, v] : tensors)
      if (k == name) return v;
    throw std::runtime_error("no " + name + " in the reference");
  }
};

/// The model of `dir` against its reference: logits at the unpadded positions, the labels= loss,
/// and 32 greedy tokens after left-padded prompts.
template <class Model>
void check_against_transformers(const fs::path& dir, const std::string& name) {
  using Config = typename Model::Impl::Config;
  Model model(Config::from_pretrained(dir / name));
  const auto report = nn::load_pretrained(model, dir / name);
  INFO(name << ": missing " << weights::list_names(report.missing) << "; unexpected " << weights::list_names(report.unexpected));
  CHECK(report.missing.empty());
  model->eval();
  torch::NoGradGuard no_grad;
  const Reference ref{weights::read(dir / (name + ".safetensors"))};
  const torch::Tensor logits = model(ref["input_ids"], ref["attention_mask"]);
  const double gap = max_diff(logits, ref["logits"]);  // every position, the padding's too
  const double loss = std::abs(nn::causal_lm_loss(logits, ref["labels"]).item<double>() - ref["loss"].item<double>());
  std::cout << name << " against transformers: logits within " << gap << ", loss within " << loss << "\n";
  CHECK(gap <= 1e-5);
  CHECK(loss <= 1e-5);
  // Packed rows: each document attends to itself alone, its positions counting from 0.
  const double packed = max_diff(model(ref["packed_ids"], torch::Tensor(), ref["packed_positions"]), ref["packed_logits"]);
  std::cout << name << " packed documents: logits within " << packed << "\n";
  CHECK(packed <= 1e-5);
  const torch::Tensor generated = nn::generate(model, ref["prompt_ids"], ref["prompt_mask"], {.max_new_tokens = 32});
  INFO("dtrain:       " << generated << "\ntransformers: " << ref["generated"]);
  CHECK(generated.size(1) == ref["prompt_ids"].size(1) + 32);  // 32 new tokens: no row stopped early
  CHECK(generated.sizes() == ref["generated"].sizes());
  CHECK(torch::equal(generated, ref["generated"]));
}

}  // namespace

TEST_CASE("llama_config_reads_both_rope_spellings_and_writes_them_back", "[nn]") {
  auto j = llama_json();
  const auto c = nn::LlamaConfig::from_json(j, "tiny");
  CHECK(c.head_dim == 8);
  CHECK(c.num_key_value_heads == 2);
  CHECK(c.eos_token_id == std::vector<std::int64_t>{2});
  CHECK(c.extra["pretraining_tp"] == 1);
  CHECK(nn::LlamaConfig::from_json(c.to_json()) == c);
  // Before transformers 5: rope_theta and rope_scaling at the top.
  j.erase("rope_parameters");
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 16}};
  j["eos_token_id"] = {2, 3};
  const auto old = nn::LlamaConfig::from_json(j, "old");
  CHECK(old.rope_type == "llama3");
  CHECK(old.rope_theta == 500000.0);
  CHECK(old.original_max_position_embeddings == 16);
  CHECK(old.eos_token_id == std::vector<std::int64_t>{2, 3});
  CHECK(old.to_json()["rope_parameters"]["factor"] == 8.0);
  CHECK(nn::LlamaConfig::from_json(old.to_json()) == old);
  // Mistral's window on every layer; Qwen2's only where layer_types says.
  auto m = llama_json();
  m["model_type"] = "mistral";
  m["sliding_window"] = 4;
  CHECK(nn::LlamaConfig::from_json(m).window_of(1) == 4);
  auto q = llama_json();
  q["model_type"] = "qwen2";
  q["sliding_window"] = 4;
  q["use_sliding_window"] = false;
  const auto qwen = nn::LlamaConfig::from_json(q);
  CHECK_FALSE(qwen.window_of(0));
  CHECK(qwen.qkv_bias());
  CHECK_FALSE(qwen.o_bias());
  CHECK(nn::LlamaConfig::from_json(qwen.to_json()) == qwen);
}

TEST_CASE("llama_config_refusals_name_the_key", "[nn]") {
  const auto refused = [](auto edit) {
    auto j = llama_json();
    edit(j);
    return error_of([&] { nn::LlamaConfig::from_json(j, "cfg.json"); });
  };
  CHECK_THAT(refused([](auto& j) { j.erase("hidden_size"); }), Catch::Contains("cfg.json: \"hidden_size\" is missing"));
  CHECK_THAT(refused([](auto& j) { j["model_type"] = "falcon"; }), Catch::Contains("\"falcon\" is not a Llama-family decoder"));
  CHECK_THAT(refused([](auto& j) { j["num_key_value_heads"] = 3; }), Catch::Contains("not a multiple of \"num_key_value_heads\" 3"));
  CHECK_THAT(refused([](auto& j) { j["rope_parameters"]["rope_type"] = "yarn"; }), Catch::Contains("rope type \"yarn\" is not computed"));
  CHECK_THAT(refused([](auto& j) { j["hidden_act"] = "mish"; }), Catch::Contains("\"hidden_act\": \"mish\""));
  CHECK_THAT(refused([](auto& j) { j["eos_token_id"] = 99; }), Catch::Contains("\"eos_token_id\" 99 is outside the vocabulary"));
  CHECK_THAT(refused([](auto& j) { j["vocab_size"] = "many"; }), Catch::Contains("\"vocab_size\" is \"many\", which is not an integer"));
  CHECK_THAT(error_of([] { nn::GPT2Config::from_json(llama_json(), "cfg.json"); }), Catch::Contains("is not GPT-2"));
  CHECK_THAT(error_of([] { nn::LlamaConfig::from_pretrained("/nonexistent/model"); }), Catch::Contains("cannot be read"));
}

TEST_CASE("llama_and_gpt2_names_are_transformers_names", "[nn]") {
  nn::LlamaForCausalLM llama(nn::LlamaConfig::from_json(llama_json()));
  const auto names = names_of(*llama);
  for (const char* n : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
                        "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight", "model.norm.weight",
                        "lm_head.weight"})
    CHECK(std::count(names.begin(), names.end(), n) == 1);
  CHECK(names.size() == 1 + 2 * 9 + 1 + 1);
  CHECK(llama->model->layers[0]->as<nn::LlamaDecoderLayerImpl>()->self_attn->k_proj->weight.size(0) == 2 * 8);  // GQA
  auto tied = nn::LlamaConfig::from_json(llama_json());
  tied.tie_word_embeddings = true;
  CHECK(names_of(*nn::LlamaForCausalLM(tied)).size() == names.size() - 1);  // no lm_head.weight, as transformers saves it

  nn::GPT2LMHeadModel gpt2(nn::GPT2Config::from_json(gpt2_json()));
  const auto g = names_of(*gpt2);
  for (const char* n : {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight", "transformer.h.0.attn.c_attn.weight",
                        "transformer.h.0.attn.c_proj.bias", "transformer.h.1.ln_2.bias", "transformer.h.0.mlp.c_fc.weight",
                        "transformer.h.0.mlp.c_proj.weight", "transformer.ln_f.weight"})
    CHECK(std::count(g.begin(), g.end(), n) == 1);
  CHECK(gpt2->transformer->h[0]->as<nn::GPT2BlockImpl>()->attn->c_attn->weight.sizes() == torch::IntArrayRef{32, 96});  // Conv1D: [in, out]
  CHECK(nn::GPT2Config::from_json(gpt2->config.to_json()) == gpt2->config);
  CHECK(gpt2->config.extra["summary_type"] == "cls_index");
}

TEST_CASE("generate_cached_steps_equal_the_whole_forward", "[nn]") {
  for (const bool gpt2 : {false, true}) {
    torch::manual_seed(1);
    nn::LlamaForCausalLM llama(nn::LlamaConfig::from_json(llama_json()));
    nn::GPT2LMHeadModel g(nn::GPT2Config::from_json(gpt2_json()));
    llama->eval();
    g->eval();
    torch::NoGradGuard no_grad;
    const auto ids = torch::randint(3, 50, {2, 9}, torch::kLong);
    const auto full = gpt2 ? g(ids) : llama(ids);
    // The prompt's 5 tokens at once, then one token a step through the cache.
    nn::KVCache cache;
    std::vector<torch::Tensor> steps;
    for (std::int64_t at = 0; at < 9; at = cache.length()) {
      const auto n = at == 0 ? 5 : 1;
      const auto chunk = ids.narrow(1, at, n);
      steps.push_back(gpt2 ? g(chunk, torch::Tensor(), torch::Tensor(), &cache) : llama(chunk, torch::Tensor(), torch::Tensor(), &cache));
    }
    CHECK(cache.length() == 9);
    INFO((gpt2 ? "gpt2" : "llama"));
    CHECK(max_diff(torch::cat(steps, 1), full) <= 1e-5);
    // Right padding changes nothing at the tokens before it.
    auto mask = torch::ones({2, 9}, torch::kLong);
    mask[1].narrow(0, 6, 3).fill_(0);
    const auto padded = gpt2 ? g(ids, mask) : llama(ids, mask);
    CHECK(max_diff(padded, full, mask) <= 1e-5);
  }
}

TEST_CASE("generate_samples_what_its_seed_says_and_refuses_bad_options", "[nn]") {
  torch::manual_seed(2);
  auto config = nn::LlamaConfig::from_json(llama_json());
  config.eos_token_id.clear();  // nothing stops early: every row gets max_new_tokens
  nn::LlamaForCausalLM model(config);
  model->eval();
  const auto prompt = torch::randint(3, 50, {2, 4}, torch::kLong);
  const nn::GenerationOptions sample{.max_new_tokens = 12, .do_sample = true, .temperature = 1.5, .top_k = 0, .top_p = 1.0, .seed = 5};
  const auto a = nn::generate(model, prompt, {}, sample);
  CHECK(a.sizes() == torch::IntArrayRef{2, 16});
  CHECK(torch::equal(a.narrow(1, 0, 4), prompt));
  CHECK(torch::equal(a, nn::generate(model, prompt, {}, sample)));  // the same seed, the same tokens
  auto other = sample;
  other.seed = 6;
  CHECK_FALSE(torch::equal(a, nn::generate(model, prompt, {}, other)));
  // top_k = 1 and a tiny top_p leave one token: greedy's.
  const auto greedy = nn::generate(model, prompt, {}, {.max_new_tokens = 12});
  auto k1 = sample;
  k1.top_k = 1;
  CHECK(torch::equal(nn::generate(model, prompt, {}, k1), greedy));
  auto p = sample;
  p.top_p = 1e-6;
  CHECK(torch::equal(nn::generate(model, prompt, {}, p), greedy));
  // An end-of-sequence id stops its row, which gets the pad id after it.
  const auto first = greedy[0][4].item<std::int64_t>();
  const auto stopped = nn::generate(model, prompt, {}, {.max_new_tokens = 12, .eos_token_ids = {first}, .pad_token_id = 0});
  CHECK(stopped[0][4].item<std::int64_t>() == first);
  if (stopped.size(1) > 5) CHECK(stopped[0].narrow(0, 5, stopped.size(1) - 5).eq(0).all().item<bool>());

  CHECK_THAT(error_of([&] { nn::generate(model, prompt.to(torch::kInt), {}); }), Catch::Contains("int64"));
  CHECK_THAT(error_of([&] { nn::generate(model, prompt, torch::ones({2, 3})); }), Catch::Contains("attention_mask must be the prompt's shape"));
  CHECK_THAT(error_of([&] { nn::generate(model, prompt, {}, {.do_sample = true, .temperature = 0}); }),
             Catch::Contains("temperature must be positive"));
  CHECK_THAT(error_of([&] { nn::generate(model, prompt, {}, {.do_sample = true, .top_p = 1.5}); }), Catch::Contains("top_p must be in (0, 1]"));
  nn::GPT2LMHeadModel g(nn::GPT2Config::from_json(gpt2_json()));  // n_positions 40
  CHECK_THAT(error_of([&] { nn::generate(g, prompt, {}, {.max_new_tokens = 50}); }),
             Catch::Contains("beyond the model's n_positions 40"));
}

TEST_CASE("causal_lm_loss_shifts_and_ignores", "[nn]") {
  torch::manual_seed(3);
  const auto logits = torch::randn({2, 5, 7});
  auto labels = torch::randint(0, 7, {2, 5}, torch::kLong);
  labels[0][2] = -100;
  // Position t predicts label t + 1; the last position predicts nothing.
  const auto expected = torch::cross_entropy_loss(logits.narrow(1, 0, 4).reshape({-1, 7}), labels.narrow(1, 1, 4).reshape({-1}));
  CHECK(nn::causal_lm_loss(logits, labels).item<double>() == Approx(expected.item<double>()).epsilon(1e-6));
  CHECK_THAT(error_of([&] { nn::causal_lm_loss(logits, labels.narrow(1, 0, 4)); }), Catch::Contains("labels [batch, tokens]"));
}

TEST_CASE("llama_load_refuses_another_model_and_names_what_is_missing", "[nn]") {
  Dir dir("llama_load");
  nn::LlamaForCausalLM model(nn::LlamaConfig::from_json(llama_json()));
  nn::save_pretrained(model, dir / "m");
  CHECK(nn::LlamaConfig::from_pretrained(dir / "m") == model->config);
  CHECK(nn::load_pretrained(model, dir / "m").complete());
  // A file of another size: a shape error naming the key.
  auto bigger = nn::LlamaConfig::from_json(llama_json());
  bigger.intermediate_size = 96;
  nn::LlamaForCausalLM other(bigger);
  CHECK_THAT(error_of([&] { nn::load_pretrained(other, dir / "m"); }), Catch::Contains("mlp.gate_proj.weight\" has shape"));
  // A GPT-2 file into a Llama: nothing matches.
  nn::GPT2LMHeadModel g(nn::GPT2Config::from_json(gpt2_json()));
  nn::save_pretrained(g, dir / "g");
  CHECK_THAT(error_of([&] { nn::load_pretrained(model, dir / "g"); }), Catch::Contains("0 of"));
  // A strict load of a file without a layer's weights names it.
  auto state = weights::read(dir / "m");
  std::erase_if(state, [](const auto& kv) { return kv.first == "model.layers.1.mlp.up_proj.weight"; });
  weights::save_safetensors(dir / "partial.safetensors", state);
  CHECK_THAT(error_of([&] { nn::load_pretrained(model, dir / "partial.safetensors"); }),
             Catch::Contains("model.layers.1.mlp.up_proj.weight"));
}

TEST_CASE("llama_matches_transformers", "[nn][python]") {
  Dir dir("llama_ref");
  make_reference(dir.path, "llama llama_tied llama_bare mistral qwen2");
  check_against_transformers<nn::LlamaForCausalLM>(dir.path, "llama");
  check_against_transformers<nn::LlamaForCausalLM>(dir.path, "llama_tied");  // bf16, sharded, tied, biases
  check_against_transformers<nn::LlamaForCausalLM>(dir.path, "mistral");     // fp16, sliding window
  check_against_transformers<nn::LlamaForCausalLM>(dir.path, "qwen2");
  // A bare LlamaModel's file into the causal LM: the backbone loads, the head is reported missing.
  nn::LlamaForCausalLM lm(nn::LlamaConfig::from_pretrained(dir / "llama_bare"));
  const auto report = nn::load_pretrained(lm, dir / "llama_bare");
  CHECK(report.missing == std::vector<std::string>{"lm_head.weight"});
  // And the causal LM's file into a bare LlamaModel: the head reported unexpected.
  nn::LlamaModel bare(nn::LlamaConfig::from_pretrained(dir / "llama"));
  CHECK(nn::load_pretrained(bare, dir / "llama").unexpected == std::vector<std::string>{"lm_head.weight"});
}

TEST_CASE("gpt2_matches_transformers", "[nn][python]") {
  Dir dir("gpt2_ref");
  make_reference(dir.path, "gpt2 gpt2_bare");
  check_against_transformers<nn::GPT2LMHeadModel>(dir.path, "gpt2");
  check_against_transformers<nn::GPT2LMHeadModel>(dir.path, "gpt2_bare");  // the hub's layout: no "transformer."
}

TEST_CASE("llama_and_gpt2_exports_load_in_transformers", "[nn][python]") {
  Dir dir("decoder_export");
  make_reference(dir.path, "llama qwen2 gpt2");
  std::string exports;  // decoder_reference.py check's arguments: one Python process for the three
  for (const std::string name : {"llama", "qwen2", "gpt2"}) {
    const Reference ref{weights::read(dir / (name + ".safetensors"))};
    const auto train_and_export = [&](auto model) {
      REQUIRE(nn::load_pretrained(model, dir / name).missing.empty());
      // Two steps of training, so that the export differs from what transformers saved.
      torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
      for (int step = 0; step < 2; ++step) {
        opt.zero_grad();
        nn::causal_lm_loss(model(ref["input_ids"], ref["attention_mask"]), ref["labels"]).backward();
        opt.step();
      }
      nn::save_pretrained(model, dir / (name + "_export"));
      model->eval();
      torch::NoGradGuard no_grad;
      weights::save_safetensors(dir / (name + "_export.safetensors"),
                                {{"input_ids", ref["input_ids"]}, {"attention_mask", ref["attention_mask"]},
                                 {"logits", model(ref["input_ids"], ref["attention_mask"])}});
    };
    if (name == "gpt2") train_and_export(nn::GPT2LMHeadModel(nn::GPT2Config::from_pretrained(dir / name)));
    else train_and_export(nn::LlamaForCausalLM(nn::LlamaConfig::from_pretrained(dir / name)));
    exports += " " + (dir / (name + "_export")).string() + " " + (dir / (name + "_export.safetensors")).string();
  }
  const auto r = dtrain_test::run_command(std::string(DTRAIN_VENV_PYTHON) + " " + DTRAIN_DECODER_REFERENCE + " check" + exports);
  INFO(r.output);
  std::cout << r.output;
  CHECK(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains("LlamaForCausalLM logits") && Catch::Contains("Qwen2ForCausalLM logits") &&
                           Catch::Contains("GPT2LMHeadModel logits") && Catch::Contains(" checks, 0 failed"));
}

TEST_CASE("generate_serves_a_causal_lm_checkpoint_text_in_text_out", "[nn][python]") {
  Dir dir("decoder_chat");
  make_reference(dir.path, "chat");
  const auto expected = nlohmann::json::parse(std::ifstream(dir / "chat.json"));
  const auto tokenizer = dtrain::data::BpeTokenizer::from_file(dir / "chat" / "tokenizer.json");
  nn::LlamaForCausalLM model(nn::LlamaConfig::from_pretrained(dir / "chat"));
  REQUIRE(nn::load_pretrained(model, dir / "chat").complete());
  // The checkpoint a train loop writes with ctx.checkpoint(model, opt).with_object("vocab", tokenizer).
  const auto checkpoint = dtrain_test::save_checkpoint(dir / "run", *model, [&](auto& s) {
    s.model_config = dtrain::checkpointer::describe_model(model);
    s.with_object("vocab", tokenizer);
  });
  using Llm = dtrain::evaluation::Predictor<nn::LlamaForCausalLM>;
  auto llm = Llm::from_checkpoint(checkpoint, dtrain::evaluation::TextInputs{});  // no labels: none needed
  const auto prompts = expected["prompts"].get<std::vector<std::string>>();
  const auto texts = llm.generate(prompts, {.max_new_tokens = 12});
  INFO("dtrain: " << nlohmann::json(texts).dump() << "\ntransformers: " << expected["texts"].dump());
  CHECK(texts == expected["texts"].get<std::vector<std::string>>());
  CHECK(llm.generate({}).empty());
  // A predictor without a decoding tokenizer says how to get one.
  Llm bare(nn::LlamaForCausalLM(model->config));
  CHECK_THAT(error_of([&] { bare.generate(prompts); }), Catch::Contains("no tokenizer that decodes"));
}
