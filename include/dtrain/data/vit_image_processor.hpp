// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::ViTImageProcessor: transformers' ViTImageProcessor (its PIL backend, ViTImageProcessorPil)
// read from a model directory's preprocessor_config.json and applied to image files, giving the
// pixel_values a ViT (nn/vit.hpp) takes:
//
//   const auto processor = data::ViTImageProcessor::from_pretrained(dir);  // dir/preprocessor_config.json
//   torch::Tensor pixel_values = processor.load({"cat.png", "dog.png"});     // float [2, 3, 224, 224]
//
// Its steps, computed as transformers computes them, so the floats are equal (tests/unit/vit_test.cpp):
//   decode      data/image.hpp's decode_image: PIL's Image.open(f).convert("RGB"), 8-bit pixels
//               (convert("L") where do_convert_rgb is false and image_mean, image_std are one value)
//   do_resize   to size {height, width} with PIL's bilinear filter (resample 2), antialiased when
//               shrinking, rounded to 8 bits (data::resize, PIL's ImagingResample pixel for pixel)
//   do_rescale  x * rescale_factor in double, then float (numpy's astype(float64) * scale, astype(float32))
//   do_normalize (x - image_mean) / image_std in float
// In a pipeline, the processor is the resize stage (data::map(processor)) and
// processor.collate() the rest. What it does not compute is a ConfigError naming the file and key:
// another resample filter, do_center_crop, a size by shortest_edge or max_height/max_width.
//
// OpenCV is a dependency of this header (data/image.hpp): link the CMake target dtrain::images.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include <dtrain/data/fields.hpp>
#include <dtrain/data/image.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

struct ViTImageProcessor {
  bool do_resize = true;
  int height = 224, width = 224;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  /// One value per channel (or one for all): transformers' IMAGENET_STANDARD_MEAN and _STD.
  std::vector<float> image_mean{0.5f, 0.5f, 0.5f}, image_std{0.5f, 0.5f, 0.5f};
  /// 3: images decoded as convert("RGB"); 1: as convert("L").
  int channels = 3;
  /// preprocessor_config.json's other keys, written back as read.
  nlohmann::json extra = nlohmann::json::object();

