// SPDX-License-Identifier: Apache-2.0
// nn/clip*.hpp: CLIP's configs from config.json (and their refusals), parameter names that are the
// checkpoints' names, bad inputs as errors; and, through the Python environment of
// scripts/python-env (tests/unit/clip_reference.py, which makes a small CLIPModel with seeded random
// weights: no downloads), dtrain computing what transformers computes, image and text features and
// both towers, and dtrain's export loading in transformers with equal features.

#include "../dtrain_catch.hpp"
#include "vit_test_support.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <iostream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <dtrain/checkpointer/model_config.hpp>
#include <dtrain/nn/clip.hpp>
#include <dtrain/weights.hpp>

namespace fs = std::filesystem;
namespace nn = dtrain::nn;
namespace weights = dtrain::weights;
using vit_test::Dir;
using vit_test::error_of;
using vit_test::max_diff;

static_assert(dtrain::checkpointer::DescribedModel<nn::CLIPModel>);
static_assert(dtrain::checkpointer::DescribedModel<nn::CLIPVisionModel>);

namespace {

/// clip_reference.py's sizes, as transformers 5 writes them.
nlohmann::json tiny_clip_json() {
  const nlohmann::json tower = {{"hidden_size", 32}, {"intermediate_size", 37}, {"num_hidden_layers", 2},
                                {"num_attention_heads", 4}, {"projection_dim", 24}, {"hidden_act", "quick_gelu"},
                                {"layer_norm_eps", 1e-5}, {"attention_dropout", 0.0}, {"initializer_range", 0.02},
                                {"initializer_factor", 1.0}};
  auto text = tower, vision = tower;
  text.update({{"model_type", "clip_text_model"}, {"vocab_size", 99}, {"max_position_embeddings", 16},
               {"pad_token_id", 1}, {"bos_token_id", 97}, {"eos_token_id", 98}});
  vision.update({{"model_type", "clip_vision_model"}, {"image_size", 30}, {"patch_size", 6}, {"num_channels", 3}});
  return {{"architectures", {"CLIPModel"}}, {"model_type", "clip"}, {"text_config", text}, {"vision_config", vision},
          {"projection_dim", 24}, {"logit_scale_init_value", 2.6592}, {"initializer_factor", 1.0}, {"dtype", "float32"}};
}

}  // namespace

TEST_CASE("clip_config_reads_hugging_face_config_json", "[nn]") {
  Dir dir("clip_config");
  std::ofstream(dir / "config.json") << tiny_clip_json().dump();
  const auto c = nn::CLIPConfig::from_pretrained(dir.path);
  CHECK(c.projection_dim == 24);
  CHECK(c.text_config.vocab_size == 99);
  CHECK(c.text_config.eos_token_id == 98);
  CHECK(c.vision_config.num_patches() == 25);
  CHECK(c.vision_config.hidden_act == "quick_gelu");
  CHECK(nn::CLIPConfig::from_json(c.to_json()) == c);
  // A tower's config from the whole CLIP's file (its nested object), and from its own.
  CHECK(nn::CLIPVisionConfig::from_pretrained(dir.path) == c.vision_config);
  CHECK(nn::CLIPTextConfig::from_pretrained(dir / "config.json") == c.text_config);
  CHECK(nn::CLIPVisionConfig::from_json(c.vision_config.to_json()) == c.vision_config);
  // Absent keys take transformers' defaults (ViT-B/32's geometry), as the hub's older files rely on.
  const auto defaults = nn::CLIPConfig::from_json({{"model_type", "clip"}});
  CHECK(defaults.vision_config.image_size == 224);
  CHECK(defaults.vision_config.patch_size == 32);
  CHECK(defaults.vision_config.hidden_size == 768);
  CHECK(defaults.text_config.hidden_size == 512);
  CHECK(defaults.text_config.eos_token_id == 49407);
  auto extra = tiny_clip_json();
  extra["vision_config"]["layerdrop"] = 0.5;
  CHECK(nn::CLIPConfig::from_json(extra).to_json()["vision_config"]["layerdrop"] == 0.5);  // kept, written back

  const auto refused = [&](const nlohmann::json& j, const std::string& says) {
    std::ofstream(dir / "bad.json") << j.dump();
    const auto e = error_of([&] { nn::CLIPConfig::from_pretrained(dir / "bad.json"); });
    INFO(e);
    CHECK_THAT(e, Catch::Contains((dir / "bad.json").string()) && Catch::Contains(says));
  };
  auto j = tiny_clip_json();
  j["vision_config"]["hidden_size"] = "32";
  refused(j, "(vision_config): \"hidden_size\" is \"32\", which is not an integer");
  j = tiny_clip_json();
  j["text_config"]["num_attention_heads"] = 5;
  refused(j, "\"hidden_size\" 32 is not a multiple of \"num_attention_heads\" 5");
  j = tiny_clip_json();
  j["text_config"]["hidden_act"] = "mish";
  refused(j, "\"hidden_act\": \"mish\" is not supported");
  j = tiny_clip_json();
  j["vision_config"]["patch_size"] = 64;
  refused(j, "\"image_size\" is 30; it must be at least 64");
  j = tiny_clip_json();
  j["model_type"] = "siglip";
  refused(j, "model_type \"siglip\" is not \"clip\"");
  j = tiny_clip_json();
  j["text_config"] = 3;
  refused(j, "\"text_config\" is 3, which is not an object");
  CHECK_THAT(error_of([&] { nn::CLIPVisionConfig::from_json({{"model_type", "vit"}}, "v"); }),
             Catch::Contains("model_type \"vit\" is not \"clip_vision_model\" or \"clip\""));
  CHECK_THAT(error_of([&] { nn::CLIPConfig::from_pretrained(dir / "nowhere"); }), Catch::Contains("cannot be read"));
}

