// SPDX-License-Identifier: Apache-2.0
// nn/vit*.hpp: ViTConfig from config.json (and its refusals), parameter names that are the
// checkpoints' names, strict loads that fail naming a missing key; and, through the Python
// environment of scripts/python-env (tests/unit/vit_reference.py, which makes a small
// ViTForImageClassification with seeded random weights: no downloads), dtrain computing what
// transformers computes and dtrain's export loading in transformers with equal logits.
// vit_processor_test.cpp (built where dtrain::images is) holds the image processor's tests.

#include "../dtrain_catch.hpp"
#include "vit_test_support.hpp"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <dtrain/checkpointer/model_config.hpp>
#include <dtrain/nn/vit.hpp>
#include <dtrain/weights.hpp>

namespace fs = std::filesystem;
namespace nn = dtrain::nn;
namespace weights = dtrain::weights;
using vit_test::Dir;
using vit_test::error_of;
using vit_test::max_diff;

static_assert(dtrain::checkpointer::DescribedModel<nn::ViTModel>);
static_assert(dtrain::checkpointer::DescribedModel<nn::ViTForImageClassification>);

namespace {

/// The reference model's sizes: image 32, patch 8, hidden 64, 2 layers, 4 heads, 3 labels.
nlohmann::json tiny_json() {
  return {{"model_type", "vit"}, {"hidden_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"intermediate_size", 128}, {"image_size", 32}, {"patch_size", 8}, {"num_channels", 3},
          {"qkv_bias", true}, {"hidden_act", "gelu"}, {"layer_norm_eps", 1e-12}, {"encoder_stride", 16},
          {"id2label", {{"0", "cat"}, {"1", "dog"}, {"2", "bird"}}}};
}

using State = std::vector<std::pair<std::string, torch::Tensor>>;

}  // namespace

TEST_CASE("vit_config_reads_hugging_face_config_json", "[nn]") {
  Dir dir("vit_config");
  const auto c = nn::ViTConfig::from_json(tiny_json(), "tiny");
  CHECK(c.hidden_size == 64);
  CHECK(c.image_height == 32);
  CHECK(c.patch_width == 8);
  CHECK(c.num_patches() == 16);
  CHECK(c.id2label == std::vector<std::string>{"cat", "dog", "bird"});
  CHECK(c.extra["encoder_stride"] == 16);  // kept, and written back
  CHECK(nn::ViTConfig::from_json(c.to_json()) == c);
  auto rect = tiny_json();
  rect["image_size"] = {32, 48};
  rect["patch_size"] = {8, 16};
  const auto r = nn::ViTConfig::from_json(rect);
  CHECK(r.num_patches() == 12);
  CHECK(r.to_json()["image_size"] == nlohmann::json{32, 48});
  CHECK(nn::ViTConfig::from_json(r.to_json()) == r);

  // A missing size and a value of the wrong type: errors naming the file and the key.
  std::ofstream(dir / "config.json") << [] {
    auto j = tiny_json();
    j.erase("patch_size");
    return j;
  }().dump();
  const auto missing = error_of([&] { nn::ViTConfig::from_pretrained(dir.path); });
  CHECK_THAT(missing, Catch::Contains((dir / "config.json").string()) && Catch::Contains("\"patch_size\" is missing"));
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"hidden_size", "64"}, {"qkv_bias", 1}, {"layer_norm_eps", "tiny"}, {"image_size", {32, 32, 3}}, {"hidden_act", 3}}) {
    auto j = tiny_json();
    j[key] = value;
    std::ofstream(dir / "config.json") << j.dump();
    const auto e = error_of([&] { nn::ViTConfig::from_pretrained(dir / "config.json"); });
    INFO(e);
    CHECK_THAT(e, Catch::Contains((dir / "config.json").string()) && Catch::Contains("\"" + key + "\" is " + value.dump()));
  }
  const auto refused = [&](const std::string& key, const nlohmann::json& value, const std::string& says) {
    auto j = tiny_json();
    j[key] = value;
    const auto e = error_of([&] { nn::ViTConfig::from_json(j, "cfg"); });
    INFO(e);
    CHECK_THAT(e, Catch::Contains(says));
  };
  refused("model_type", "deit", "model_type \"deit\" is not supported");
  refused("num_attention_heads", 5, "not a multiple of \"num_attention_heads\" 5");
  refused("hidden_act", "swish", "\"hidden_act\": \"swish\" is not supported");
  refused("patch_size", 64, "larger than \"image_size\"");
  refused("num_channels", 0, "\"num_channels\" is 0; it must be positive");
  refused("label2id", {{"cat", 1}}, "\"label2id\"");
  CHECK_THAT(error_of([&] { nn::ViTConfig::from_pretrained(dir / "nowhere"); }), Catch::Contains("cannot be read"));
}

