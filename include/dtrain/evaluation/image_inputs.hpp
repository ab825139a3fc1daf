// SPDX-License-Identifier: Apache-2.0
#pragma once
// evaluation::ImageInputs: raw image files into a Predictor or batch_predict restored from a
// checkpoint, through the image preprocessing and the class names the training saved with it,
// whichever preprocessing that was (data::ImageTransforms, or a fine-tuned ViT's
// data::ViTImageProcessor, or a CLIP vision tower's data::CLIPImageProcessor):
//
//   ctx.checkpoint(model, opt).with_object("transforms", eval).with_object("labels", labels)
//   auto predictor = Predictor<Net>::from_checkpoint(dir, dtrain::evaluation::ImageInputs{});
//   auto p = predictor.predict({"cat.png", "dog.jpg"});  // p[i].label, p[i].probabilities
//
// OpenCV decodes the files: like data/image.hpp, link the CMake target dtrain::images.

#include <string>
#include <vector>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/data/clip_image_processor.hpp>
#include <dtrain/data/image_transforms.hpp>
#include <dtrain/data/vit_image_processor.hpp>
#include <dtrain/evaluation/predictor.hpp>
#include <dtrain/evaluation/raw_inputs.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace evaluation {

/// Which checkpoint objects turn image files into a model's batch: the image preprocessing saved
/// as `transforms` and a data::LabelEncoder of the class names saved as `labels`
/// (`data::LabelEncoder::fit(folder.classes())`: an ImageFolder's classes are sorted, as the
/// encoder's are, so class k keeps its name). A file becomes one row of the model's float
/// [N, C, H, W] input, given to its forward(Tensor). restore(ck) reads which preprocessing was
/// saved (data::ImageTransforms, data::ViTImageProcessor or data::CLIPImageProcessor) from the object itself;
/// restore<Transforms>(ck) loads a type of your own.
struct ImageInputs {
  explicit ImageInputs() = default;
  std::string transforms = "transforms";
  std::string labels = "labels";

  /// The preprocessing the checkpoint holds, of the type it says it is, and the label encoder.
  RawInputs restore(const checkpointer::Checkpoint& ck) const {
    const auto kind = ck.object_kind(transforms);
    if (kind == "ImageTransforms") return restore<data::ImageTransforms>(ck);
    if (kind == "ViTImageProcessor") return restore<data::ViTImageProcessor>(ck);
    if (kind == "CLIPImageProcessor") return restore<data::CLIPImageProcessor>(ck);
    detail::unknown_preprocessing(ck, transforms, kind,
                                  {.inputs = "ImageInputs", .field = "transforms",
                                   .known = "ImageTransforms, ViTImageProcessor and CLIPImageProcessor", .your_type = "YourTransforms"});
  }

  /// `Transforms`: what the training saved as `transforms`, with load(archive) and
  /// load(image paths) -> [N, C, H, W].
  template <class Transforms>
  RawInputs restore(const checkpointer::Checkpoint& ck) const {
    Transforms t;
    ck.load_object(transforms, t);
    RawInputs in;
    in.class_names = detail::saved_class_names(ck, labels);
    in.tensor = [t](const std::vector<std::string>& files) { return t.load(files); };
    return in;
  }
};

}  // namespace evaluation

DTRAIN_NAMESPACE_END
