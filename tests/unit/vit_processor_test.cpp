// SPDX-License-Identifier: Apache-2.0
// data/vit_image_processor.hpp: ViTImageProcessor from preprocessor_config.json (and its
// refusals), and, through tests/unit/vit_reference.py, pixel_values equal to transformers'
// ViTImageProcessor (PIL backend) on real image files: Fashion-MNIST's PNGs of an image folder
// made by scripts/make-image-folder (grey 28 x 28) and colour PNGs (RGB, RGBA) of other sizes,
// each grown (32 x 32) and shrunk (20 x 24). Built where dtrain::images (OpenCV) is.

#include "../dtrain_catch.hpp"
#include "checkpoint_support.hpp"
#include "support.hpp"
#include "vit_test_support.hpp"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <opencv2/imgproc.hpp>
#include <torch/torch.h>

#include <dtrain/data/image_folder.hpp>
#include <dtrain/data/vit_image_processor.hpp>
#include <dtrain/evaluation/image_inputs.hpp>
#include <dtrain/nn/vit.hpp>
#include <dtrain/weights/safetensors.hpp>

namespace fs = std::filesystem;
namespace data = dtrain::data;
using vit_test::Dir;
using vit_test::error_of;
using dtrain_test::MessageContains;

TEST_CASE("vit_image_processor_reads_preprocessor_config_json", "[nn]") {
  Dir dir("vit_processor");
  const auto p = data::ViTImageProcessor::from_json({{"do_resize", true}, {"size", 224}, {"resample", 2},
                                                     {"image_mean", 0.5}, {"image_std", {0.25, 0.5, 1.0}},
                                                     {"image_processor_type", "ViTImageProcessor"}});
  CHECK(p.height == 224);
  CHECK(p.width == 224);
  CHECK(p.image_mean == std::vector<float>{0.5f});
  CHECK(p.image_std == std::vector<float>{0.25f, 0.5f, 1.0f});
  CHECK(p.channels == 3);
  CHECK(data::ViTImageProcessor::from_json(p.to_json()) == p);
  const auto refused = [&](const nlohmann::json& j, const std::string& says) {
    std::ofstream(dir / "preprocessor_config.json") << j.dump();
    const auto e = error_of([&] { data::ViTImageProcessor::from_pretrained(dir.path); });
    INFO(e);
    CHECK_THAT(e, Catch::Contains((dir / "preprocessor_config.json").string()) && Catch::Contains(says));
  };
  refused({{"resample", 3}}, "\"resample\" is 3; only 2");
  refused({{"do_center_crop", true}}, "\"do_center_crop\" is true");
  refused({{"size", {{"shortest_edge", 224}}}}, "\"size\" is {\"shortest_edge\":224}");
  refused({{"image_mean", {0.5, 0.5}}}, "\"image_mean\" is [0.5,0.5]");
  refused({{"image_std", "0.5"}}, "\"image_std\" is \"0.5\"");
  refused({{"do_resize", 1}}, "\"do_resize\" is 1");
  CHECK_THAT(error_of([&] { data::ViTImageProcessor::from_pretrained(dir / "nowhere"); }), Catch::Contains("cannot be read"));
}