TEST_CASE("vit_names_are_transformers_names", "[nn]") {
  nn::ViTForImageClassification model(nn::ViTConfig::from_json(tiny_json()));
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) names.push_back(p.key());
  CHECK(names.size() == 4 + 2 * 16 + 2 + 2);
  for (const std::string expected :
       {"vit.embeddings.cls_token", "vit.embeddings.position_embeddings", "vit.embeddings.patch_embeddings.projection.weight",
        "vit.embeddings.patch_embeddings.projection.bias", "vit.encoder.layer.0.attention.attention.query.weight",
        "vit.encoder.layer.0.attention.attention.key.bias", "vit.encoder.layer.1.attention.attention.value.weight",
        "vit.encoder.layer.1.attention.output.dense.weight", "vit.encoder.layer.0.intermediate.dense.weight",
        "vit.encoder.layer.0.output.dense.bias", "vit.encoder.layer.0.layernorm_before.weight",
        "vit.encoder.layer.1.layernorm_after.bias", "vit.layernorm.weight", "vit.layernorm.bias", "classifier.weight",
        "classifier.bias"})
    CHECK(std::find(names.begin(), names.end(), expected) != names.end());
  CHECK(model->named_parameters()["vit.embeddings.position_embeddings"].sizes() == torch::IntArrayRef{1, 17, 64});
  CHECK(model->named_parameters()["classifier.weight"].sizes() == torch::IntArrayRef{3, 64});
  CHECK(model->named_buffers().size() == 0);
  auto j = tiny_json();
  j["qkv_bias"] = false;
  nn::ViTModel no_bias(nn::ViTConfig::from_json(j));
  CHECK(no_bias->named_parameters().size() == 4 + 2 * 13 + 2);
  CHECK(no_bias->named_parameters().find("encoder.layer.0.attention.attention.query.bias") == nullptr);
  // The shape the config asks for, or an error saying which.
  torch::NoGradGuard no_grad;
  model->eval();
  CHECK(model(torch::randn({2, 3, 32, 32})).sizes() == torch::IntArrayRef{2, 3});
  CHECK_THAT(error_of([&] { model(torch::randn({2, 3, 28, 28})); }), Catch::Contains("[batch, 3, 32, 32]") && Catch::Contains("got [2, 3, 28, 28]"));
}

TEST_CASE("vit_strict_load_fails_naming_a_missing_key", "[nn]") {
  Dir dir("vit_load");
  const auto config = nn::ViTConfig::from_json(tiny_json());
  torch::manual_seed(1);
  nn::ViTForImageClassification source(config);
  nn::save_pretrained(source, dir / "cls");  // the handle, as the module
  const auto written = nlohmann::json::parse(std::ifstream(dir / "cls" / "config.json"));
  CHECK(written["architectures"] == nlohmann::json{"ViTForImageClassification"});
  CHECK(nn::ViTConfig::from_pretrained(dir / "cls") == config);

  nn::ViTForImageClassification same(config);
  const auto report = nn::load_pretrained(same, dir / "cls");
  CHECK(report.complete());
  CHECK(report.loaded == 40);
  CHECK(torch::equal(same->vit->layernorm->weight, source->vit->layernorm->weight));

  // One tensor left out: a strict load names it, and so does load_pretrained.
  State state;
  for (const auto& p : source->named_parameters())
    if (p.key() != "vit.encoder.layer.1.output.dense.weight") state.emplace_back(p.key(), p.value());
  weights::save_safetensors(dir / "missing.safetensors", state);
  nn::ViTForImageClassification target(config);
  CHECK_THAT(error_of([&] { weights::load(*target, dir / "missing.safetensors"); }),
             Catch::Contains("vit.encoder.layer.1.output.dense.weight"));
  CHECK_THAT(error_of([&] { nn::load_pretrained(*target, dir / "missing.safetensors"); }),
             Catch::Contains("vit.encoder.layer.1.output.dense.weight"));
  // A model with one layer fewer: the file's layer 1 is unexpected.
  auto shallow_json = tiny_json();
  shallow_json["num_hidden_layers"] = 1;
  nn::ViTForImageClassification shallow(nn::ViTConfig::from_json(shallow_json));
  CHECK_THAT(error_of([&] { nn::load_pretrained(*shallow, dir / "cls"); }), Catch::Contains("vit.encoder.layer.1."));

  // A classification file into a bare ViTModel: the head (and a pooler) reported, not an error.
  nn::ViTModel base(config);
  auto r = nn::load_pretrained(base, dir / "cls");
  CHECK(r.missing.empty());
  CHECK(vit_test::sorted(r.unexpected) == std::vector<std::string>{"classifier.bias", "classifier.weight"});
  CHECK(torch::equal(base->embeddings->cls_token, source->vit->embeddings->cls_token));
  // A bare ViTModel's file with a pooler into a classifier: the classifier new, the pooler passed over.
  State bare;
  for (const auto& p : source->vit->named_parameters()) bare.emplace_back(p.key(), p.value());
  bare.emplace_back("pooler.dense.weight", torch::zeros({64, 64}));
  bare.emplace_back("pooler.dense.bias", torch::zeros({64}));
  weights::save_safetensors(dir / "bare.safetensors", bare);
  nn::ViTForImageClassification head(config);
  r = nn::load_pretrained(*head, dir / "bare.safetensors");
  CHECK(vit_test::sorted(r.missing) == std::vector<std::string>{"classifier.bias", "classifier.weight"});
  CHECK(vit_test::sorted(r.unexpected) == std::vector<std::string>{"pooler.dense.bias", "pooler.dense.weight"});
  CHECK(torch::equal(head->vit->named_parameters()["encoder.layer.1.output.dense.weight"],
                     source->vit->named_parameters()["encoder.layer.1.output.dense.weight"]));
}

