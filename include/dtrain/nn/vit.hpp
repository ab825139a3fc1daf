// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::ViTModel and nn::ViTForImageClassification: the Vision Transformer of Hugging Face
// transformers, with its checkpoints' parameter names (`embeddings.cls_token`,
// `embeddings.position_embeddings`, `embeddings.patch_embeddings.projection.weight`,
// `encoder.layer.0.attention.attention.query.weight`, `encoder.layer.0.layernorm_before.weight`,
// `layernorm.weight`; `vit.` and `classifier.` for the classification head), so a model directory
// loads by name with no mapping table:
//
//   auto config = dtrain::nn::ViTConfig::from_pretrained(dir);          // dir/config.json
//   dtrain::nn::ViTForImageClassification model(config);
//   dtrain::nn::load_pretrained(*model, dir);           // weights::load, strict where it can be
//   auto logits = model(pixel_values);                  // [batch, channels, height, width] -> [batch, labels]
//
// pixel_values come from data::ViTImageProcessor (data/vit_image_processor.hpp, which needs
// OpenCV). The modules: embeddings (the patch embedding, a Conv2d of kernel and stride patch_size;
// the CLS token first; position embeddings added; dropout), encoder.layer.N (nn/encoder.hpp's
// HubEncoderLayer in its ViT layout: pre-norm, layernorm_before and layernorm_after), the final
// layernorm. There is no pooler: ViTForImageClassification classifies the CLS token's final state
// and builds its ViTModel without one (add_pooling_layer=False), and so does this ViTModel; a
// file's `pooler.*` tensors are reported unexpected by load_pretrained, never an error. The
// position embeddings are not interpolated: an image of another size than image_size is an error
// (as transformers' default interpolate_pos_encoding=False). With the same weights and inputs the
// outputs equal transformers' within 1e-5 in fp32 (tests/unit/vit_test.cpp).

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/nn/encoder.hpp>
#include <dtrain/nn/pretrained.hpp>
#include <dtrain/nn/vit_config.hpp>
#include <dtrain/weights.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// `embeddings`: cls_token [1, 1, hidden], position_embeddings [1, patches + 1, hidden],
/// patch_embeddings.projection (Conv2d num_channels -> hidden, kernel and stride patch_size).
struct ViTEmbeddingsImpl : torch::nn::Module {
  explicit ViTEmbeddingsImpl(const ViTConfig& c);

  /// pixel_values [batch, num_channels, image height, image width] -> [batch, patches + 1, hidden].
  torch::Tensor forward(const torch::Tensor& pixel_values);

  ViTConfig config;
  torch::Tensor cls_token, position_embeddings;
  torch::nn::Conv2d projection{nullptr};  // patch_embeddings.projection
};
TORCH_MODULE(ViTEmbeddings);

/// `encoder.layer.N`: nn/encoder.hpp's HubEncoderLayer in its ViT layout.
HubEncoderLayerOptions vit_layer_options(const ViTConfig& c);

struct ViTLayerImpl : HubEncoderLayerImpl {
  explicit ViTLayerImpl(const ViTConfig& c) : HubEncoderLayerImpl(vit_layer_options(c)), config(c) {}
  ViTConfig config;
};
TORCH_MODULE(ViTLayer);

/// transformers' ViTModel with add_pooling_layer=False: embeddings, encoder.layer.0..N-1,
/// layernorm. forward returns the last hidden state [batch, patches + 1, hidden] (the CLS token first).
struct ViTModelImpl : torch::nn::Module {
  using Config = ViTConfig;
  explicit ViTModelImpl(const Config& c = {});

  torch::Tensor forward(const torch::Tensor& pixel_values);

  Config config;
  ViTEmbeddings embeddings{nullptr};
  torch::nn::ModuleList layer{nullptr};  // encoder.layer
  torch::nn::LayerNorm layernorm{nullptr};
};
TORCH_MODULE(ViTModel);

/// transformers' ViTForImageClassification: `vit` (ViTModel), `classifier` (Linear hidden ->
/// num_labels) on the CLS token's final state. forward returns the logits [batch, num_labels].
struct ViTForImageClassificationImpl : torch::nn::Module {
  using Config = ViTConfig;
  explicit ViTForImageClassificationImpl(const Config& c = {});

