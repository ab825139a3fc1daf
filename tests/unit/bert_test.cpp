// SPDX-License-Identifier: Apache-2.0
// nn/bert*.hpp: BertConfig from config.json (and its refusals), parameter names that are
// transformers' names, strict loads that fail when a layer or a name differs, the attention mask;
// and, through the Python environment of scripts/python-env (tests/unit/bert_reference.py), the
// real all-MiniLM-L6-v2 and a BertForSequenceClassification saved by transformers computing what
// transformers computes, and dtrain's export loading in transformers with equal logits.

#include "../dtrain_catch.hpp"
#include "../run_command.hpp"

#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <dtrain/checkpointer/model_config.hpp>
#include <dtrain/nn/bert.hpp>
#include <dtrain/nn/bert_export.hpp>
#include <dtrain/weights.hpp>

namespace fs = std::filesystem;
namespace nn = dtrain::nn;
namespace weights = dtrain::weights;

static_assert(dtrain::checkpointer::DescribedModel<nn::BertModel>);
static_assert(dtrain::checkpointer::DescribedModel<nn::BertForSequenceClassification>);

namespace {

struct Dir {
  fs::path path;
  Dir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("dtrain_bert_" + std::to_string(rd()) + std::to_string(getpid()));
    fs::create_directories(path);
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& n) const { return path / n; }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

/// A small BERT: 2 layers, 32 wide, 4 heads.
nn::BertConfig tiny(std::int64_t layers = 2) {
  nn::BertConfig c;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.intermediate_size = 64;
  c.max_position_embeddings = 16;
  return c.with_num_labels(3);
}

using State = std::vector<std::pair<std::string, torch::Tensor>>;

State state_of(torch::nn::Module& m) {
  State s;
  for (const auto& p : m.named_parameters()) s.emplace_back(p.key(), p.value().detach().clone());
  return s;
}

/// Three rows of 12, 7 and 3 tokens ([CLS] ... [SEP], then padding id 0), the second half of the
/// first row of token type 1.
struct Batch {
  torch::Tensor input_ids, attention_mask, token_type_ids;
};
Batch batch(std::int64_t vocab) {
  torch::manual_seed(5);
  const std::vector<std::int64_t> lengths = {12, 7, 3};
  auto ids = torch::randint(vocab > 2000 ? 1000 : 3, std::min<std::int64_t>(vocab, 29000), {3, 12}, torch::kLong);
  auto mask = torch::zeros({3, 12}, torch::kLong);
  auto types = torch::zeros({3, 12}, torch::kLong);
  for (std::int64_t r = 0; r < 3; ++r) {
    const auto n = lengths[r];
    ids[r][0] = 101 % vocab;
    ids[r][n - 1] = 102 % vocab;
    ids.index_put_({r, torch::indexing::Slice(n, torch::indexing::None)}, 0);
    mask.index_put_({r, torch::indexing::Slice(0, n)}, 1);
  }
  types.index_put_({0, torch::indexing::Slice(6, 12)}, 1);
  return {ids, mask, types};
}

/// Runs tests/unit/bert_reference.py with the Python of scripts/python-env.
dtrain_test::CommandResult reference(const std::string& args) {
  return dtrain_test::run_command(std::string(DTRAIN_VENV_PYTHON) + " " + DTRAIN_BERT_REFERENCE + " " + args);
}

fs::path minilm_dir() {
  auto r = reference("minilm-dir");
  INFO(r.output);
  REQUIRE(r.status == 0);
  while (!r.output.empty() && std::isspace(static_cast<unsigned char>(r.output.back()))) r.output.pop_back();
  const auto path = fs::path(r.output.substr(r.output.rfind('\n') + 1));
  REQUIRE(fs::exists(path / "model.safetensors"));
  return path;
}

/// Writes the batch and dtrain's `outputs` to `file` and has transformers check them (`kind`:
/// base or classification); requires "N checks, 0 failed" with N > 0.
void check_in_python(const std::string& kind, const fs::path& model_dir, const fs::path& file, const Batch& b,
                     State outputs, const std::map<std::string, std::string>& metadata = {}) {
  outputs.emplace_back("input_ids", b.input_ids);
  outputs.emplace_back("attention_mask", b.attention_mask);
  outputs.emplace_back("token_type_ids", b.token_type_ids);
  weights::save_safetensors(file, outputs, metadata);
  const auto r = reference("check " + kind + " " + model_dir.string() + " " + file.string());
  INFO(r.output);
  std::cout << r.output;  // the largest differences, in the test's log
  CHECK(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains(" checks, 0 failed"));
  CHECK_THAT(r.output, !Catch::StartsWith("0 checks") && !Catch::Contains("\n0 checks"));
}

std::string id2label_json(const nn::BertConfig& c) { return c.to_json()["id2label"].dump(); }

}  // namespace

