// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::CLIPImageProcessor: transformers' CLIPImageProcessor read from a model directory's
// preprocessor_config.json and applied to image files, giving the pixel_values a CLIP vision tower
// (nn/clip.hpp) takes:
//
//   const auto processor = data::CLIPImageProcessor::from_pretrained(dir);  // dir/preprocessor_config.json
//   torch::Tensor pixel_values = processor.load({"cat.png", "dog.jpg"});     // float [2, 3, 224, 224]
//
// Its steps, computed as its PIL backend (CLIPImageProcessorPil) computes them, so the floats are
// equal (tests/unit/clip_processor_test.cpp):
//   decode          data/image.hpp's decode_image: PIL's Image.open(f).convert("RGB"), 8-bit pixels
//                   (grey, palette and CMYK files converted as PIL converts them; alpha dropped, as
//                   Ray Data's read_images(mode="RGB") gives them)
//   do_resize       the shortest edge to size's shortest_edge, the other edge scaled and truncated
//                   (or to {height, width}), with PIL's bicubic filter (resample 3; 2 is bilinear),
//                   antialiased when shrinking, rounded to 8 bits
//   do_center_crop  crop_size's {height, width} at the centre, offsets floored, zero-padded where the
//                   image is smaller
//   do_rescale, do_normalize  as data::HubImageProcessor (CLIP's mean and std by default)
// transformers 5's AutoImageProcessor gives its torchvision backend by default, whose bicubic
// resize is torch's and lands within a few grey levels of PIL's (the tests assert the largest
// difference). In a pipeline, the processor is a map stage (data::map(processor)) and
// processor.collate() the rest. What it does not compute is a ConfigError naming the file and key.
//
// OpenCV is a dependency of this header (data/image.hpp): link the CMake target dtrain::images.

#include <algorithm>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include <dtrain/data/hub_image_processor.hpp>
#include <dtrain/data/image.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

struct CLIPImageProcessor : HubImageProcessor<CLIPImageProcessor> {
  static constexpr const char* name = "CLIPImageProcessor";
  CLIPImageProcessor() {  // transformers' OPENAI_CLIP_MEAN and OPENAI_CLIP_STD
    image_mean = {0.48145466f, 0.4578275f, 0.40821073f};
    image_std = {0.26862954f, 0.26130258f, 0.27577711f};
  }

  bool do_resize = true;
  /// size {"shortest_edge": n} (height 0), or {"height": h, "width": w}.
  int shortest_edge = 224, height = 0, width = 0;
  detail::Resample resample = detail::Resample::bicubic;
  bool do_center_crop = true;
  int crop_height = 224, crop_width = 224;

  /// Parses preprocessor_config.json's object; `source` names it in errors.
  static CLIPImageProcessor from_json(const nlohmann::json& j, const std::string& source = "CLIPImageProcessor");
  /// preprocessor_config.json's object (transformers reads it back as this processor).
  nlohmann::json to_json() const;

  /// The resize and crop steps (a stage for data::map).
  Image operator()(Image im) const;
  /// The [height, width] of pixel_values: the crop's (or the resize's, or 0 where it depends on the image).
  std::pair<int, int> output_size() const {
    if (do_center_crop) return {crop_height, crop_width};
    if (do_resize && height > 0) return {height, width};
    return {0, 0};
  }

  bool operator==(const CLIPImageProcessor&) const = default;
};

inline CLIPImageProcessor CLIPImageProcessor::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw ConfigError(source + ": an image processor config must be a JSON object");
  const detail::PreprocessorJson r{j, source};
  CLIPImageProcessor p;
  r.flag("do_resize", p.do_resize);
  r.flag("do_center_crop", p.do_center_crop);
  if (j.contains("size")) {
    const auto& s = j["size"];
    if (s.is_object() && s.size() == 1 && s.contains("shortest_edge") && s["shortest_edge"].is_number_integer()) {
      p.shortest_edge = s["shortest_edge"].get<int>();
      if (p.shortest_edge < 1) throw r.fail("size", "sizes must be positive");
    } else {
      r.height_width("size", p.height, p.width,
                     "CLIPImageProcessor resizes to {\"shortest_edge\": n} or {\"height\": h, \"width\": w}");
      p.shortest_edge = 0;
    }
  }
  r.height_width("crop_size", p.crop_height, p.crop_width, "it must be {\"height\": h, \"width\": w} (or one number)");
  if (j.contains("resample")) {
    if (j["resample"] == 3) p.resample = detail::Resample::bicubic;
    else if (j["resample"] == 2) p.resample = detail::Resample::bilinear;
    else throw r.fail("resample", "only 3 (PIL's BICUBIC, CLIP's default) and 2 (BILINEAR) are computed here");
  }
  p.read_normalization(r, {"do_resize", "do_center_crop", "size", "crop_size", "resample"});
  return p;
}

inline nlohmann::json CLIPImageProcessor::to_json() const {
  auto j = normalization_json();
  j["do_resize"] = do_resize;
  j["size"] = shortest_edge > 0 ? nlohmann::json{{"shortest_edge", shortest_edge}} : nlohmann::json{{"height", height}, {"width", width}};
  j["resample"] = static_cast<int>(resample);
  j["do_center_crop"] = do_center_crop;
  j["crop_size"] = {{"height", crop_height}, {"width", crop_width}};
  return j;
}

inline Image CLIPImageProcessor::operator()(Image im) const {
  if (do_resize) {
    const int rows = im.pixels.rows, cols = im.pixels.cols;
    int h = height, w = width;
    if (shortest_edge > 0) {  // transformers' get_resize_output_image_size(default_to_square=False)
      const int small = std::min(rows, cols), large = std::max(rows, cols);
      const int scaled = static_cast<int>(static_cast<double>(shortest_edge * large) / small);
      h = rows <= cols ? shortest_edge : scaled;
      w = rows <= cols ? scaled : shortest_edge;
    }
    if (h != rows || w != cols) im.pixels = detail::pil_resize(im.pixels, h, w, resample);
  }
  if (do_center_crop && (im.pixels.rows != crop_height || im.pixels.cols != crop_width)) {
    const auto floor_half = [](int d) { return d >= 0 ? d / 2 : -((-d + 1) / 2); };  // Python's d // 2
    const int rows = im.pixels.rows, cols = im.pixels.cols;
    int top = floor_half(rows - crop_height), left = floor_half(cols - crop_width);
    cv::Mat source = im.pixels;
    if (top < 0 || left < 0 || top + crop_height > rows || left + crop_width > cols) {
      // Smaller than the crop: centred on zeros first (numpy's center_crop pads with ceil halves).
      const int pad_top = (std::max(crop_height, rows) - rows + 1) / 2, pad_left = (std::max(crop_width, cols) - cols + 1) / 2;
      source = cv::Mat::zeros(std::max(crop_height, rows), std::max(crop_width, cols), im.pixels.type());
      im.pixels.copyTo(source(cv::Rect(pad_left, pad_top, cols, rows)));
      top += pad_top;
      left += pad_left;
    }
    im.pixels = source(cv::Rect(left, top, crop_width, crop_height)).clone();
  }
  return im;
}

}  // namespace data

DTRAIN_NAMESPACE_END
