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

#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include <dtrain/data/hub_image_processor.hpp>
#include <dtrain/data/image.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

struct ViTImageProcessor : HubImageProcessor<ViTImageProcessor> {
  static constexpr const char* name = "ViTImageProcessor";
  ViTImageProcessor() { image_mean = image_std = {0.5f, 0.5f, 0.5f}; }  // transformers' IMAGENET_STANDARD_MEAN and _STD

  bool do_resize = true;
  int height = 224, width = 224;

  /// Parses preprocessor_config.json's object; `source` names it in errors.
  static ViTImageProcessor from_json(const nlohmann::json& j, const std::string& source = "ViTImageProcessor") {
    if (!j.is_object()) throw ConfigError(source + ": an image processor config must be a JSON object");
    const detail::PreprocessorJson r{j, source};
    ViTImageProcessor p;
    r.flag("do_resize", p.do_resize);
    bool crop = false;
    r.flag("do_center_crop", crop);
    if (crop) throw r.fail("do_center_crop", "a center crop is not part of ViTImageProcessor here");
    r.height_width("size", p.height, p.width,
                   "ViTImageProcessor resizes to {\"height\": h, \"width\": w} (or one number) only");
    if (j.contains("resample") && j["resample"] != 2) throw r.fail("resample", "only 2 (PIL's BILINEAR, ViT's default) is computed here");
    p.read_normalization(r, {"do_resize", "size", "resample"});
    return p;
  }

  /// preprocessor_config.json's object (transformers reads it back as this processor).
  nlohmann::json to_json() const {
    auto j = normalization_json();
    j["do_resize"] = do_resize;
    j["size"] = {{"height", height}, {"width", width}};
    j["resample"] = 2;
    return j;
  }

  /// The resize step (a stage for data::map): do_resize's size with PIL's bilinear filter.
  Image operator()(Image im) const {
    if (do_resize && (im.pixels.rows != height || im.pixels.cols != width))
      im.pixels = detail::pil_resize(im.pixels, height, width, detail::Resample::bilinear);
    return im;
  }
  /// The [height, width] of pixel_values (of images already that size where do_resize is false).
  std::pair<int, int> output_size() const { return {height, width}; }

  bool operator==(const ViTImageProcessor&) const = default;
};

}  // namespace data

DTRAIN_NAMESPACE_END
