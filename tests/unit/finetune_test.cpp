// SPDX-License-Identifier: Apache-2.0
// Fine-tuning a decoder (issue 52). nn/lora.hpp: adapters on the layers a config names, the rest
// frozen (and out of the optimizer), an adapted model equal to its base until it trains, merge
// equal to the adapted forward, refusals that name the fix; and, through the Python environment of
// scripts/python-env (tests/unit/lora_reference.py: PEFT adapters with random A and B on
// decoder_reference.py's seeded models), PEFT's adapters loading into dtrain and dtrain's into PEFT,
// with equal logits. nn/recompute.hpp: gradients with activation checkpointing equal to the plain
// run's. data/causal_lm.hpp: documents, labels masked on prompts, packing that changes no logit.

#include "../dtrain_catch.hpp"
#include "support.hpp"
#include "vit_test_support.hpp"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/data/causal_lm.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/nn/gpt2.hpp>
#include <dtrain/nn/llama.hpp>
#include <dtrain/nn/lora.hpp>
#include <dtrain/nn/loss.hpp>
#include <dtrain/weights.hpp>

namespace fs = std::filesystem;
namespace nn = dtrain::nn;
namespace weights = dtrain::weights;
using vit_test::Dir;
using vit_test::error_of;

namespace {

nn::LlamaConfig small_llama() {
  nn::LlamaConfig c;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.initializer_range = 0.3;
  return c;
}

nn::GPT2Config small_gpt2(std::int64_t layers) {
  nn::GPT2Config g;
  g.vocab_size = 50;
  g.n_embd = 32;
  g.n_layer = layers;
  g.n_head = 4;
  g.n_positions = 16;
  return g;
}

using dtrain_test::max_diff;

// Gives every adapter's B random values, as training would (B starts at zero).
void perturb_adapters(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : nn::lora_parameters(model))
    if (name.find("lora_B") != std::string::npos) p.normal_(0, 0.2);
}

}  // namespace

TEST_CASE("lora_adapts_the_named_layers_freezes_the_rest_and_merges", "[nn]") {
  torch::manual_seed(0);
  nn::LlamaForCausalLM model(small_llama());
  model->eval();
  const auto ids = torch::randint(3, 50, {2, 7});
  torch::Tensor base;
  {
    torch::NoGradGuard no_grad;
    base = model(ids);
  }
  const auto adapted = nn::add_lora(*model, {.r = 4, .alpha = 16, .target_modules = {"q_proj", "v_proj", "down_proj"}});
  CHECK(adapted == std::vector<std::string>{"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                                            "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj",
                                            "model.layers.1.self_attn.v_proj", "model.layers.1.mlp.down_proj"});
  // Only the adapters train, with PEFT's shapes and names.
  std::vector<std::string> trainable;
  for (const auto& p : model->named_parameters())
    if (p.value().requires_grad()) trainable.push_back(p.key());
  CHECK(trainable.size() == 12);
  CHECK(trainable.front() == "model.layers.0.self_attn.q_proj.lora_A.weight");
  CHECK(model->model->layers[0]->as<nn::LlamaDecoderLayerImpl>()->self_attn->q_proj->lora_A->weight.sizes() ==
        torch::IntArrayRef{4, 32});
  CHECK(model->model->layers[0]->as<nn::LlamaDecoderLayerImpl>()->mlp->down_proj->lora_B->weight.sizes() ==
        torch::IntArrayRef{32, 4});
  {
    torch::NoGradGuard no_grad;  // B starts at zero: the adapted model computes what its base did
    CHECK(torch::equal(model(ids), base));
  }
  // One step: the adapters get gradients, the base none.
  nn::causal_lm_loss(model(ids), ids).backward();
  for (const auto& p : model->named_parameters())
    CHECK(p.value().grad().defined() == (p.key().find(".lora_") != std::string::npos));

  perturb_adapters(*model);
  torch::Tensor with_adapters;
  {
    torch::NoGradGuard no_grad;
    with_adapters = model(ids);
  }
  CHECK(max_diff(with_adapters, base) > 1e-3);
  CHECK(error_of([&] { nn::save_pretrained(model, Dir("lora_unmerged").path); }).find("merge_lora") != std::string::npos);
  CHECK(nn::merge_lora(*model) == 6);
  CHECK(nn::lora_parameters(*model).empty());
  torch::NoGradGuard no_grad;
  CHECK(max_diff(model(ids), with_adapters) <= 1e-5);
  CHECK(model->named_parameters().size() == nn::LlamaForCausalLM(small_llama())->named_parameters().size());
}