TEST_CASE("bert_config_reads_hugging_face_config_json", "[nn]") {
  // all-MiniLM-L6-v2's config.json.
  const auto minilm = nlohmann::json::parse(R"({
    "_name_or_path": "nreimers/MiniLM-L6-H384-uncased", "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1, "gradient_checkpointing": false, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "hidden_size": 384, "initializer_range": 0.02, "intermediate_size": 1536,
    "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
    "num_hidden_layers": 6, "pad_token_id": 0, "position_embedding_type": "absolute",
    "transformers_version": "4.8.2", "type_vocab_size": 2, "use_cache": true, "vocab_size": 30522})");
  const auto c = nn::BertConfig::from_json(minilm);
  CHECK(c.hidden_size == 384);
  CHECK(c.num_hidden_layers == 6);
  CHECK(c.num_attention_heads == 12);
  CHECK(c.intermediate_size == 1536);
  CHECK(c.layer_norm_eps == 1e-12);
  CHECK(c.pad_token_id == 0);
  CHECK(c.num_labels() == 2);  // transformers' default
  CHECK(c.extra == nlohmann::json{{"gradient_checkpointing", false}, {"use_cache", true}});
  // Through JSON (model_config.json, config.json) and back: equal.
  CHECK(nlohmann::json(c).get<nn::BertConfig>() == c);

  auto labelled = minilm;
  labelled["id2label"] = {{"1", "pos"}, {"0", "neg"}};
  labelled["label2id"] = {{"neg", 0}, {"pos", 1}};
  labelled["classifier_dropout"] = 0.25;
  labelled["problem_type"] = "single_label_classification";
  const auto l = nn::BertConfig::from_json(labelled);
  CHECK(l.id2label == std::vector<std::string>{"neg", "pos"});
  CHECK(l.classifier_dropout == 0.25);
  CHECK(l.to_json()["problem_type"] == "single_label_classification");
  CHECK(l.to_json()["label2id"] == labelled["label2id"]);
  CHECK(nlohmann::json(l).get<nn::BertConfig>() == l);
  auto counted = minilm;
  counted["num_labels"] = 4;
  CHECK(nn::BertConfig::from_json(counted).id2label.back() == "LABEL_3");
  auto null_pad = minilm;
  null_pad["pad_token_id"] = nullptr;
  CHECK(!nn::BertConfig::from_json(null_pad).pad_token_id);

  // What is not implemented is refused, naming the key and the value.
  const auto refused = [&](const char* key, nlohmann::json value) {
    auto j = minilm;
    j[key] = std::move(value);
    return error_of([&] { nn::BertConfig::from_json(j, "dir/config.json"); });
  };
  CHECK_THAT(refused("hidden_act", "swish"), Catch::Contains("dir/config.json") && Catch::Contains("\"hidden_act\": \"swish\""));
  CHECK_THAT(refused("position_embedding_type", "relative_key"),
             Catch::Contains("position_embedding_type") && Catch::Contains("relative_key") && Catch::Contains("not supported"));
  CHECK_THAT(refused("is_decoder", true), Catch::Contains("\"is_decoder\": true is not supported"));
  CHECK_THAT(refused("add_cross_attention", true), Catch::Contains("add_cross_attention"));
  CHECK_THAT(refused("model_type", "roberta"), Catch::Contains("model_type \"roberta\" is not supported"));
  CHECK_THAT(refused("num_attention_heads", 5), Catch::Contains("not a multiple"));
  CHECK_THAT(refused("hidden_size", "wide"), Catch::Contains("\"hidden_size\" is \"wide\""));
  CHECK_THAT(refused("id2label", nlohmann::json{{"0", "a"}, {"2", "b"}}), Catch::Contains("id2label"));
  CHECK_THAT(refused("id2label", nlohmann::json{{"0", "a"}, {"00", "b"}}), Catch::Contains("\"00\": \"b\" does not"));
  CHECK_THAT(refused("label2id", nlohmann::json{{"LABEL_0", 1}, {"LABEL_1", 0}}), Catch::Contains("not the inverse"));
  CHECK_THAT(error_of([] { nn::BertConfig::from_pretrained("/nonexistent/model"); }),
             Catch::Contains("/nonexistent/model/config.json"));

  // A model describes itself in a checkpoint: its type and config.json's form.
  nn::BertForSequenceClassification model(tiny());
  const auto described = nlohmann::json::parse(dtrain::checkpointer::describe_model(model));
  CHECK(described["config"]["num_hidden_layers"] == 2);
  CHECK(described["config"].get<nn::BertConfig>() == tiny());
}

