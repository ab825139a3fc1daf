// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the image processors of Hugging Face models here (data::ViTImageProcessor,
// data::CLIPImageProcessor) share once an image has its final size: the decode's channels, rescale
// and normalize as transformers computes them, preprocessor_config.json read and its other keys
// kept, and the ways out (pixel_values, a collate stage, load of files, a checkpoint object).
// Each processor derives from data::HubImageProcessor<Itself> and adds its geometry: `name`,
// `from_json`, `to_json` and the resize stage, `operator()(Image)`.
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

namespace detail {

/// preprocessor_config.json's keys, read with errors that name the file, the key and the value.
struct PreprocessorJson {
  const nlohmann::json& j;
  const std::string& source;

  ConfigError fail(const std::string& key, const std::string& what) const {
    return ConfigError(source + ": \"" + key + "\" is " + (j.contains(key) ? j[key].dump() : "missing") + "; " + what);
  }
  void flag(const char* key, bool& field) const {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_boolean()) throw fail(key, "it must be true or false");
    field = j[key].get<bool>();
  }
  /// {"height": h, "width": w} (or one number, read as both, as transformers does).
  void height_width(const char* key, int& height, int& width, const std::string& what) const {
    if (!j.contains(key)) return;
    const auto& s = j[key];
    if (s.is_number_integer()) {
      height = width = s.get<int>();
    } else if (s.is_object() && s.size() == 2 && s.contains("height") && s.contains("width") && s["height"].is_number_integer() &&
               s["width"].is_number_integer()) {
      height = s["height"].get<int>();
      width = s["width"].get<int>();
    } else {
      throw fail(key, what);
    }
    if (height < 1 || width < 1) throw fail(key, "sizes must be positive");
  }
};

}  // namespace detail

/// The steps after the resize (and crop): do_rescale (x * rescale_factor in double, then float, as
/// numpy's astype(float64) * scale, astype(float32)) and do_normalize ((x - image_mean) / image_std
/// in float), on images decoded with `channels` (3: PIL's convert("RGB"); 1: convert("L") where
/// do_convert_rgb is false and image_mean, image_std are one value).
template <class Processor>
struct HubImageProcessor {
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  /// One value per channel (or one for all).
  std::vector<float> image_mean, image_std;
  int channels = 3;
  /// preprocessor_config.json's other keys, written back as read.
  nlohmann::json extra = nlohmann::json::object();