TEST_CASE("lora_rslora_scaling_pattern_targets_and_gpt2_conv1d", "[nn]") {
  CHECK(nn::LoraConfig{.r = 16, .alpha = 32}.scaling() == 2.0);
  CHECK(nn::LoraConfig{.r = 16, .alpha = 32, .use_rslora = true}.scaling() == 8.0);
  torch::manual_seed(1);
  nn::LlamaForCausalLM llama(small_llama());
  const auto by_pattern = nn::add_lora(*llama, {.target_pattern = R"(model\.layers\.1\..*_proj)"});
  CHECK(by_pattern.size() == 7);
  CHECK(by_pattern.front() == "model.layers.1.self_attn.q_proj");

  // GPT-2's Conv1D stores [in, out]: the adapters are [r, in] and [out, r], and merge transposes.
  nn::GPT2LMHeadModel gpt2(small_gpt2(1));
  gpt2->eval();
  nn::add_lora(*gpt2, {.r = 2, .target_modules = {"c_attn"}});
  const auto& c_attn = gpt2->transformer->h[0]->as<nn::GPT2BlockImpl>()->attn->c_attn;
  CHECK(c_attn->lora_A->weight.sizes() == torch::IntArrayRef{2, 32});
  CHECK(c_attn->lora_B->weight.sizes() == torch::IntArrayRef{96, 2});
  perturb_adapters(*gpt2);
  const auto ids = torch::randint(0, 50, {2, 5});
  torch::NoGradGuard no_grad;
  const auto adapted = gpt2(ids);
  nn::merge_lora(*gpt2);
  CHECK(max_diff(gpt2(ids), adapted) <= 1e-5);
}

TEST_CASE("lora_refusals_name_the_fix", "[nn]") {
  nn::LlamaForCausalLM model(small_llama());
  const auto refused = [&](nn::LoraConfig c) { return error_of([&] { nn::add_lora(*model, c); }); };
  const auto nothing = refused({.target_modules = {"q_proj", "query"}});
  CHECK(nothing.find("\"query\" matches no layer") != std::string::npos);
  CHECK(nothing.find("q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head") != std::string::npos);
  CHECK(refused({.target_modules = {"self_attn"}}).find("has no LoRA slot") != std::string::npos);
  CHECK(refused({.target_modules = {"embed_tokens"}}).find("has no LoRA slot") != std::string::npos);
  CHECK(refused({.r = 0}).find("r is 0") != std::string::npos);
  CHECK(refused({.dropout = 1.0}).find("dropout") != std::string::npos);
  CHECK(refused({.target_pattern = "(unclosed"}).find("not a regular expression") != std::string::npos);
  CHECK(refused({.target_pattern = "nothing"}).find("matches no layer") != std::string::npos);
  // Nothing refused changed the model: every parameter still trains, no adapter.
  for (const auto& p : model->parameters()) CHECK(p.requires_grad());
  nn::add_lora(*model);
  CHECK(refused({}).find("already has a LoRA adapter") != std::string::npos);
  // A checkpoint's state with adapters into a model without them: refused, not served as the base.
  std::map<std::string, torch::Tensor> state;
  for (const auto& p : model->named_parameters()) state.emplace(p.key(), p.value());
  nn::LlamaForCausalLM plain(small_llama());
  CHECK(error_of([&] { dtrain::checkpointer::Checkpoint::load_tensors(*plain, state, "model.pt"); }).find("nn::add_lora") !=
        std::string::npos);
  nn::add_lora(*plain);
  dtrain::checkpointer::Checkpoint::load_tensors(*plain, state, "model.pt");  // with them, it loads
  CHECK(error_of([&] { nn::save_peft_adapter(*nn::LlamaForCausalLM(small_llama()), Dir("lora_none").path); })
            .find("no LoRA adapter") != std::string::npos);
}