TEST_CASE("vit_image_processor_matches_transformers", "[nn][python]") {
  Dir dir("vit_pixels");
  vit_test::make_reference(dir.path);
  const std::string cmd = "/usr/bin/python3 " DTRAIN_MAKE_IMAGE_FOLDER " " + (dir / "folder").string() + " --per-class 2 > /dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const data::ImageFolder folder(dir / "folder" / "train", {.channels = 3});
  std::vector<std::string> files;
  for (std::int64_t i = 0; i < folder.size(); ++i) files.push_back(folder.path(i));
  for (const auto* name : {"rgb.png", "rgba.png", "small.png"}) files.push_back((dir / "images" / name).string());
  REQUIRE(files.size() == 23);

  for (const auto* config : {"cls", "shrink"}) {
    INFO(config);
    const auto processor = data::ViTImageProcessor::from_pretrained(dir / config);
    const auto pixels = processor.load(files);
    CHECK(pixels.sizes() == (std::string(config) == "cls" ? torch::IntArrayRef{23, 3, 32, 32} : torch::IntArrayRef{23, 3, 20, 24}));
    // The same through a pipeline's stages: the resize stage, then the collate stage.
    std::vector<data::Image> images;
    for (const auto& f : files) images.push_back(processor(data::Image{data::decode_image(f, 3), 7, f}));
    const auto fields = processor.collate()(images);
    CHECK(torch::equal(fields.at("image"), pixels));
    CHECK(fields.at("label").eq(7).all().item<bool>());
    const auto out = dir / (std::string(config) + "_pixels.safetensors");
    dtrain::weights::save_safetensors(out, {{"pixel_values", pixels}}, {{"files", nlohmann::json(files).dump()}});
    vit_test::check_in_python("process " + (dir / config).string() + " " + out.string());

    // What OpenCV's INTER_LINEAR (no antialiasing) would have given instead of PIL's filter, for
    // the images grown on both axes and for those shrunk on at least one.
    double grown = 0, shrunk = 0;
    for (std::size_t i = 0; i < files.size(); ++i) {
      const auto decoded = data::decode_image(files[i], 3);
      cv::Mat resized;
      cv::resize(decoded, resized, cv::Size(processor.width, processor.height), 0, 0, cv::INTER_LINEAR);
      const auto theirs = processor.pixel_values({data::Image{resized, -1, files[i]}});
      const double d = (theirs[0] - pixels[static_cast<std::int64_t>(i)]).abs().max().item<double>();
      double& worst = decoded.rows <= processor.height && decoded.cols <= processor.width ? grown : shrunk;
      worst = std::max(worst, d);
    }
    std::cout << config << ": OpenCV's INTER_LINEAR in place of PIL's bilinear filter would differ by up to " << grown
              << " (images grown) and " << shrunk << " (images shrunk) in the normalised floats\n";
  }
}

// The largest differences allowed, in grey levels (measured: docs/models.md, "ViT").
const std::string kPilLevels = "2", kAutoLevels = "2";

TEST_CASE("vit_image_processor_against_what_transformers_5_users_get", "[nn][python]") {
  // Portrait, RGBA, grey, palette and CMYK files, a strip and a large one, against transformers'
  // PIL backend (ViTImageProcessorPil, the venv's Pillow) and against AutoImageProcessor's default
  // (torchvision's resize), in grey levels; docs/models.md records the figures.
  Dir dir("vit_kinds");
  vit_test::make_reference(dir.path);
  std::vector<std::string> files;
  for (const auto* name : {"portrait.png", "portrait_rgba.png", "grey.png", "palette.png", "cmyk.jpg", "strip.png",
                           "large.png", "rgb.png", "rgba.png", "small.png"})
    files.push_back((dir / "images" / name).string());
  const auto processor = data::ViTImageProcessor::from_pretrained(dir / "cls");
  const auto out = dir / "kinds_pixels.safetensors";
  dtrain::weights::save_safetensors(out, {{"pixel_values", processor.load(files)}}, {{"files", nlohmann::json(files).dump()}});
  vit_test::check_in_python("compare " + (dir / "cls").string() + " " + out.string() + " " + kPilLevels + " " + kAutoLevels);
}