TEST_CASE("bert_names_are_transformers_names", "[nn]") {
  nn::BertForSequenceClassification model(tiny());
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) names.push_back(p.key());
  std::vector<std::string> expected = {"bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
                                       "bert.embeddings.token_type_embeddings.weight", "bert.embeddings.LayerNorm.weight",
                                       "bert.embeddings.LayerNorm.bias"};
  for (int i = 0; i < 2; ++i)
    for (const char* m : {"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                          "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm"})
      for (const char* t : {"weight", "bias"}) expected.push_back("bert.encoder.layer." + std::to_string(i) + "." + m + "." + t);
  for (const char* n : {"bert.pooler.dense.weight", "bert.pooler.dense.bias", "classifier.weight", "classifier.bias"})
    expected.push_back(n);
  CHECK(names == expected);
  CHECK(model->named_buffers().size() == 0);  // transformers 5's position_ids and token_type_ids are not saved
  CHECK(model->bert->embeddings->word_embeddings->weight[0].abs().sum().item<double>() == 0);  // the padding row
  CHECK(model->classifier->weight.sizes() == torch::IntArrayRef{3, 32});
}

TEST_CASE("bert_strict_load_fails_when_a_layer_or_name_differs", "[nn]") {
  Dir dir;
  torch::manual_seed(1);
  nn::BertForSequenceClassification source(tiny());
  weights::save_safetensors(dir / "model.safetensors", state_of(*source));
  {
    nn::BertForSequenceClassification same(tiny());
    const auto report = weights::load(*same, dir.path);
    CHECK(report.complete());
    CHECK(torch::equal(same->bert->layer[1]->as<nn::BertLayerImpl>()->value->weight,
                       source->bert->layer[1]->as<nn::BertLayerImpl>()->value->weight));
  }
  // One layer fewer: the file's layer 1 is unexpected.
  nn::BertForSequenceClassification shallow(tiny(1));
  CHECK_THAT(error_of([&] { weights::load(*shallow, dir.path); }),
             Catch::Contains("strict") && Catch::Contains("\"bert.encoder.layer.1.attention.self.query.weight\""));
  CHECK_THAT(error_of([&] { nn::load_pretrained(*shallow, dir.path); }), Catch::Contains("bert.encoder.layer.1."));
  // One layer more: the module's layer 2 is missing.
  nn::BertForSequenceClassification deep(tiny(3));
  CHECK_THAT(error_of([&] { weights::load(*deep, dir.path); }),
             Catch::Contains("missing from the file \"bert.encoder.layer.2."));
  // A renamed key: the file's name unexpected and the module's missing.
  auto renamed = state_of(*source);
  for (auto& [k, v] : renamed)
    if (k == "bert.encoder.layer.0.attention.output.LayerNorm.weight") k = "bert.encoder.layer.0.attention.output.LayerNorm.gamma";
  weights::save_safetensors(dir / "renamed.safetensors", renamed);
  nn::BertForSequenceClassification target(tiny());
  const auto renamed_error = error_of([&] { nn::load_pretrained(*target, dir / "renamed.safetensors"); });
  CHECK_THAT(renamed_error, Catch::Contains("\"bert.encoder.layer.0.attention.output.LayerNorm.weight\"") &&
                                Catch::Contains("\"bert.encoder.layer.0.attention.output.LayerNorm.gamma\""));
  // Another width or label count: a shape error naming the key, strict or not.
  auto wide = tiny();
  wide.intermediate_size = 48;
  nn::BertForSequenceClassification other(wide);
  CHECK_THAT(error_of([&] { weights::load(*other, dir.path, {.strict = false}); }),
             Catch::Contains("intermediate.dense.weight") && Catch::Contains("shape"));
  nn::BertForSequenceClassification five(tiny().with_num_labels(5));
  CHECK_THAT(error_of([&] { nn::load_pretrained(*five, dir.path); }), Catch::Contains("\"classifier.weight\" has shape"));

  // A bare BertModel's file into the classifier: the head is missing, as transformers reports it;
  // the classifier's file into a bare BertModel: the head is unexpected. Old files' position_ids
  // are skipped, as transformers skips them.
  auto base_state = state_of(*source->bert);
  base_state.emplace_back("embeddings.position_ids", torch::arange(16).unsqueeze(0));
  weights::save_safetensors(dir / "base.safetensors", base_state);
  nn::BertForSequenceClassification head(tiny());
  auto report = nn::load_pretrained(*head, dir / "base.safetensors");
  CHECK(report.missing == std::vector<std::string>{"classifier.weight", "classifier.bias"});
  CHECK(report.unexpected.empty());
  CHECK(torch::equal(head->bert->pooler->weight, source->bert->pooler->weight));
  nn::BertModel base(tiny());
  report = nn::load_pretrained(base, dir.path);  // the handle, as the module
  CHECK(report.missing.empty());
  CHECK(report.unexpected == std::vector<std::string>{"classifier.bias", "classifier.weight"});
  CHECK(torch::equal(base->embeddings->word_embeddings->weight, source->bert->embeddings->word_embeddings->weight));
  CHECK_THAT(error_of([&] { weights::load(*base, dir / "base.safetensors"); }),
             Catch::Contains("\"embeddings.position_ids\""));  // plain weights::load is strict about it
}

TEST_CASE("bert_attention_mask_hides_padding", "[nn]") {
  torch::manual_seed(2);
  nn::BertForSequenceClassification model(tiny());
  model->eval();
  auto b = batch(50);
  const auto padded = model->bert(b.input_ids, b.attention_mask, b.token_type_ids);
  const auto logits = model(b.input_ids, b.attention_mask, b.token_type_ids);
  for (std::int64_t r = 0; r < 3; ++r) {
    const auto n = b.attention_mask[r].sum().item<std::int64_t>();
    const auto cut = [&](const torch::Tensor& t) { return t.slice(0, r, r + 1).slice(1, 0, n); };
    const auto alone = model->bert(cut(b.input_ids), torch::Tensor(), cut(b.token_type_ids));
    CHECK((padded.last_hidden_state.slice(0, r, r + 1).slice(1, 0, n) - alone.last_hidden_state).abs().max().item<double>() < 1e-5);
    CHECK((padded.pooler_output[r] - alone.pooler_output[0]).abs().max().item<double>() < 1e-5);
    CHECK((logits[r] - model(cut(b.input_ids), torch::Tensor(), cut(b.token_type_ids))[0]).abs().max().item<double>() < 1e-5);
  }
  // Without the mask the padding is attended to: the short rows change.
  const auto unmasked = model->bert(b.input_ids, torch::Tensor(), b.token_type_ids);
  CHECK((unmasked.pooler_output[2] - padded.pooler_output[2]).abs().max().item<double>() > 1e-4);
  // Training mode: dropout draws, the loss is finite, gradients reach every parameter but the
  // padding row of the word embeddings.
  model->train();
  const auto loss = torch::cross_entropy_loss(model(b.input_ids, b.attention_mask, b.token_type_ids),
                                              torch::tensor({0, 1, 2}, torch::kLong));
  loss.backward();
  CHECK(std::isfinite(loss.item<double>()));
  for (const auto& p : model->named_parameters()) {
    INFO(p.key());
    CHECK(p.value().grad().defined());
  }
  CHECK(model->bert->embeddings->word_embeddings->weight.grad()[0].abs().sum().item<double>() == 0);
}

TEST_CASE("bert_pooled_skips_padding_with_forwards_result_and_gradients", "[nn]") {
  auto c = tiny();
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0;  // training with no draws: comparable
  torch::manual_seed(3);
  nn::BertModel model(c);
  auto b = batch(50);
  for (const bool training : {false, true}) {
    INFO("training " << training);
    model->train(training);
    model->zero_grad();
    const auto expected = model(b.input_ids, b.attention_mask, b.token_type_ids).pooler_output;
    const auto weight = torch::randn_like(expected);
    (expected * weight).sum().backward();
    State grads;
    for (const auto& p : model->named_parameters()) grads.emplace_back(p.key(), p.value().grad().clone());
    model->zero_grad();
    const auto got = model->pooled(b.input_ids, b.attention_mask, b.token_type_ids);  // packed: the rows are padded
    CHECK((got - expected).abs().max().item<double>() < 1e-5);
    (got * weight).sum().backward();
    for (const auto& [name, grad] : grads) {
      INFO(name);
      CHECK((model->named_parameters()[name].grad() - grad).abs().max().item<double>() < 1e-5);
    }
  }
  // A row that starts with padding (left padding): pooled reads position 0 as transformers does.
  model->eval();
  auto left = b;
  left.attention_mask = b.attention_mask.flip(1);
  CHECK((model->pooled(left.input_ids, left.attention_mask) - model(left.input_ids, left.attention_mask).pooler_output)
            .abs().max().item<double>() == 0);
}

TEST_CASE("bert_matches_transformers", "[nn][python][compat]") {
  Dir dir;
  const auto minilm = minilm_dir();
  const auto config = nn::BertConfig::from_pretrained(minilm);
  nn::BertModel model(config);
  const auto report = nn::load_pretrained(*model, minilm);  // strict; its position_ids skipped
  CHECK(report.complete());
  CHECK(report.loaded == 103);  // 6 layers of 16, 5 for the embeddings, 2 for the pooler
  model->eval();
  torch::NoGradGuard no_grad;
  const auto b = batch(config.vocab_size);
  const auto out = model(b.input_ids, b.attention_mask, b.token_type_ids);
  check_in_python("base", minilm, dir / "minilm.safetensors", b,
                  {{"last_hidden_state", out.last_hidden_state}, {"pooler_output", out.pooler_output}});
}

TEST_CASE("bert_classifier_loads_transformers_save_pretrained", "[nn][python]") {
  Dir dir;
  auto r = reference("make-classifier " + dir.path.string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  for (const auto* saved : {"cls", "cls_sharded"}) {
    INFO(saved);
    const auto config = nn::BertConfig::from_pretrained(dir / saved);
    CHECK(config.id2label == std::vector<std::string>{"negative", "neutral", "positive"});
    nn::BertForSequenceClassification model(config);
    const auto report = weights::load(*model, dir / saved);  // strict: every name as transformers'
    CHECK(report.complete());
    model->eval();
    torch::NoGradGuard no_grad;
    const auto b = batch(config.vocab_size);
    check_in_python("classification", dir / saved, dir / (std::string(saved) + ".safetensors"), b,
                    {{"logits", model(b.input_ids, b.attention_mask, b.token_type_ids)}},
                    {{"id2label", id2label_json(config)}});
  }
}

TEST_CASE("bert_export_loads_in_transformers", "[nn][python]") {
  Dir dir;
  auto r = reference("make-classifier " + dir.path.string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto minilm = minilm_dir();
  auto config = nn::BertConfig::from_pretrained(dir / "cls");
  config.id2label = {"bad", "fine", "good"};  // renamed by the fine-tuning
  nn::BertForSequenceClassification model(config);
  nn::load_pretrained(*model, dir / "cls");
  // A few steps of fine-tuning, so the export differs from what transformers saved.
  const auto b = batch(config.vocab_size);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    torch::cross_entropy_loss(model(b.input_ids, b.attention_mask, b.token_type_ids), torch::tensor({0, 1, 2}, torch::kLong))
        .backward();
    opt.step();
  }
  // Out through a dtrain checkpoint's way back: built from its description, weights copied.
  auto rebuilt = nn::BertForSequenceClassification(
      nlohmann::json::parse(dtrain::checkpointer::describe_model(model))["config"].get<nn::BertConfig>());
  {
    torch::NoGradGuard no_grad;
    auto params = rebuilt->named_parameters();
    for (const auto& p : model->named_parameters()) params[p.key()].copy_(p.value());
  }
  const auto out = dir / "export";
  nn::save_pretrained(*rebuilt, out, {.files = {minilm / "tokenizer.json", minilm / "vocab.txt",
                                                minilm / "tokenizer_config.json", minilm / "special_tokens_map.json"}});
  CHECK(fs::exists(out / "tokenizer.json"));
  CHECK(fs::exists(out / "vocab.txt"));
  const auto written = nlohmann::json::parse(std::ifstream(out / "config.json"));
  CHECK(written["architectures"] == nlohmann::json{"BertForSequenceClassification"});
  CHECK(written["model_type"] == "bert");
  CHECK(written["id2label"] == nlohmann::json{{"0", "bad"}, {"1", "fine"}, {"2", "good"}});
  CHECK(written["label2id"] == nlohmann::json{{"bad", 0}, {"fine", 1}, {"good", 2}});
  CHECK(nn::BertConfig::from_pretrained(out) == config);
  CHECK_THAT(error_of([&] { nn::save_pretrained(*rebuilt, dir / "bad", {.files = {dir / "cls" / "config.json"}}); }),
             Catch::Contains("would replace the config.json"));

  rebuilt->eval();
  torch::NoGradGuard no_grad;
  check_in_python("classification", out, dir / "export.safetensors", b,
                  {{"logits", rebuilt(b.input_ids, b.attention_mask, b.token_type_ids)}},
                  {{"id2label", id2label_json(config)}});
  // And the bare encoder, as AutoModel loads it.
  nn::save_pretrained(rebuilt->bert, dir / "export_base");  // the handle, as the module
  const auto base = rebuilt->bert(b.input_ids, b.attention_mask, b.token_type_ids);
  check_in_python("base", dir / "export_base", dir / "export_base.safetensors", b,
                  {{"last_hidden_state", base.last_hidden_state}, {"pooler_output", base.pooler_output}});
}
