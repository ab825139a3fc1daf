// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::CLIPModel, nn::CLIPVisionModel and nn::CLIPTextModel: OpenAI's CLIP as Hugging Face
// transformers builds it, with its checkpoints' parameter names (`vision_model.embeddings.class_embedding`,
// `vision_model.embeddings.patch_embedding.weight`, `vision_model.pre_layrnorm.weight` (sic),
// `vision_model.encoder.layers.0.self_attn.q_proj.weight`, `....mlp.fc1.weight`, `....layer_norm1.weight`,
// `vision_model.post_layernorm.weight`, `text_model.embeddings.token_embedding.weight`,
// `text_model.final_layer_norm.weight`, `visual_projection.weight`, `text_projection.weight`,
// `logit_scale`), so a model directory loads by name:
//
//   auto config = dtrain::nn::CLIPConfig::from_pretrained(dir);        // dir/config.json
//   dtrain::nn::CLIPModel clip(config);
//   dtrain::nn::load_pretrained(clip, dir);             // weights::load, strict where it can be
//   torch::Tensor image_embeds = clip->get_image_features(pixel_values);  // [batch, projection_dim]
//   torch::Tensor text_embeds = clip->get_text_features(input_ids, attention_mask);
//
// The towers: the vision tower embeds patches (a Conv2d without bias, kernel and stride patch_size)
// after a class embedding, adds position embeddings, applies pre_layrnorm, the encoder layers
// (pre-norm: layer_norm1, self-attention, layer_norm2, mlp with quick_gelu) and post_layernorm on
// the class token's state (its pooler_output). The text tower adds token and position embeddings,
// runs the same layers under a causal mask (and attention_mask's padding), final_layer_norm, and
// pools at the first eos_token_id of each row (a DataError when a row has none), or at the highest
// id where the config's eos_token_id is 2 (files from before transformers' fix, whose vocabulary's
// highest id is the EOS), as transformers 5 does. Position embeddings are not
// interpolated: an image of another size than image_size is an error. With the same weights and
// inputs the outputs equal transformers' within 1e-5 in fp32 (tests/unit/clip_test.cpp).

#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>
#include <utility>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/nn/clip_config.hpp>
#include <dtrain/nn/decoder.hpp>
#include <dtrain/nn/encoder.hpp>
#include <dtrain/nn/pretrained.hpp>
#include <dtrain/weights.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// What a CLIP tower returns (transformers' BaseModelOutputWithPooling).
struct CLIPTowerOutput {
  torch::Tensor last_hidden_state;  // [batch, sequence, hidden]
  torch::Tensor pooler_output;      // [batch, hidden]: the class token's (vision) or the EOS token's (text) state
};

/// `encoder.layers.N`: self_attn.{q,k,v,out}_proj, layer_norm1, mlp.{fc1,fc2}, layer_norm2; pre-norm.
struct CLIPEncoderLayerImpl : torch::nn::Module {
  explicit CLIPEncoderLayerImpl(const CLIPEncoderConfig& c);
  /// x [batch, sequence, hidden]; `mask` as decoder_attention takes it (none for the vision tower).
  torch::Tensor forward(const torch::Tensor& x, const DecoderMask& mask = {});

  CLIPEncoderConfig config;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr}, fc1{nullptr}, fc2{nullptr};
  torch::nn::LayerNorm layer_norm1{nullptr}, layer_norm2{nullptr};
};
TORCH_MODULE(CLIPEncoderLayer);

/// transformers' CLIPVisionModel: embeddings, pre_layrnorm, encoder.layers, post_layernorm (a
/// CLIPModel's `vision_model`).
struct CLIPVisionModelImpl : torch::nn::Module {
  using Config = CLIPVisionConfig;
  explicit CLIPVisionModelImpl(const Config& c = {});
  /// pixel_values [batch, num_channels, image_size, image_size] (data::CLIPImageProcessor's).
  CLIPTowerOutput forward(const torch::Tensor& pixel_values);

  Config config;
  torch::Tensor class_embedding;                 // embeddings.class_embedding [hidden]
  torch::nn::Conv2d patch_embedding{nullptr};    // embeddings.patch_embedding
  torch::nn::Embedding position_embedding{nullptr};
  torch::nn::LayerNorm pre_layrnorm{nullptr}, post_layernorm{nullptr};
  torch::nn::ModuleList layers{nullptr};         // encoder.layers
};
TORCH_MODULE(CLIPVisionModel);