namespace {
void run_reference(const std::string& args) {
  const auto r = dtrain_test::run_command(std::string(DTRAIN_VENV_PYTHON) + " " + DTRAIN_LORA_REFERENCE + " " + args);
  INFO(r.output);
  std::cout << r.output;
  REQUIRE(r.status == 0);
}

// `name`'s base with PEFT's adapter loaded by dtrain: the PeftModel's logits; then dtrain's export
// of the adapter (trained a step further) loaded by PEFT with dtrain's logits.
template <class Model>
void round_trip(const fs::path& dir, const std::string& name) {
  using Config = typename Model::Impl::Config;
  Model model(Config::from_pretrained(dir / name));
  nn::load_pretrained(model, dir / name);
  const auto config = nn::load_peft_adapter(*model, dir / (name + "_peft"));
  CHECK(config.r == 4);
  model->eval();
  std::map<std::string, torch::Tensor> ref;
  for (auto& [key, tensor] : weights::read(dir / (name + "_peft.safetensors"))) ref[key] = tensor;
  const auto ids = ref.at("input_ids"), mask = ref.at("attention_mask");
  {
    torch::NoGradGuard no_grad;
    const double gap = max_diff(model(ids, mask), ref.at("logits"));
    std::cout << name << ": PEFT's adapter in dtrain, logits within " << gap << "\n";
    CHECK(gap <= 1e-5);
  }
  model->train();
  std::vector<torch::Tensor> adapters;
  for (const auto& [key, p] : nn::lora_parameters(*model)) adapters.push_back(p);
  torch::optim::AdamW opt(adapters, torch::optim::AdamWOptions(1e-2));
  nn::causal_lm_loss(model(ids, mask), ids.masked_fill(mask == 0, -100)).backward();
  opt.step();
  model->eval();
  nn::save_peft_adapter(*model, dir / (name + "_dtrain"), {.base_model_name_or_path = (dir / name).string()});
  torch::NoGradGuard no_grad;
  weights::save_safetensors(dir / (name + "_dtrain.safetensors"),
                            {{"input_ids", ids}, {"attention_mask", mask}, {"logits", model(ids, mask)}});
  run_reference("check " + (dir / name).string() + " " + (dir / (name + "_dtrain")).string() + " " +
                (dir / (name + "_dtrain.safetensors")).string());
}
}  // namespace