TEST_CASE("vit_checkpoint_alone_serves_image_files_through_its_processor", "[nn]") {
  Dir dir("vit_predictor");
  const std::string cmd = "/usr/bin/python3 " DTRAIN_MAKE_IMAGE_FOLDER " " + (dir / "folder").string() + " --per-class 1 > /dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const data::ImageFolder folder(dir / "folder" / "test", {.channels = 3});
  std::vector<std::string> files;
  for (std::int64_t i = 0; i < folder.size(); ++i) files.push_back(folder.path(i));

  // A 32-pixel processor (grey 28 x 28 files grown with PIL's filter) and a tiny ViT with a head
  // for the folder's classes, saved as finetune_vit saves them: the processor and class names as
  // checkpoint objects beside the model and its config.
  const auto processor = data::ViTImageProcessor::from_json(
      {{"do_resize", true}, {"size", {{"height", 32}, {"width", 32}}}, {"image_mean", {0.5, 0.4, 0.3}},
       {"image_std", {0.2, 0.25, 0.3}}, {"rescale_factor", 1.0 / 255}});
  auto config = dtrain::nn::ViTConfig::from_json({{"model_type", "vit"}, {"hidden_size", 32}, {"num_hidden_layers", 1},
                                                  {"num_attention_heads", 2}, {"intermediate_size", 64},
                                                  {"image_size", 32}, {"patch_size", 8}, {"num_channels", 3}});
  config.id2label = folder.classes();
  torch::manual_seed(5);
  dtrain::nn::ViTForImageClassification model(config);
  const auto labels = data::LabelEncoder::fit(folder.classes());
  const auto path = dtrain_test::save_checkpoint(dir / "run", *model, [&](auto& snapshot) {
    snapshot.model_config = dtrain::checkpointer::describe_model(model);
    snapshot.with_object("transforms", processor).with_object("labels", labels);
  });

  // The checkpoint alone, no type named: ImageInputs reads which preprocessing was saved.
  auto predictor =
      dtrain::evaluation::Predictor<dtrain::nn::ViTForImageClassification>::from_checkpoint(path, dtrain::evaluation::ImageInputs{});
  const auto p = predictor.predict(files);
  model->eval();
  torch::NoGradGuard no_grad;
  const auto logits = model->forward(processor.load(files));
  CHECK(torch::equal(p.logits(), logits));
  CHECK(torch::allclose(p.probabilities(), torch::softmax(logits, 1), 1e-6, 1e-7));
  CHECK(p[0].logits.size() == folder.classes().size());
  CHECK(p.class_names() == folder.classes());
  CHECK(p[0].label == folder.classes()[static_cast<std::size_t>(p.classes()[0].item<std::int64_t>())]);

  // The processor round-trips as a checkpoint object; another type saved under the name is named.
  const auto ck = dtrain::checkpointer::Checkpoint::open(path);
  REQUIRE(ck);
  data::ViTImageProcessor restored;
  ck->load_object("transforms", restored);
  CHECK(restored.to_json() == processor.to_json());
  CHECK(torch::equal(restored.load(files), processor.load(files)));
  using ViTPredictor = dtrain::evaluation::Predictor<dtrain::nn::ViTForImageClassification>;
  const auto wrong = error_of([&] { ViTPredictor::from_checkpoint<data::ImageTransforms>(path, dtrain::evaluation::ImageInputs{}); });
  INFO(wrong);
  CHECK_THAT(wrong, Catch::Contains("objects/transforms.pt") && Catch::Contains("holds a ViTImageProcessor, not a ImageTransforms"));
  // An object ImageInputs does not know, and one that is not there: ConfigErrors naming it.
  const auto other = dtrain_test::save_checkpoint(dir / "other", *model, [&](auto& snapshot) {
    snapshot.model_config = dtrain::checkpointer::describe_model(model);
    snapshot.with_object("transforms", labels).with_object("labels", labels);
  });
  CHECK_THROWS_MATCHES(ViTPredictor::from_checkpoint(other, dtrain::evaluation::ImageInputs{}), dtrain::ConfigError,
                       MessageContains({"\"transforms\" is a LabelEncoder", "does not restore by itself"}));
  dtrain::evaluation::ImageInputs elsewhere;
  elsewhere.transforms = "processor";
  CHECK_THROWS_MATCHES(ViTPredictor::from_checkpoint(path, elsewhere), dtrain::ConfigError,
                       MessageContains({"no object \"processor\"", "\"labels\", \"transforms\""}));
}