TEST_CASE("clip_names_are_transformers_names", "[nn]") {
  nn::CLIPModel model(nn::CLIPConfig::from_json(tiny_clip_json()));
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) names.push_back(p.key());
  CHECK(names.size() == 78);  // what transformers' CLIPModel of these sizes saves
  for (const std::string expected :
       {"logit_scale", "visual_projection.weight", "text_projection.weight", "text_model.embeddings.token_embedding.weight",
        "text_model.embeddings.position_embedding.weight", "text_model.encoder.layers.0.self_attn.q_proj.weight",
        "text_model.encoder.layers.1.self_attn.out_proj.bias", "text_model.encoder.layers.0.mlp.fc1.weight",
        "text_model.encoder.layers.1.layer_norm2.bias", "text_model.final_layer_norm.weight",
        "vision_model.embeddings.class_embedding", "vision_model.embeddings.patch_embedding.weight",
        "vision_model.embeddings.position_embedding.weight", "vision_model.pre_layrnorm.weight",
        "vision_model.encoder.layers.1.mlp.fc2.bias", "vision_model.post_layernorm.bias"})
    CHECK(std::find(names.begin(), names.end(), expected) != names.end());
  CHECK(model->named_parameters()["vision_model.embeddings.position_embedding.weight"].sizes() == torch::IntArrayRef{26, 32});
  CHECK(model->named_parameters()["visual_projection.weight"].sizes() == torch::IntArrayRef{24, 32});
  CHECK(model->named_buffers().size() == 0);
  // A tower alone has transformers 5's names: no prefix.
  nn::CLIPVisionModel vision(nn::CLIPVisionConfig::from_json(tiny_clip_json()));
  CHECK(vision->named_parameters().contains("embeddings.class_embedding"));
  CHECK(vision->named_parameters().size() == 39);
}

TEST_CASE("clip_bad_inputs_are_errors", "[nn]") {
  nn::CLIPModel model(nn::CLIPConfig::from_json(tiny_clip_json()));
  model->eval();
  {
  torch::NoGradGuard no_grad;
  CHECK_THAT(error_of([&] { model->get_image_features(torch::zeros({2, 3, 32, 32})); }),
             Catch::Contains("pixel_values must be [batch, 3, 30, 30]") && Catch::Contains("got [2, 3, 32, 32]") &&
                 Catch::Contains("data::CLIPImageProcessor"));
  CHECK_THAT(error_of([&] { model->get_text_features(torch::tensor({{97, 5, 6}}, torch::kLong)); }),
             Catch::Contains("no eos_token_id 98"));
  CHECK_THAT(error_of([&] { model->get_text_features(torch::full({1, 17}, 98, torch::kLong)); }),
             Catch::Contains("1 to 16 (max_position_embeddings) tokens, got [1, 17]"));
  CHECK(model->get_text_features(torch::tensor({{97, 5, 98}}, torch::kLong)).sizes() == torch::IntArrayRef{1, 24});
  Dir dir("clip_bad");
  CHECK_THAT(error_of([&] { nn::load_pretrained(model, dir / "no_such_model"); }), Catch::Contains("no_such_model"));
  }
  // A training step reaches every parameter of both towers.
  model->train();
  const auto out = model(torch::tensor({{97, 5, 98}, {97, 98, 1}}, torch::kLong), torch::randn({2, 3, 30, 30}),
                         torch::tensor({{1, 1, 1}, {1, 1, 0}}, torch::kLong));
  CHECK(out.logits_per_image.sizes() == torch::IntArrayRef{2, 2});
  torch::cross_entropy_loss(out.logits_per_image, torch::arange(2)).backward();
  for (const auto& p : model->named_parameters()) {
    INFO(p.key());
    if (p.key().find("token_embedding") == std::string::npos) CHECK(p.value().grad().defined());
  }
}