TEST_CASE("lora_peft_adapters_load_both_ways_with_equal_logits", "[nn][python]") {
  Dir dir("lora_peft");
  run_reference("make " + dir.path.string());
  round_trip<nn::LlamaForCausalLM>(dir.path, "llama");  // rslora, six of the seven projections
  round_trip<nn::GPT2LMHeadModel>(dir.path, "gpt2");    // Conv1D: fan_in_fan_out

  // An adapter of another base: Llama's q_proj into GPT-2, GPT-2's c_attn into a Llama; and a
  // Llama of other widths. The refused model keeps no adapter and still trains in full.
  nn::GPT2LMHeadModel gpt2(nn::GPT2Config::from_pretrained(dir.path / "gpt2"));
  CHECK(error_of([&] { nn::load_peft_adapter(*gpt2, dir.path / "llama_peft"); }).find("matches no layer") != std::string::npos);
  auto other = small_llama();
  nn::LlamaForCausalLM narrow(other);
  const auto shapes = error_of([&] { nn::load_peft_adapter(*narrow, dir.path / "llama_peft"); });
  CHECK(shapes.find("another base") != std::string::npos);
  CHECK(nn::lora_parameters(*narrow).empty());
  for (const auto& p : narrow->parameters()) CHECK(p.requires_grad());
  CHECK(error_of([&] { nn::load_peft_adapter(*narrow, dir.path / "missing"); }).find("adapter_config.json") != std::string::npos);

  // Continuing a PEFT adapter: the base directory named is recorded as add_lora records
  // LoraConfig::base_model (its checkpoints refuse another base, from_lora_checkpoint serves them:
  // examples/CMakeLists.txt, example.finetune_llm.*peft*).
  const auto llama_dir = dir.path / "llama";
  const auto base_of = [&] {
    nn::LlamaForCausalLM m(nn::LlamaConfig::from_pretrained(llama_dir));
    nn::load_pretrained(m, llama_dir);
    return m;
  };
  auto model = base_of();
  const auto recorded = nn::load_peft_adapter(*model, dir.path / "llama_peft", llama_dir);
  CHECK(recorded.base_model == llama_dir.string());
  CHECK(nn::detail::lora_config_of(*model)->base_files == nn::base_model_files(llama_dir));
  std::map<std::string, torch::Tensor> file_values;
  for (auto& [name, p] : nn::lora_parameters(*model)) {
    file_values[name] = p.detach().clone();
    torch::NoGradGuard no_grad;
    p.add_(1.0);
  }
  // Onto adapters of the same config: their values replaced by the file's, their base kept.
  nn::load_peft_adapter(*model, dir.path / "llama_peft");
  for (auto& [name, p] : nn::lora_parameters(*model)) CHECK(torch::equal(p, file_values.at(name)));
  CHECK(nn::detail::lora_config_of(*model)->base_model == llama_dir.string());
  // add_lora with the base, then the adapter: what a resumable run does.
  auto added = base_of();
  nn::add_lora(*added, recorded);
  nn::load_peft_adapter(*added, dir.path / "llama_peft");
  for (auto& [name, p] : nn::lora_parameters(*added)) CHECK(torch::equal(p, file_values.at(name)));
  CHECK(nn::detail::lora_config_of(*added)->base_files == nn::base_model_files(llama_dir));
  // Refused, the adapters left as they were: another base named than the one they were added on,
  // and a file whose adapters have another rank.
  const auto another_base = error_of([&] { nn::load_peft_adapter(*added, dir.path / "llama_peft", dir.path / "gpt2"); });
  CHECK(another_base.find("added on the base model " + llama_dir.string() + ", not " + (dir.path / "gpt2").string()) !=
        std::string::npos);
  auto rank2 = base_of();
  nn::add_lora(*rank2, {.r = 2, .target_modules = recorded.target_modules, .target_pattern = recorded.target_pattern});
  nn::save_peft_adapter(*rank2, dir.path / "llama_rank2");
  for (auto& [name, p] : nn::lora_parameters(*added)) {
    torch::NoGradGuard no_grad;
    p.add_(1.0);
  }
  const auto other_rank = error_of([&] { nn::load_peft_adapter(*added, dir.path / "llama_rank2"); });
  CHECK(other_rank.find("its adapters have r 2") != std::string::npos);
  for (auto& [name, p] : nn::lora_parameters(*added)) CHECK(torch::equal(p, file_values.at(name) + 1.0));
}

namespace {
// Loss and every trainable parameter's gradient after one forward and backward in training mode,
// from the same seed (dropout draws included).
template <class Model>
std::pair<torch::Tensor, std::vector<torch::Tensor>> loss_and_grads(Model& model, const torch::Tensor& ids, bool recompute) {
  model->gradient_checkpointing_enable(recompute);
  model->train();
  model->zero_grad();
  torch::manual_seed(42);
  const auto loss = nn::causal_lm_loss(model(ids), ids);
  loss.backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : model->parameters())
    if (p.requires_grad()) grads.push_back(p.grad().clone());
  return {loss.detach(), grads};
}

template <class Model>
void check_recompute_equals_plain(Model& model, const torch::Tensor& ids) {
  const auto [plain_loss, plain] = loss_and_grads(model, ids, false);
  const auto [loss, grads] = loss_and_grads(model, ids, true);
  CHECK(torch::equal(loss, plain_loss));
  REQUIRE(grads.size() == plain.size());
  double worst = 0;
  for (std::size_t i = 0; i < grads.size(); ++i) worst = std::max(worst, max_diff(grads[i], plain[i]));
  std::cout << "recomputed in backward: " << grads.size() << " gradients within " << worst << " of the plain run's\n";
  CHECK(worst <= 1e-6);
}
}  // namespace

