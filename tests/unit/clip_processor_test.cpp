// SPDX-License-Identifier: Apache-2.0
// data/clip_image_processor.hpp: CLIPImageProcessor from preprocessor_config.json (and its
// refusals), and, through tests/unit/clip_reference.py, pixel_values equal to transformers'
// CLIPImageProcessorPil on portrait, landscape, tiny and huge files of every kind (RGB, RGBA, grey,
// palette, CMYK), shrunk and grown, and within a few grey levels of AutoImageProcessor's default
// (torchvision); the processed images through the small CLIP's vision tower. Built where
// dtrain::images (OpenCV) is.

#include "../dtrain_catch.hpp"
#include "vit_test_support.hpp"

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <dtrain/data/clip_image_processor.hpp>
#include <dtrain/nn/clip.hpp>
#include <dtrain/weights/safetensors.hpp>

namespace data = dtrain::data;
using vit_test::Dir;
using vit_test::error_of;

namespace {

const std::vector<std::string> kKinds = {"portrait.png", "portrait_rgba.png", "grey.png", "palette.png", "cmyk.jpg",
                                         "strip.png",    "large.png",         "huge.png", "rgb.png",     "rgba.png",
                                         "small.png"};

}  // namespace

TEST_CASE("clip_image_processor_reads_preprocessor_config_json", "[nn]") {
  Dir dir("clip_processor");
  const data::CLIPImageProcessor defaults;
  CHECK(defaults.shortest_edge == 224);
  CHECK(defaults.crop_height == 224);
  CHECK(defaults.resample == data::detail::Resample::bicubic);
  CHECK(defaults.image_mean[0] == 0.48145466f);
  const auto p = data::CLIPImageProcessor::from_json({{"size", {{"shortest_edge", 256}}}, {"crop_size", 240},
                                                      {"resample", 2}, {"image_std", 0.5}, {"processor_class", "CLIPProcessor"}});
  CHECK(p.shortest_edge == 256);
  CHECK(p.crop_height == 240);
  CHECK(p.crop_width == 240);
  CHECK(p.resample == data::detail::Resample::bilinear);
  CHECK(p.image_std == std::vector<float>{0.5f});
  CHECK(p.extra["processor_class"] == "CLIPProcessor");  // kept, and written back
  CHECK(data::CLIPImageProcessor::from_json(p.to_json()) == p);
  {  // As a checkpoint object (what evaluation::ImageInputs restores for a Predictor).
    torch::serialize::OutputArchive out;
    p.save(out);
    std::stringstream bytes;
    out.save_to(bytes);
    torch::serialize::InputArchive in;
    in.load_from(bytes);
    data::CLIPImageProcessor back;
    back.load(in);
    CHECK(back == p);
  }
  const auto exact = data::CLIPImageProcessor::from_json({{"size", {{"height", 20}, {"width", 30}}}, {"do_center_crop", false}});
  CHECK(exact.output_size() == std::pair{20, 30});
  CHECK(data::CLIPImageProcessor::from_json(exact.to_json()) == exact);
  const auto refused = [&](const nlohmann::json& j, const std::string& says) {
    std::ofstream(dir / "preprocessor_config.json") << j.dump();
    const auto e = error_of([&] { data::CLIPImageProcessor::from_pretrained(dir.path); });
    INFO(e);
    CHECK_THAT(e, Catch::Contains((dir / "preprocessor_config.json").string()) && Catch::Contains(says));
  };
  refused({{"resample", 1}}, "\"resample\" is 1; only 3");
  refused({{"size", {{"longest_edge", 224}}}}, "\"size\" is {\"longest_edge\":224}");
  refused({{"size", {{"shortest_edge", 0}}}}, "sizes must be positive");
  refused({{"crop_size", "224"}}, "\"crop_size\" is \"224\"");
  refused({{"image_mean", {0.5, 0.5}}}, "\"image_mean\" is [0.5,0.5]");
  refused({{"do_center_crop", "yes"}}, "\"do_center_crop\" is \"yes\"");
  CHECK_THAT(error_of([&] { data::CLIPImageProcessor::from_pretrained(dir / "nowhere"); }), Catch::Contains("cannot be read"));
  CHECK_THAT(error_of([&] { p.load({(dir / "missing.png").string()}); }), Catch::Contains("missing.png: cannot be read"));
}

