// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::ResNet: torchvision's ResNet (models/resnet.py) in C++, whose parameters and buffers are
// named as torchvision's state_dict names them (`conv1.weight`, `bn1.running_mean`,
// `layer1.0.conv1.weight`, `layer2.0.downsample.0.weight`, `layer2.0.downsample.1.num_batches_tracked`,
// `fc.bias`), so a state_dict Python saved (torch.save or safetensors) loads by name, strictly:
//
//   auto model = dtrain::nn::resnet50();                   // 1000 classes, torchvision's init
//   dtrain::weights::load(*model, "resnet50.pth");         // torchvision.models.resnet50().state_dict()
//   auto logits = model(images);                           // [batch, 3, H, W] -> [batch, 1000]
//
// One network over two block types, as torchvision: BasicBlock (two 3x3 convolutions; ResNet-18,
// -34) and Bottleneck (1x1, 3x3, 1x1 with 4x expansion; ResNet-50, -101, -152, ResNeXt and Wide
// ResNet through `groups` and `width_per_group`); the stride sits on the 3x3 convolution (V1.5).
// The stem is conv1 (7x7, stride 2), bn1, relu and a 3x3 max-pool of stride 2; then layer1..layer4
// (torch::nn::Sequential of blocks, so `layerS.N` is block N of stage S), average pooling, fc.
// For small images (CIFAR, Fashion-MNIST) `stem: "small"` is what torchvision users write
// (`model.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False); model.maxpool = nn.Identity()`):
// conv1 3x3 stride 1, no max-pool; the names stay torchvision's. `in_channels` (1 for grey images)
// and `width` (layer1's channels, 64 in torchvision; stage S has width * 2^(S-1)) size conv1 and
// the stages. BatchNorm2d is nn/batchnorm.hpp's (eps 1e-5, momentum 0.1, running statistics and
// num_batches_tracked), which computes what torch.nn.BatchNorm2d does in train and eval mode, and
// what torch.nn.SyncBatchNorm does after ResNet::sync_batchnorm(reduce). With the same weights and
// inputs the outputs, and the running statistics after a train-mode forward, equal torchvision's
// within 1e-5 in fp32 and 1e-10 in fp64 (tests/unit/resnet_test.cpp). The model describes itself (`Config config`),
// so dtrain's checkpoints rebuild it; a checkpoint's model.pt and weights::save_safetensors of
// named_parameters and named_buffers load back into torchvision with no missing key.
//
// nn::load_pretrained(model, path) is weights::load for fine-tuning: a file with another number of
// classes leaves the model's new fc as it is, and every other name still has to match.
//
// Under strategy::fsdp<sharding::full_shard, wrap::layers> each residual block is a unit
// (`layer1.0`, ..., `layer4.1`), and conv1, bn1 and fc one unit each.

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/nn/batchnorm.hpp>
#include <dtrain/weights.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// torchvision's ResNet arguments. Its JSON form has these names (a checkpoint's
/// model_config.json); a key left out keeps its default.
struct ResNetConfig {
  /// "basic" (BasicBlock, expansion 1) or "bottleneck" (Bottleneck, expansion 4).
  std::string block = "basic";
  /// Blocks per stage (layer1..layer4): {2, 2, 2, 2} is ResNet-18.
  std::vector<std::int64_t> layers = {2, 2, 2, 2};
  std::int64_t num_classes = 1000;
  /// The last BatchNorm of each block starts at weight 0, so each block starts as the identity.
  bool zero_init_residual = false;
  /// Bottleneck's grouped 3x3 convolution and its width (ResNeXt-50 32x4d: 32 and 4; Wide
  /// ResNet-50-2: 1 and 128). BasicBlock takes only 1 and 64.
  std::int64_t groups = 1;
  std::int64_t width_per_group = 64;
  /// layer2, layer3, layer4: replace the stage's stride 2 with dilation (Bottleneck only).
  std::array<bool, 3> replace_stride_with_dilation = {false, false, false};
  /// "imagenet" (conv1 7x7 stride 2 and a max-pool: torchvision's) or "small" (conv1 3x3 stride 1,
  /// no max-pool: for images of 32x32 or so, as torchvision users replace conv1 and maxpool).
  std::string stem = "imagenet";
  /// conv1's input channels: 3 for colour images, 1 for grey ones.
  std::int64_t in_channels = 3;
  /// layer1's channels (torchvision's 64); layer2..layer4 have 2, 4 and 8 times as many.
  std::int64_t width = 64;

  static ResNetConfig basic(std::vector<std::int64_t> layers, std::int64_t num_classes) {
    return {.block = "basic", .layers = std::move(layers), .num_classes = num_classes};
  }
  static ResNetConfig bottleneck(std::vector<std::int64_t> layers, std::int64_t num_classes) {
    return {.block = "bottleneck", .layers = std::move(layers), .num_classes = num_classes};
  }

  bool operator==(const ResNetConfig&) const = default;

  /// Throws ConfigError naming what torchvision would refuse.
  void validate() const;
};

void to_json(nlohmann::json& j, const ResNetConfig& c);

void from_json(const nlohmann::json& j, ResNetConfig& c);