  /// Reads `path`: a model directory (its preprocessor_config.json) or the file itself.
  static Processor from_pretrained(const std::filesystem::path& path) {
    std::error_code ec;
    const auto file = std::filesystem::is_directory(path, ec) ? path / "preprocessor_config.json" : path;
    std::ifstream in(file);
    if (!in) throw ConfigError(file.string() + ": cannot be read; a Hugging Face image model's directory has a preprocessor_config.json");
    std::stringstream text;
    text << in.rdbuf();
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text.str());
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(file.string() + ": not JSON (" + e.what() + ")");
    }
    return Processor::from_json(j, file.string());
  }

  /// Writes dir/preprocessor_config.json (dir created). Error naming the file when it cannot.
  void save_pretrained(const std::filesystem::path& dir) const {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::ofstream out(dir / "preprocessor_config.json");
    out << self().to_json().dump(2) << '\n';
    if (!out) throw Error((dir / "preprocessor_config.json").string() + ": cannot be written");
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

  /// Images of one size (the processor's stage applied) as pixel_values: float [N, C, H, W].
  torch::Tensor pixel_values(const std::vector<Image>& images) const {
    if (images.empty()) {
      const auto [h, w] = self().output_size();
      return torch::empty({0, channels, h, w});
    }
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
    return [p = self()](const std::vector<Image>& images) {
      auto labels = torch::empty({static_cast<std::int64_t>(images.size())}, torch::kInt64);
      for (std::size_t i = 0; i < images.size(); ++i) labels[static_cast<std::int64_t>(i)] = images[i].label;
      return Fields{{"image", p.pixel_values(images)}, {"label", labels}};
    };
  }

  /// The image files at `paths`, decoded and processed: float [N, C, H, W].
  torch::Tensor load(const std::vector<std::string>& paths) const {
    std::vector<Image> images;
    images.reserve(paths.size());
    for (const auto& path : paths) images.push_back(self()(Image{decode_image(path, channels), -1, path}));
    return pixel_values(images);
  }

  /// As a checkpoint object (ctx.checkpoint(...).with_object("transforms", processor)), which
  /// evaluation::ImageInputs restores for a Predictor: preprocessor_config.json's object.
  void save(torch::serialize::OutputArchive& a) const { detail::write_json(a, Processor::name, self().to_json()); }
  void load(torch::serialize::InputArchive& a) {
    static_cast<Processor&>(*this) =
        Processor::from_json(detail::read_json(a, Processor::name), std::string("the checkpoint's ") + Processor::name);
  }

  bool operator==(const HubImageProcessor&) const = default;

 protected:
  /// do_rescale, rescale_factor, do_normalize, image_mean, image_std and do_convert_rgb from `j`;
  /// the keys the processor reads itself are `geometry`, and every other key goes to `extra`.
  void read_normalization(const detail::PreprocessorJson& r, const std::vector<std::string>& geometry) {
    const auto& j = r.j;
    r.flag("do_rescale", do_rescale);
    r.flag("do_normalize", do_normalize);
    bool convert_rgb = true;
    r.flag("do_convert_rgb", convert_rgb);
    if (j.contains("rescale_factor")) {
      if (!j["rescale_factor"].is_number()) throw r.fail("rescale_factor", "it must be a number");
      rescale_factor = j["rescale_factor"].template get<double>();
    }
    for (auto [key, field] : {std::pair{"image_mean", &image_mean}, {"image_std", &image_std}}) {
      if (!j.contains(key) || j[key].is_null()) continue;
      const auto& v = j[key];
      field->clear();
      if (v.is_number()) field->push_back(v.template get<float>());
      else if (v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), [](const auto& e) { return e.is_number(); }))
        for (const auto& e : v) field->push_back(e.template get<float>());
      else throw r.fail(key, "it must be a number or a list of numbers");
    }
    for (auto [key, field] : {std::pair{"image_mean", &image_mean}, {"image_std", &image_std}})
      if (field->size() != 1 && field->size() != 3) throw r.fail(key, "one value, or one per channel of an RGB image");
    for (float s : image_std)
      if (!(s > 0)) throw r.fail("image_std", "every value must be positive");
    // A grey model: one mean and std and no RGB conversion asked for.
    channels = !convert_rgb && image_mean.size() == 1 && image_std.size() == 1 ? 1 : 3;
    for (const auto& [key, value] : j.items())
      if (key != "do_rescale" && key != "do_normalize" && key != "rescale_factor" && key != "image_mean" && key != "image_std" &&
          std::find(geometry.begin(), geometry.end(), key) == geometry.end() &&
          !(key == "image_processor_type" && value == Processor::name))  // written back by normalization_json
        extra[key] = value;
  }
  /// The keys read_normalization reads, into `j` (after `extra`'s).
  nlohmann::json normalization_json() const {
    nlohmann::json j = extra.is_object() ? extra : nlohmann::json::object();
    if (!j.contains("image_processor_type")) j["image_processor_type"] = Processor::name;  // (another's kept as read)
    j["do_rescale"] = do_rescale;
    j["rescale_factor"] = rescale_factor;
    j["do_normalize"] = do_normalize;
    j["image_mean"] = image_mean;
    j["image_std"] = image_std;
    return j;
  }

 private:
  const Processor& self() const { return static_cast<const Processor&>(*this); }
};

}  // namespace data

DTRAIN_NAMESPACE_END
