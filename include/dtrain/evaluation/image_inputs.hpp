// SPDX-License-Identifier: Apache-2.0
#pragma once
// evaluation::ImageInputs: raw image files into a Predictor restored from a checkpoint, through the
// data::ImageTransforms and the class names the training saved with it:
//
//   ctx.checkpoint(model, opt).with_object("transforms", eval).with_object("labels", labels)
//   auto predictor = Predictor<Net>::from_checkpoint(dir, dtrain::evaluation::ImageInputs{});
//   auto p = predictor.predict({"cat.png", "dog.jpg"});  // p[i].label, p[i].probabilities
//
// A ViT fine-tuned from a Hugging Face directory saves its data::ViTImageProcessor instead, and names
// it: Predictor<ViT>::from_checkpoint<dtrain::data::ViTImageProcessor>(dir, ImageInputs{}).
//
// OpenCV decodes the files: like data/image.hpp, link the CMake target dtrain::images.

#include <string>
#include <vector>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/data/image_transforms.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/evaluation/predictor.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace evaluation {

/// Which checkpoint objects turn image files into a model's batch: the image preprocessing saved
/// as `transforms` and a data::LabelEncoder of the class names saved as `labels`
/// (`data::LabelEncoder::fit(folder.classes())`: an ImageFolder's classes are sorted, as the
/// encoder's are, so class k keeps its name). A file becomes one row of the model's float
/// [N, C, H, W] input, given to its forward(Tensor). The preprocessing is a data::ImageTransforms
/// unless the Predictor names the type it was saved as:
///   Predictor<ViT>::from_checkpoint<dtrain::data::ViTImageProcessor>(dir, ImageInputs{})
struct ImageInputs {
  explicit ImageInputs() = default;
  std::string transforms = "transforms";
  std::string labels = "labels";

  /// `Transforms`: what the training saved as `transforms`, with load(archive) and
  /// load(image paths) -> [N, C, H, W] (data::ImageTransforms, data::ViTImageProcessor).
  template <class Transforms = data::ImageTransforms>
  RawInputs restore(const checkpointer::Checkpoint& ck) const {
    Transforms t;
    data::LabelEncoder encoder;
    ck.load_object(transforms, t);
    ck.load_object(labels, encoder);
    RawInputs in;
    in.class_names = encoder.classes();
    in.tensor = [t](const std::vector<std::string>& files) { return t.load(files); };
    return in;
  }
};

}  // namespace evaluation

DTRAIN_NAMESPACE_END