TEST_CASE("lora_dropout_drops_p_scales_the_rest_and_repeats_from_the_generator_state", "[nn]") {
  const auto x = torch::ones({64, 1000});
  torch::manual_seed(3);
  const auto a = nn::detail::lora_dropout(x, 0.25, true);
  const double dropped = (a == 0).to(torch::kDouble).mean().item<double>();
  CHECK(std::abs(dropped - 0.25) < 0.01);  // 64,000 draws: the standard error is 0.0017
  CHECK(a.masked_select(a != 0).sub(1.0 / 0.75).abs().max().item<double>() < 1e-6);
  torch::manual_seed(3);
  CHECK(torch::equal(nn::detail::lora_dropout(x, 0.25, true), a));  // what recomputation relies on
  CHECK(!torch::equal(nn::detail::lora_dropout(x, 0.25, true), a));
  CHECK(torch::equal(nn::detail::lora_dropout(x, 0.25, false), x));
  CHECK(torch::equal(nn::detail::lora_dropout(x, 0.0, true), x));
}

TEST_CASE("causal_lm_gradient_checkpointing_equals_the_plain_run", "[nn]") {
  torch::manual_seed(3);
  const auto ids = torch::randint(3, 50, {2, 9});
  nn::LlamaForCausalLM llama(small_llama());  // every parameter trains
  check_recompute_equals_plain(llama, ids);
  nn::add_lora(*llama, {.r = 4, .dropout = 0.2});  // a frozen base; LoRA's dropout draws again in backward
  perturb_adapters(*llama);
  check_recompute_equals_plain(llama, ids);

  auto g = small_gpt2(2);
  g.resid_pdrop = g.attn_pdrop = g.embd_pdrop = 0.1;  // dropout everywhere
  nn::GPT2LMHeadModel gpt2(g);
  check_recompute_equals_plain(gpt2, ids);
  // Outside training, or without grad mode, it is the plain forward.
  gpt2->gradient_checkpointing_enable();
  gpt2->eval();
  torch::NoGradGuard no_grad;
  CHECK(!gpt2(ids).requires_grad());
}

