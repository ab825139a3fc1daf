// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::ImageTransforms: the deterministic preprocessing of an image for a model, as data (decode
// with C channels, resize and center-crop steps in order, ToTensor + Normalize). Evaluation's
// pipeline applies it, a checkpoint saves it (.with_object("transforms", t)), and a Predictor
// restored from that checkpoint applies exactly the same to raw image files:
//
//   auto eval = data::ImageTransforms(3).resize(256).center_crop(224).normalize({0.485f, 0.456f, 0.406f},
//                                                                               {0.229f, 0.224f, 0.225f});
//   auto test = data::pipelined(data::ImageFolder(root, {.channels = 3}),
//                               data::map(eval) | data::collate(eval.to_tensor()));
//
// torchvision's Compose([Resize(256), CenterCrop(224), ToTensor(), Normalize(mean, std)]), pixel for
// pixel (data/image.hpp's stages).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <dtrain/data/image.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

class ImageTransforms {
 public:
  /// Images decoded with `channels` channels: 1 grey (PIL's convert("L")), 3 RGB.
  explicit ImageTransforms(int channels = 3) : channels_(channels) {
    if (channels != 1 && channels != 3)
      throw ConfigError("ImageTransforms: channels must be 1 (grey) or 3 (RGB), got " + std::to_string(channels));
  }

  /// transforms.Resize(size): the smaller edge becomes `size`.
  ImageTransforms& resize(int size) { return add("resize", size, 0); }
  /// transforms.Resize((height, width)).
  ImageTransforms& resize(int height, int width) { return add("resize", height, width); }
  /// transforms.CenterCrop((height, width)).
  ImageTransforms& center_crop(int height, int width) { return add("center_crop", height, width); }
  ImageTransforms& center_crop(int size) { return center_crop(size, size); }
  /// transforms.Normalize(mean, std) after ToTensor: one value per channel, or one for all.
  ImageTransforms& normalize(std::vector<float> mean, std::vector<float> std) {
    stack_images{mean, std}.check(channels_);
    mean_ = std::move(mean);
    std_ = std::move(std);
    return *this;
  }

  int channels() const { return channels_; }

  /// The resize and crop steps, in order (a stage for data::map). DataError naming the file when
  /// the image has another channel count than these transforms were made for.
  Image operator()(Image im) const {
    if (im.pixels.channels() != channels_)
      throw DataError(im.path + ": a " + std::to_string(im.pixels.channels()) + "-channel image, and the transforms "
                      "are for " + std::to_string(channels_) + "-channel ones; decode with the transforms' channels "
                      "(ImageFolderOptions::channels = ImageTransforms::channels())");
    for (const auto& s : steps_) {
      if (s.op == "resize") im = s.width ? data::resize(s.height, s.width)(std::move(im)) : data::resize(s.height)(std::move(im));
      else im = center_crop_stage(s)(std::move(im));
    }
    return im;
  }

  /// The collate stage: ToTensor + Normalize(mean, std) into a float [B, C, H, W] batch.
  stack_images to_tensor() const { return {mean_, std_}; }

  /// The image files at `paths`, decoded, transformed and stacked: float [N, C, H, W].
  torch::Tensor load(const std::vector<std::string>& paths) const {
    std::vector<Image> images;
    images.reserve(paths.size());
    for (const auto& p : paths) images.push_back((*this)(Image{decode_image(p, channels_), -1, p}));
    return to_tensor()(images).at("image");
  }

  nlohmann::json to_json() const {
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& s : steps_) steps.push_back({{"op", s.op}, {"height", s.height}, {"width", s.width}});
    return {{"channels", channels_}, {"steps", steps}, {"mean", mean_}, {"std", std_}};
  }
  /// Throws DataError naming what is wrong when `j` is not what to_json() writes.
  static ImageTransforms from_json(const nlohmann::json& j) {
    try {
      ImageTransforms t(j.at("channels").get<int>());
      for (const auto& s : j.at("steps")) {
        const auto op = s.at("op").get<std::string>();
        if (op != "resize" && op != "center_crop") throw DataError("unknown step \"" + op + "\"");
        t.add(op, s.at("height").get<int>(), s.at("width").get<int>());
      }
      return t.normalize(j.at("mean").get<std::vector<float>>(), j.at("std").get<std::vector<float>>());
    } catch (const std::exception& e) {
      throw DataError(std::string("ImageTransforms: ") + e.what() + " in " + j.dump().substr(0, 200));
    }
  }

  /// A checkpoint object (ctx.checkpoint(...).with_object(name, transforms)).
  void save(torch::serialize::OutputArchive& a) const { detail::write_json(a, "ImageTransforms", to_json()); }
  void load(torch::serialize::InputArchive& a) { *this = from_json(detail::read_json(a, "ImageTransforms")); }

  friend bool operator==(const ImageTransforms& a, const ImageTransforms& b) { return a.to_json() == b.to_json(); }

 private:
  struct Step {
    std::string op;
    int height = 0, width = 0;
  };
  static data::center_crop center_crop_stage(const Step& s) { return {s.height, s.width}; }

  ImageTransforms& add(const std::string& op, int height, int width) {
    if (height < 1 || width < 0 || (op == "center_crop" && width < 1))
      throw ConfigError("ImageTransforms::" + op + ": sizes must be positive, got " + std::to_string(height) + "x" +
                        std::to_string(width));
    steps_.push_back({op, height, width});
    return *this;
  }

  int channels_;
  std::vector<Step> steps_;
  std::vector<float> mean_{0.0f}, std_{1.0f};
};

}  // namespace data

DTRAIN_NAMESPACE_END