TEST_CASE("clip_image_processor_crops_at_the_centre", "[nn]") {
  // 5 x 8 of distinct values: resize off, a 3 x 4 crop starts at row (5 - 3) // 2, column (8 - 4) // 2.
  data::CLIPImageProcessor p;
  p.do_resize = false;
  p.crop_height = 3;
  p.crop_width = 4;
  cv::Mat m(5, 8, CV_8UC3);
  for (int y = 0; y < 5; ++y)
    for (int x = 0; x < 8; ++x) m.at<cv::Vec3b>(y, x) = cv::Vec3b(static_cast<uchar>(10 * y + x), 0, 0);
  const auto cropped = p(data::Image{m, 0, "m"}).pixels;
  CHECK(cropped.rows == 3);
  CHECK(cropped.cols == 4);
  CHECK(cropped.at<cv::Vec3b>(0, 0)[0] == 12);
  // Larger than the image: zeros around it, as numpy's center_crop pads.
  p.crop_height = 8;
  p.crop_width = 10;
  const auto padded = p(data::Image{m, 0, "m"}).pixels;
  CHECK(padded.rows == 8);
  CHECK(padded.cols == 10);
  CHECK(padded.at<cv::Vec3b>(0, 0)[0] == 0);
  // The image sits at row ceil(3 / 2) = 2, column ceil(2 / 2) = 1; the crop is the whole canvas.
  CHECK(padded.at<cv::Vec3b>(3, 2)[0] == 11);
  CHECK(padded.at<cv::Vec3b>(6, 8)[0] == 47);
  CHECK(padded.at<cv::Vec3b>(7, 9)[0] == 0);
}

// The largest differences allowed, in grey levels (measured: docs/models.md, "CLIP"): 0 against the
// PIL backend but for the CMYK JPEG, which OpenCV and PIL decode 2 levels apart (as for ViT).
const std::string kClipPilLevels = "2", kClipAutoLevels = "2";

TEST_CASE("clip_image_processor_matches_transformers", "[nn][python]") {
  Dir dir("clip_pixels");
  vit_test::make_reference(dir.path, DTRAIN_CLIP_REFERENCE);
  std::vector<std::string> files;
  for (const auto& name : kKinds) files.push_back((dir / "images" / name).string());
  for (const auto* config : {"processor", "grow"}) {
    INFO(config);
    const auto processor = data::CLIPImageProcessor::from_pretrained(dir / config);
    const auto pixels = processor.load(files);
    CHECK(pixels.sizes() == (std::string(config) == "processor" ? torch::IntArrayRef{11, 3, 30, 30} : torch::IntArrayRef{11, 3, 56, 48}));
    // The same through a pipeline's stages: the processor's map stage, then its collate stage.
    std::vector<data::Image> images;
    for (const auto& f : files) images.push_back(processor(data::Image{data::decode_image(f, 3), 4, f}));
    CHECK(torch::equal(processor.collate()(images).at("image"), pixels));
    const auto out = dir / (std::string(config) + "_pixels.safetensors");
    dtrain::weights::save_safetensors(out, {{"pixel_values", pixels}}, {{"files", nlohmann::json(files).dump()}});
    vit_test::check_in_python(
        "compare " + (dir / config).string() + " " + out.string() + " " + kClipPilLevels + " " + kClipAutoLevels,
        DTRAIN_CLIP_REFERENCE);
  }
  // The processed files through the small CLIP's vision tower: the input it was made for.
  dtrain::nn::CLIPModel clip(dtrain::nn::CLIPConfig::from_pretrained(dir / "clip"));
  dtrain::nn::load_pretrained(clip, dir / "clip");
  clip->eval();
  torch::NoGradGuard no_grad;
  const auto features = clip->get_image_features(data::CLIPImageProcessor::from_pretrained(dir / "processor").load(files));
  CHECK(features.sizes() == torch::IntArrayRef{11, 24});
  CHECK(features.isfinite().all().item<bool>());
}