  /// Parses preprocessor_config.json's object; `source` names it in errors.
  static ViTImageProcessor from_json(const nlohmann::json& j, const std::string& source = "ViTImageProcessor") {
    if (!j.is_object()) throw ConfigError(source + ": an image processor config must be a JSON object");
    const auto fail = [&](const std::string& key, const std::string& what) {
      return ConfigError(source + ": \"" + key + "\" is " + (j.contains(key) ? j[key].dump() : "missing") + "; " + what);
    };
    ViTImageProcessor p;
    const auto flag = [&](const char* key, bool& field) {
      if (!j.contains(key) || j[key].is_null()) return;
      if (!j[key].is_boolean()) throw fail(key, "it must be true or false");
      field = j[key].get<bool>();
    };
    flag("do_resize", p.do_resize);
    flag("do_rescale", p.do_rescale);
    flag("do_normalize", p.do_normalize);
    bool crop = false, convert_rgb = true;
    flag("do_center_crop", crop);
    if (crop) throw fail("do_center_crop", "a center crop is not part of ViTImageProcessor here");
    flag("do_convert_rgb", convert_rgb);
    if (j.contains("size")) {
      const auto& s = j["size"];
      if (s.is_number_integer()) {
        p.height = p.width = s.get<int>();  // transformers reads a number as {height: n, width: n}
      } else if (s.is_object() && s.size() == 2 && s.contains("height") && s.contains("width") &&
                 s["height"].is_number_integer() && s["width"].is_number_integer()) {
        p.height = s["height"].get<int>();
        p.width = s["width"].get<int>();
      } else {
        throw fail("size", "ViTImageProcessor resizes to {\"height\": h, \"width\": w} (or one number) only");
      }
      if (p.height < 1 || p.width < 1) throw fail("size", "sizes must be positive");
    }
    if (j.contains("resample") && j["resample"] != 2)
      throw fail("resample", "only 2 (PIL's BILINEAR, ViT's default) is computed here");
    if (j.contains("rescale_factor")) {
      if (!j["rescale_factor"].is_number()) throw fail("rescale_factor", "it must be a number");
      p.rescale_factor = j["rescale_factor"].get<double>();
    }
    for (auto [key, field] : {std::pair{"image_mean", &p.image_mean}, {"image_std", &p.image_std}}) {
      if (!j.contains(key) || j[key].is_null()) continue;
      const auto& v = j[key];
      field->clear();
      if (v.is_number()) field->push_back(v.get<float>());
      else if (v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), [](const auto& e) { return e.is_number(); }))
        for (const auto& e : v) field->push_back(e.get<float>());
      else throw fail(key, "it must be a number or a list of numbers");
    }
    for (auto [key, field] : {std::pair{"image_mean", &p.image_mean}, {"image_std", &p.image_std}})
      if (field->size() != 1 && field->size() != 3) throw fail(key, "one value, or one per channel of an RGB image");
    for (float s : p.image_std)
      if (!(s > 0)) throw fail("image_std", "every value must be positive");
    // A grey model: one mean and std and no RGB conversion asked for.
    p.channels = !convert_rgb && p.image_mean.size() == 1 && p.image_std.size() == 1 ? 1 : 3;
    for (const auto& [key, value] : j.items())
      if (key != "do_resize" && key != "do_rescale" && key != "do_normalize" && key != "size" && key != "resample" &&
          key != "rescale_factor" && key != "image_mean" && key != "image_std")
        p.extra[key] = value;
    return p;
  }

  /// Reads `path`: a model directory (its preprocessor_config.json) or the file itself.
  static ViTImageProcessor from_pretrained(const std::filesystem::path& path) {
    std::error_code ec;
    const auto file = std::filesystem::is_directory(path, ec) ? path / "preprocessor_config.json" : path;
    std::ifstream in(file);
    if (!in) throw ConfigError(file.string() + ": cannot be read; a Hugging Face image model's directory has a preprocessor_config.json");
    std::stringstream text;
    text << in.rdbuf();
    try {
      return from_json(nlohmann::json::parse(text.str()), file.string());
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(file.string() + ": not JSON (" + e.what() + ")");
    }
  }

  /// preprocessor_config.json's object (transformers reads it back as this processor).
  nlohmann::json to_json() const {
    nlohmann::json j = extra.is_object() ? extra : nlohmann::json::object();
    if (!j.contains("image_processor_type")) j["image_processor_type"] = "ViTImageProcessor";
    j["do_resize"] = do_resize;
    j["size"] = {{"height", height}, {"width", width}};
    j["resample"] = 2;
    j["do_rescale"] = do_rescale;
    j["rescale_factor"] = rescale_factor;
    j["do_normalize"] = do_normalize;
    j["image_mean"] = image_mean;
    j["image_std"] = image_std;
    return j;
  }
  /// Writes dir/preprocessor_config.json (dir created). Error naming the file when it cannot.
  void save_pretrained(const std::filesystem::path& dir) const {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::ofstream out(dir / "preprocessor_config.json");
    out << to_json().dump(2) << '\n';
    if (!out) throw Error((dir / "preprocessor_config.json").string() + ": cannot be written");
  }

  /// The resize step (a stage for data::map): do_resize's size with PIL's bilinear filter.
  Image operator()(Image im) const {
    if (do_resize && (im.pixels.rows != height || im.pixels.cols != width))
      im.pixels = detail::pil_resize_bilinear(im.pixels, height, width);
    return im;
  }

  /// Rescale and normalize of one image's 8-bit pixels, into `out` (C x H x W floats).
  void to_floats(const Image& im, float* out) const {
    const cv::Mat& m = im.pixels;
    const int c = m.channels();
    if (c != channels)
      throw DataError(im.path + ": a " + std::to_string(c) + "-channel image for a " + std::to_string(channels) +
                      "-channel processor; decode it with the processor's channels");
    for (int ch = 0; ch < c; ++ch) {
      const float mean = image_mean[image_mean.size() == 1 ? 0 : static_cast<std::size_t>(ch)];
      const float std = image_std[image_std.size() == 1 ? 0 : static_cast<std::size_t>(ch)];
      for (int y = 0; y < m.rows; ++y) {
        const std::uint8_t* s = m.ptr<std::uint8_t>(y) + ch;
        for (int x = 0; x < m.cols; ++x) {
          float v = do_rescale ? static_cast<float>(static_cast<double>(s[x * c]) * rescale_factor) : static_cast<float>(s[x * c]);
          if (do_normalize) v = (v - mean) / std;
          *out++ = v;
        }
      }
    }
  }

  /// Images of one size (resized) as pixel_values: float [N, C, H, W].
  torch::Tensor pixel_values(const std::vector<Image>& images) const {
    if (images.empty()) return torch::empty({0, channels, height, width});
    const cv::Mat& first = images.front().pixels;
    auto out = torch::empty({static_cast<std::int64_t>(images.size()), channels, first.rows, first.cols});
    for (std::size_t i = 0; i < images.size(); ++i) {
      const cv::Mat& m = images[i].pixels;
      if (m.rows != first.rows || m.cols != first.cols)
        throw DataError(images[i].path + ": a " + detail::size_text(m) + " image in a batch of " + detail::size_text(first) +
                        " ones; resize them first (do_resize)");
      to_floats(images[i], out[static_cast<std::int64_t>(i)].data_ptr<float>());
    }
    return out;
  }

  /// The collate stage for a pipeline: Fields {"image": pixel_values [B, C, H, W], "label": int64 [B]}.
  auto collate() const {
    return [p = *this](const std::vector<Image>& images) {
      auto labels = torch::empty({static_cast<std::int64_t>(images.size())}, torch::kInt64);
      for (std::size_t i = 0; i < images.size(); ++i) labels[static_cast<std::int64_t>(i)] = images[i].label;
      return Fields{{"image", p.pixel_values(images)}, {"label", labels}};
    };
  }

  /// The image files at `paths`, decoded, resized, rescaled and normalized: float [N, C, H, W].
  torch::Tensor load(const std::vector<std::string>& paths) const {
    std::vector<Image> images;
    images.reserve(paths.size());
    for (const auto& path : paths) images.push_back((*this)(Image{decode_image(path, channels), -1, path}));
    return pixel_values(images);
  }

  /// As a checkpoint object (ctx.checkpoint(...).with_object("transforms", processor)), which
  /// evaluation::ImageInputs restores for a Predictor: preprocessor_config.json's object.
  void save(torch::serialize::OutputArchive& a) const { detail::write_json(a, "ViTImageProcessor", to_json()); }
  void load(torch::serialize::InputArchive& a) {
    *this = from_json(detail::read_json(a, "ViTImageProcessor"), "the checkpoint's ViTImageProcessor");
  }

  bool operator==(const ViTImageProcessor&) const = default;
};

}  // namespace data

DTRAIN_NAMESPACE_END