  torch::Tensor forward(const torch::Tensor& pixel_values) {
    return detail::apply(classifier, vit(pixel_values).select(1, 0));
  }

  Config config;
  ViTModel vit{nullptr};
  torch::nn::Linear classifier{nullptr};
};
TORCH_MODULE(ViTForImageClassification);

/// Loads a Hugging Face ViT's weights at `path` (a model directory, a .safetensors file, a sharded
/// index or a torch.save state_dict: weights::read) into `model`, as transformers' from_pretrained
/// does: a bare ViTModel's file (no `vit.` prefix) loads into a ViTForImageClassification's `vit`
/// with the classifier reported missing (keeping its initialisation), a classification file loads
/// into a ViTModel through `vit.` with the classifier reported unexpected, and a pooler's tensors
/// (`pooler.dense.*`, a ViTModel saved with add_pooling_layer=True) are reported unexpected.
/// Otherwise `options.strict` holds as in weights::load: a missing or unexpected name is an Error
/// listing them, a shape mismatch always is.
template <class M>
  requires std::is_base_of_v<ViTModelImpl, M> || std::is_base_of_v<ViTForImageClassificationImpl, M>
weights::LoadReport load_pretrained(M& model, const std::filesystem::path& path, weights::LoadOptions options = {}) {
  auto state = weights::read(path);
  const auto source = weights::detail::weights_format(path).second.string();
  const bool classification_file =
      std::any_of(state.begin(), state.end(), [](const auto& kv) { return kv.first.rfind("vit.", 0) == 0; });
  // Tensors this model does not have and transformers passes over: the pooler, and a
  // classification file's head when the model is a bare ViTModel.
  std::vector<std::string> passed_over;
  const auto pass_over = [&](auto&& is_extra) {
    std::erase_if(state, [&](const auto& kv) {
      if (!is_extra(kv.first)) return false;
      passed_over.push_back(kv.first);
      return true;
    });
  };
  const std::string base = classification_file ? "vit." : "";
  pass_over([&](const std::string& k) { return k.rfind(base + "pooler.", 0) == 0; });
  weights::LoadReport report;
  if constexpr (std::is_base_of_v<ViTForImageClassificationImpl, M>) {
    if (!classification_file && options.prefix.empty()) {
      report = weights::load_state_dict(*model.vit, std::move(state), source, options);
      for (auto& k : report.missing) k = "vit." + k;
      for (const auto& p : model.classifier->named_parameters()) report.missing.push_back("classifier." + p.key());
    } else {
      report = weights::load_state_dict(model, std::move(state), source, options);
    }
  } else {
    if (classification_file && options.prefix.empty()) {
      options.prefix = "vit.";
      pass_over([](const std::string& k) { return k.rfind("vit.", 0) != 0; });
    }
    report = weights::load_state_dict(model, std::move(state), source, options);
  }
  report.unexpected.insert(report.unexpected.end(), passed_over.begin(), passed_over.end());
  return report;
}

/// Writes `model` to `dir` as a Hugging Face model directory that transformers' from_pretrained
/// loads with no missing or unexpected key: config.json (the ViTConfig, model_type "vit",
/// `architectures` naming the class, id2label/label2id, the dtype), model.safetensors (every
/// parameter by its name) and `options.files` copied beside them (preprocessor_config.json).
/// A bare ViTModel has no pooler: load it in Python with ViTModel.from_pretrained(dir,
/// add_pooling_layer=False). Error naming the path when a file cannot be written or copied, and
/// for a model still sharded by strategy::fsdp<> (export the model a checkpoint restores).
template <class M>
  requires std::is_base_of_v<ViTModelImpl, M> || std::is_base_of_v<ViTForImageClassificationImpl, M>
void save_pretrained(const M& model, const std::filesystem::path& dir, const SavePretrainedOptions& options = {}) {
  const std::string architecture = std::is_base_of_v<ViTModelImpl, M> ? "ViTModel" : "ViTForImageClassification";
  detail::write_pretrained(model, dir, model.config.to_json(), architecture, options);
}

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/vit.ipp>
#endif