namespace {
// A byte-level BPE without merges: ids 0..255 are the bytes, 256 is <|endoftext|> (EOS and pad).
dtrain::data::BpeTokenizer byte_tokenizer(const std::string& special = "<|endoftext|>") {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[dtrain::data::detail::bpe::byte_chars()[static_cast<std::size_t>(b)]] = b;
  vocab[special] = 256;
  const nlohmann::json level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  const nlohmann::json j = {
      {"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr},
      {"added_tokens", {{{"id", 256}, {"content", special}, {"single_word", false}, {"lstrip", false},
                         {"rstrip", false}, {"normalized", true}, {"special", true}}}},
      {"normalizer", nullptr}, {"pre_tokenizer", level}, {"post_processor", level}, {"decoder", level},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                 {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                 {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  return dtrain::data::BpeTokenizer::from_json(j);  // its EOS: <|endoftext|> by name
}

std::vector<std::int64_t> ids_of(const torch::Tensor& t) { return {t.data_ptr<std::int64_t>(), t.data_ptr<std::int64_t>() + t.numel()}; }
}  // namespace

TEST_CASE("causal_lm_data_masks_prompts_and_packs_documents", "[nn][data]") {
  namespace data = dtrain::data;
  const auto tok = byte_tokenizer();
  Dir dir("causal_lm_data");
  {
    std::ofstream(dir.path / "train.jsonl") << R"({"prompt": "Q: 2+2?", "response": " 4"})" "\n"
                                            << R"({"prompt": "Hi", "response": " there"})" "\n"
                                            << R"({"text": "plain"})" "\n";
  }
  const data::CausalLMData packed(dir.path / "train.jsonl", tok, {.max_length = 16});
  CHECK(packed.documents() == 3);
  // In order, whole: "Q: 2+2?" (7) + " 4" + EOS (3) = 10, and "Hi" + " there" + EOS = 9 does not fit
  // beside it; then 9 + "plain" + EOS (6) and a token of padding.
  REQUIRE(packed.size() == 2);
  const auto row0 = packed[0], row1 = packed[1];
  CHECK(ids_of(row0["input_ids"]).size() == 16);
  using Ids = std::vector<std::int64_t>;
  CHECK(ids_of(row0["labels"]) == Ids{-100, -100, -100, -100, -100, -100, -100, ' ', '4', 256,  // the response and EOS teach
                                      -100, -100, -100, -100, -100, -100});                  // padding teaches nothing
  CHECK(ids_of(row0["position_ids"]) == Ids{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5});
  CHECK(ids_of(row1["labels"]) == Ids{-100, -100, ' ', 't', 'h', 'e', 'r', 'e', 256,
                                      -100, 'l', 'a', 'i', 'n', 256, -100});  // a text: all but its first token
  CHECK(ids_of(row1["position_ids"]) == Ids{0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4, 5, 0});
  CHECK(ids_of(row0["input_ids"]).back() == 256);  // the pad id: EOS here
  CHECK(packed.label_tokens() == 3 + 7 + 5);

  // Packing changes no logit: each document's logits in a packed row are its logits alone.
  torch::manual_seed(0);
  auto config = small_llama();
  config.vocab_size = 257;
  nn::LlamaForCausalLM model(config);
  model->eval();
  torch::NoGradGuard no_grad;
  static_assert(data::RandomAccess<data::CausalLMData>);
  const auto batch = packed.get_batch(torch::tensor({0, 1}));
  CHECK(!batch.contains("attention_mask"));
  const auto logits = model(batch);
  const auto alone = model(row1["input_ids"].narrow(0, 9, 6).unsqueeze(0));
  CHECK(max_diff(logits[1].narrow(0, 9, 6), alone[0]) <= 1e-5);

  // Unpacked: a document a row, padded per batch with an attention_mask; prompts may teach too.
  const data::CausalLMData rows(dir.path / "train.jsonl", tok, {.max_length = 16, .pack = false, .train_on_prompt = true});
  REQUIRE(rows.size() == 3);
  const auto padded = rows.get_batch(torch::tensor({0, 1}));
  CHECK(padded["input_ids"].sizes() == torch::IntArrayRef{2, 10});
  CHECK(ids_of(padded["attention_mask"][1]) == Ids{1, 1, 1, 1, 1, 1, 1, 1, 1, 0});
  CHECK(ids_of(padded["labels"][0]).at(1) == ':');  // the prompt's own tokens are labels now
  CHECK(ids_of(padded["labels"][1]).back() == -100);
  CHECK(model(padded).sizes() == torch::IntArrayRef{2, 10, 257});
}

TEST_CASE("causal_lm_data_refusals_name_the_record", "[nn][data]") {
  namespace data = dtrain::data;
  const auto tok = byte_tokenizer();
  Dir dir("causal_lm_bad");
  std::ofstream(dir.path / "long.jsonl") << R"({"prompt": "a prompt longer than the context", "response": "x"})" "\n";
  const auto too_long = error_of([&] { data::CausalLMData(dir.path / "long.jsonl", tok, {.max_length = 8}); });
  INFO(too_long);
  CHECK(too_long.find("long.jsonl:1: the prompt is 32 tokens and max_length 8") != std::string::npos);
  // A response that does not fit is cut, and counted.
  const auto cut = data::CausalLMData::from_records({{"Q", "a long answer"}}, tok, {.max_length = 4});
  CHECK(cut.truncated() == 1);
  CHECK(ids_of(cut[0]["input_ids"]) == std::vector<std::int64_t>{'Q', 'a', ' ', 'l'});
  std::ofstream(dir.path / "other.csv") << "question,answer\nwhat,that\n";
  CHECK(error_of([&] { data::CausalLMData(dir.path / "other.csv", tok); }).find("other.csv:2: the record has neither") != std::string::npos);
  std::ofstream(dir.path / "data.txt") << "text\n";
  CHECK(error_of([&] { data::CausalLMData(dir.path / "data.txt", tok); }).find("JSON Lines (.jsonl) or CSV") != std::string::npos);
  CHECK(error_of([&] { data::CausalLMData(dir.path / "other.csv", byte_tokenizer("<|sep|>")); }).find("no end-of-sequence token") !=
        std::string::npos);
}