/// transformers' CLIPTextModel: embeddings, encoder.layers, final_layer_norm (a CLIPModel's `text_model`).
struct CLIPTextModelImpl : torch::nn::Module {
  using Config = CLIPTextConfig;
  explicit CLIPTextModelImpl(const Config& c = {});
  /// input_ids [batch, sequence] (int64, at most max_position_embeddings); attention_mask
  /// [batch, sequence], 1 for a token and 0 for padding (undefined: none). Every row needs its EOS.
  CLIPTowerOutput forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {});

  Config config;
  torch::nn::Embedding token_embedding{nullptr}, position_embedding{nullptr};  // embeddings.*
  torch::nn::ModuleList layers{nullptr};                                         // encoder.layers
  torch::nn::LayerNorm final_layer_norm{nullptr};
};
TORCH_MODULE(CLIPTextModel);

/// What CLIPModel's forward returns (transformers' CLIPOutput without the loss).
struct CLIPOutput {
  torch::Tensor logits_per_image;  // [images, texts]: cosine similarity times exp(logit_scale)
  torch::Tensor logits_per_text;   // [texts, images]
  torch::Tensor text_embeds;       // [texts, projection_dim], normalised
  torch::Tensor image_embeds;      // [images, projection_dim], normalised
};

/// transformers' CLIPModel: both towers, their projections into one space and logit_scale.
struct CLIPModelImpl : torch::nn::Module {
  using Config = CLIPConfig;
  explicit CLIPModelImpl(const Config& c = {});

  /// visual_projection(the vision tower's pooler_output): [batch, projection_dim], not normalised.
  torch::Tensor get_image_features(const torch::Tensor& pixel_values);
  /// text_projection(the text tower's pooler_output): [batch, projection_dim], not normalised.
  torch::Tensor get_text_features(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {});
  CLIPOutput forward(const torch::Tensor& input_ids, const torch::Tensor& pixel_values,
                     const torch::Tensor& attention_mask = {});

  Config config;
  CLIPTextModel text_model{nullptr};
  CLIPVisionModel vision_model{nullptr};
  torch::nn::Linear visual_projection{nullptr}, text_projection{nullptr};
  torch::Tensor logit_scale;
};
TORCH_MODULE(CLIPModel);

namespace detail {
/// Loads a CLIP file into `model`; `tower` is "vision_model." or "text_model." for a tower alone
/// (the keys under it load with the prefix taken off, the rest of a whole CLIP's file is passed
/// over), "" for a CLIPModel. Old files' `*.position_ids` buffers are passed over. What is passed
/// over is reported unexpected, as transformers' from_pretrained does.
weights::LoadReport load_clip(torch::nn::Module& model, const std::string& tower, const std::filesystem::path& path,
                              weights::LoadOptions options);
}  // namespace detail

template <class M>
concept CLIPModule = std::is_base_of_v<CLIPModelImpl, M> || std::is_base_of_v<CLIPVisionModelImpl, M> ||
                     std::is_base_of_v<CLIPTextModelImpl, M>;

/// Loads a Hugging Face CLIP's weights at `path` (a model directory, a .safetensors file, a sharded
/// index or a torch.save state_dict: weights::read) into `model`. A tower loads its own file
/// (transformers 5's names: `embeddings.class_embedding`, ...; transformers 4's, under
/// `vision_model.` or `text_model.`) or a whole CLIPModel's, the other tower's tensors reported
/// unexpected. A tower's file into a CLIPModel is an Error saying so. Otherwise `options.strict`
/// holds as in weights::load.
template <CLIPModule M>
weights::LoadReport load_pretrained(M& model, const std::filesystem::path& path, weights::LoadOptions options = {}) {
  const char* tower = std::is_base_of_v<CLIPVisionModelImpl, M> ? "vision_model."
                      : std::is_base_of_v<CLIPTextModelImpl, M> ? "text_model."
                                                                : "";
  return detail::load_clip(model, tower, path, std::move(options));
}

/// Writes `model` to `dir` as a model directory that transformers' from_pretrained of the same
/// class loads with no missing or unexpected key: config.json, model.safetensors, `options.files`
/// (preprocessor_config.json, the tokenizer's files) copied beside them.
template <CLIPModule M>
void save_pretrained(const M& model, const std::filesystem::path& dir, const SavePretrainedOptions& options = {}) {
  const char* architecture = std::is_base_of_v<CLIPModelImpl, M>         ? "CLIPModel"
                             : std::is_base_of_v<CLIPVisionModelImpl, M> ? "CLIPVisionModel"
                                                                         : "CLIPTextModel";
  detail::write_pretrained(model, dir, model.config.to_json(), architecture, options);
}

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/clip.ipp>
#endif