TEST_CASE("clip_matches_transformers", "[nn][python]") {
  Dir dir("clip_ref");
  vit_test::make_reference(dir.path, DTRAIN_CLIP_REFERENCE);
  const auto ref = weights::read(dir / "reference.safetensors");
  const auto tensor = [&](const std::string& name) {
    for (const auto& [k, v] : ref)
      if (k == name) return v;
    FAIL("no " << name << " in reference.safetensors");
    return torch::Tensor();
  };
  const auto pixels = tensor("pixel_values"), ids = tensor("input_ids"), mask = tensor("attention_mask");
  nn::CLIPModel model(nn::CLIPConfig::from_pretrained(dir / "clip"));
  CHECK(nn::load_pretrained(model, dir / "clip").complete());  // strict: every name as transformers'
  model->eval();
  torch::NoGradGuard no_grad;
  const auto within = [&](const char* what, const torch::Tensor& ours, const std::string& theirs) {
    const double d = max_diff(ours, tensor(theirs));
    std::cout << "CLIP against transformers: " << what << " within " << d << "\n";
    CHECK(ours.sizes() == tensor(theirs).sizes());
    CHECK(d <= 1e-5);
  };
  within("get_image_features", model->get_image_features(pixels), "image_embeds");
  within("get_text_features", model->get_text_features(ids, mask), "text_embeds");
  within("logits_per_image", model(ids, pixels, mask).logits_per_image, "logits_per_image");
  const auto v = model->vision_model(pixels);
  within("vision last_hidden_state", v.last_hidden_state, "vision_last_hidden_state");
  within("vision pooler_output", v.pooler_output, "vision_pooler_output");
  const auto t = model->text_model(ids, mask);
  within("text last_hidden_state", t.last_hidden_state, "text_last_hidden_state");
  within("text pooler_output", t.pooler_output, "text_pooler_output");

  // The towers alone: their own files, and a whole CLIP's (the rest passed over, reported).
  nn::CLIPVisionModel vision(nn::CLIPVisionConfig::from_pretrained(dir / "vision"));
  CHECK(nn::load_pretrained(vision, dir / "vision").complete());
  vision->eval();
  within("CLIPVisionModel pooler_output", vision(pixels).pooler_output, "vision_pooler_output");
  const auto from_whole = nn::load_pretrained(vision, dir / "clip");
  CHECK(from_whole.missing.empty());
  CHECK(from_whole.unexpected.size() == 39);  // text_model.* (36), text_projection, visual_projection, logit_scale
  CHECK(std::count(from_whole.unexpected.begin(), from_whole.unexpected.end(), "logit_scale") == 1);
  nn::CLIPTextModel text(nn::CLIPTextConfig::from_pretrained(dir / "text"));
  CHECK(nn::load_pretrained(text, dir / "text").complete());
  CHECK(nn::load_pretrained(text, dir / "clip").missing.empty());
  text->eval();
  within("CLIPTextModel pooler_output", text(ids, mask).pooler_output, "text_pooler_output");
  // A tower's file is not a whole CLIP: an error that says what the file is and where it loads.
  CHECK_THAT(error_of([&] { nn::load_pretrained(model, dir / "vision"); }),
             Catch::Contains("holds a CLIP vision tower alone") && Catch::Contains("load it into nn::CLIPVisionModel"));
  CHECK(nn::load_pretrained(model->vision_model, dir / "vision").complete());  // where it belongs
}

TEST_CASE("clip_export_loads_in_transformers", "[nn][python]") {
  Dir dir("clip_export");
  vit_test::make_reference(dir.path, DTRAIN_CLIP_REFERENCE);
  nn::CLIPModel model(nn::CLIPConfig::from_pretrained(dir / "clip"));
  nn::load_pretrained(model, dir / "clip");
  // A step of contrastive training, so that the export differs from what transformers saved.
  const auto ref = weights::read(dir / "reference.safetensors");
  std::map<std::string, torch::Tensor> t(ref.begin(), ref.end());
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  const auto out = model(t["input_ids"], t["pixel_values"], t["attention_mask"]);
  torch::cross_entropy_loss(out.logits_per_image, torch::arange(3)).backward();
  opt.step();
  // Out through a dtrain checkpoint's way back: built from its description, weights copied.
  auto rebuilt = nn::CLIPModel(nlohmann::json::parse(dtrain::checkpointer::describe_model(model))["config"].get<nn::CLIPConfig>());
  {
    torch::NoGradGuard no_grad;
    auto params = rebuilt->named_parameters();
    for (const auto& p : model->named_parameters()) params[p.key()].copy_(p.value());
  }
  nn::save_pretrained(rebuilt, dir / "export");
  CHECK(nn::CLIPConfig::from_pretrained(dir / "export") == model->config);
  rebuilt->eval();
  torch::NoGradGuard no_grad;
  const auto image = rebuilt->get_image_features(t["pixel_values"]);
  CHECK(max_diff(image, t["image_embeds"]) > 1e-4);  // trained: not what transformers saved
  weights::save_safetensors(dir / "export.safetensors",
                            {{"pixel_values", t["pixel_values"]}, {"input_ids", t["input_ids"]},
                             {"attention_mask", t["attention_mask"]}, {"image_embeds", image},
                             {"text_embeds", rebuilt->get_text_features(t["input_ids"], t["attention_mask"])}});
  const auto output = vit_test::check_in_python(
      "check " + (dir / "export").string() + " " + (dir / "export.safetensors").string(), DTRAIN_CLIP_REFERENCE);
  CHECK_THAT(output, Catch::Contains("5 checks, 0 failed"));
}