TEST_CASE("vit_matches_transformers", "[nn][python]") {
  Dir dir("vit_ref");
  vit_test::make_reference(dir.path);
  const auto ref = weights::read(dir / "reference.safetensors");
  const auto tensor = [&](const std::string& name) {
    for (const auto& [k, v] : ref)
      if (k == name) return v;
    FAIL("no " << name << " in reference.safetensors");
    return torch::Tensor();
  };
  const auto config = nn::ViTConfig::from_pretrained(dir / "cls");
  CHECK(config.id2label == std::vector<std::string>{"cat", "dog", "bird"});
  nn::ViTForImageClassification model(config);
  CHECK(nn::load_pretrained(model, dir / "cls").complete());  // strict: every name as transformers'
  model->eval();
  torch::NoGradGuard no_grad;
  const auto pixels = tensor("pixel_values");
  const double logits = max_diff(model(pixels), tensor("logits"));
  const double hidden = max_diff(model->vit(pixels), tensor("last_hidden_state"));
  std::cout << "ViTForImageClassification against transformers: logits within " << logits
            << ", last_hidden_state within " << hidden << "\n";
  CHECK(logits <= 1e-5);
  CHECK(hidden <= 1e-5);
  CHECK(torch::equal(model(pixels).argmax(-1), tensor("logits").argmax(-1)));

  // The bare ViTModel transformers saved with its pooler: the pooler passed over, reported.
  nn::ViTModel base(nn::ViTConfig::from_pretrained(dir / "base"));
  const auto report = nn::load_pretrained(base, dir / "base");
  CHECK(report.missing.empty());
  CHECK(vit_test::sorted(report.unexpected) == std::vector<std::string>{"pooler.dense.bias", "pooler.dense.weight"});
  base->eval();
  const double base_hidden = max_diff(base(pixels), tensor("base_last_hidden_state"));
  std::cout << "ViTModel against transformers: last_hidden_state within " << base_hidden << "\n";
  CHECK(base_hidden <= 1e-5);
}

TEST_CASE("vit_export_loads_in_transformers", "[nn][python]") {
  Dir dir("vit_export");
  vit_test::make_reference(dir.path);
  auto config = nn::ViTConfig::from_pretrained(dir / "cls");
  config.id2label = {"ant", "bee", "cow", "doe"};  // a new head, for the task's 4 labels
  nn::ViTForImageClassification model(config);
  // The whole file does not fit (its head has 3 labels): the backbone's weights load, the head is new.
  CHECK_THAT(error_of([&] { nn::load_pretrained(*model, dir / "cls", {.strict = false}); }),
             Catch::Contains("\"classifier.weight\" has shape [3, 64]"));
  const auto report = nn::load_pretrained(*model->vit, dir / "cls");
  CHECK(report.loaded == 38);
  CHECK(vit_test::sorted(report.unexpected) == std::vector<std::string>{"classifier.bias", "classifier.weight"});
  // Two steps of fine-tuning (dropout on), so the export differs from what transformers saved.
  torch::manual_seed(3);
  const auto pixels = torch::randn({4, 3, 32, 32});
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  model->train();
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    torch::cross_entropy_loss(model(pixels), torch::tensor({0, 1, 2, 3}, torch::kLong)).backward();
    opt.step();
  }
  // Out through a dtrain checkpoint's way back: built from its description, weights copied.
  auto rebuilt = nn::ViTForImageClassification(
      nlohmann::json::parse(dtrain::checkpointer::describe_model(model))["config"].get<nn::ViTConfig>());
  {
    torch::NoGradGuard no_grad;
    auto params = rebuilt->named_parameters();
    for (const auto& p : model->named_parameters()) params[p.key()].copy_(p.value());
  }
  const auto out = dir / "export";
  nn::save_pretrained(*rebuilt, out, {.files = {dir / "cls" / "preprocessor_config.json"}});
  CHECK(fs::exists(out / "preprocessor_config.json"));
  CHECK(nn::ViTConfig::from_pretrained(out) == config);
  rebuilt->eval();
  torch::NoGradGuard no_grad;
  weights::save_safetensors(dir / "export.safetensors", {{"pixel_values", pixels}, {"logits", rebuilt(pixels)}},
                            {{"id2label", config.to_json()["id2label"].dump()}});
  vit_test::check_in_python("check " + out.string() + " " + (dir / "export.safetensors").string());
}