namespace detail {

/// torchvision's conv3x3 (padding = dilation) and conv1x1: no bias.
torch::nn::Conv2d resnet_conv(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride = 1,
                              std::int64_t groups = 1, std::int64_t dilation = 1);

/// `downsample`: conv1x1 with the block's stride and a BatchNorm2d (`downsample.0`, `downsample.1`).
inline torch::nn::Sequential resnet_downsample(std::int64_t in, std::int64_t out, std::int64_t stride) {
  return torch::nn::Sequential(resnet_conv(in, out, 1, stride), BatchNorm2d(out));
}

}  // namespace detail

/// torchvision's BasicBlock: conv1 (3x3, stride), bn1, relu, conv2 (3x3), bn2, plus the input
/// (through `downsample` when the stride or the width changes), relu.
struct BasicBlockImpl : torch::nn::Module {
  static constexpr std::int64_t expansion = 1;
  BasicBlockImpl(std::int64_t inplanes, std::int64_t planes, std::int64_t stride = 1,
                 torch::nn::Sequential downsample_ = nullptr);

  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Conv2d conv1, conv2;
  BatchNorm2d bn1, bn2;
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

/// torchvision's Bottleneck (V1.5): conv1 (1x1), bn1, conv2 (3x3 with the stride, groups and
/// dilation), bn2, conv3 (1x1 to planes * 4), bn3, each but the last followed by relu; plus the
/// input (through `downsample`), relu. Its inner width is planes * width_per_group / 64 * groups.
struct BottleneckImpl : torch::nn::Module {
  static constexpr std::int64_t expansion = 4;
  BottleneckImpl(std::int64_t inplanes, std::int64_t planes, std::int64_t stride = 1,
                 torch::nn::Sequential downsample_ = nullptr, std::int64_t groups = 1, std::int64_t base_width = 64,
                 std::int64_t dilation = 1);

  torch::Tensor forward(const torch::Tensor& x);

  static std::int64_t width(std::int64_t planes, std::int64_t groups, std::int64_t base_width) {
    return planes * base_width / 64 * groups;  // int(planes * (base_width / 64.0)) * groups
  }

  torch::nn::Conv2d conv1, conv2, conv3;
  BatchNorm2d bn1, bn2, bn3;
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Bottleneck);

/// torchvision's ResNet: conv1, bn1, relu, max-pool, layer1..layer4, average pool, fc. forward
/// takes images [batch, 3, H, W] and returns logits [batch, num_classes]; features() returns the
/// pooled features [batch, 8 * width * expansion] that fc reads.
struct ResNetImpl : torch::nn::Module {
  using Config = ResNetConfig;
  explicit ResNetImpl(const Config& c = {});

  torch::Tensor features(const torch::Tensor& x);

  torch::Tensor forward(const torch::Tensor& x) { return fc(features(x)); }

  /// Every BatchNorm reduces its batch statistics over the workers with `reduce` while training
  /// (SyncBatchNorm, nn/batchnorm.hpp); an empty function turns it off again.
  void sync_batchnorm(ReduceSum reduce);

  Config config;
  torch::nn::Conv2d conv1{nullptr};
  BatchNorm2d bn1{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

/// torchvision.models.resnet18 ... resnet152, resnext50_32x4d and wide_resnet50_2 with random
/// weights (torchvision's initialisation; seed with torch::manual_seed).
inline ResNet resnet18(std::int64_t num_classes = 1000) { return ResNet(ResNetConfig::basic({2, 2, 2, 2}, num_classes)); }
inline ResNet resnet34(std::int64_t num_classes = 1000) { return ResNet(ResNetConfig::basic({3, 4, 6, 3}, num_classes)); }
inline ResNet resnet50(std::int64_t num_classes = 1000) { return ResNet(ResNetConfig::bottleneck({3, 4, 6, 3}, num_classes)); }
inline ResNet resnet101(std::int64_t num_classes = 1000) { return ResNet(ResNetConfig::bottleneck({3, 4, 23, 3}, num_classes)); }
inline ResNet resnet152(std::int64_t num_classes = 1000) { return ResNet(ResNetConfig::bottleneck({3, 8, 36, 3}, num_classes)); }
ResNet resnext50_32x4d(std::int64_t num_classes = 1000);
ResNet wide_resnet50_2(std::int64_t num_classes = 1000);

/// Loads torchvision weights at `path` (a torch.save state_dict, safetensors: weights::read) into
/// `model` for fine-tuning: as weights::load, strict by default, except that a file whose `fc`
/// has another number of classes than the model's, or no fc at all (a backbone), leaves the
/// model's fc as it is (its initialisation) and reports fc.weight and fc.bias missing. Any other
/// missing or unexpected name, or another shape, is an Error listing them (a resnet18 file into a
/// resnet34, an ImageNet stem's 7x7 conv1.weight into a small stem's 3x3).
weights::LoadReport load_pretrained(ResNetImpl& model, const std::filesystem::path& path,
                                    weights::LoadOptions options = {});

/// load_pretrained of a model handle (nn::ResNet, nn::resnet18(), ...).
inline weights::LoadReport load_pretrained(ResNet& model, const std::filesystem::path& path, weights::LoadOptions options = {}) {
  return load_pretrained(*model, path, std::move(options));
}

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/resnet.ipp>
#endif
