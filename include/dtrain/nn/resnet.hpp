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
  void validate() const {
    const auto fail = [](const std::string& what) { throw ConfigError("nn::ResNetConfig: " + what); };
    if (block != "basic" && block != "bottleneck") fail("block must be \"basic\" or \"bottleneck\", got \"" + block + "\"");
    if (layers.size() != 4) fail("layers must list 4 stages, got " + std::to_string(layers.size()));
    for (auto n : layers)
      if (n < 1) fail("every stage needs at least one block, got " + std::to_string(n));
    if (num_classes < 1) fail("num_classes must be positive, got " + std::to_string(num_classes));
    if (groups < 1 || width_per_group < 1) fail("groups and width_per_group must be positive");
    if (stem != "imagenet" && stem != "small") fail("stem must be \"imagenet\" or \"small\", got \"" + stem + "\"");
    if (in_channels < 1) fail("in_channels must be positive (3 for colour images, 1 for grey), got " + std::to_string(in_channels));
    if (width < 1) fail("width must be positive (64 is torchvision's), got " + std::to_string(width));
    if (block == "basic" && (groups != 1 || width_per_group != 64))
      fail("BasicBlock only supports groups=1 and width_per_group=64 (as torchvision); use block \"bottleneck\"");
    if (block == "basic" && (replace_stride_with_dilation[0] || replace_stride_with_dilation[1] || replace_stride_with_dilation[2]))
      fail("dilation > 1 is not supported in BasicBlock (as torchvision); use block \"bottleneck\"");
  }
};

inline void to_json(nlohmann::json& j, const ResNetConfig& c) {
  j = {{"block", c.block}, {"layers", c.layers}, {"num_classes", c.num_classes},
       {"zero_init_residual", c.zero_init_residual}, {"groups", c.groups}, {"width_per_group", c.width_per_group},
       {"replace_stride_with_dilation", c.replace_stride_with_dilation}, {"stem", c.stem},
       {"in_channels", c.in_channels}, {"width", c.width}};
}

inline void from_json(const nlohmann::json& j, ResNetConfig& c) {
  if (!j.is_object()) throw ConfigError("nn::ResNetConfig: a JSON object is needed, got " + std::string(j.type_name()));
  ResNetConfig r;
  const auto read = [&](const std::string& key, auto& field) {
    if (!j.contains(key)) return;
    try {
      field = j.at(key).get<std::decay_t<decltype(field)>>();
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError("nn::ResNetConfig: \"" + key + "\" is " + j.at(key).dump() + ": " + e.what());
    }
  };
  read("block", r.block);
  read("layers", r.layers);
  read("num_classes", r.num_classes);
  read("zero_init_residual", r.zero_init_residual);
  read("groups", r.groups);
  read("width_per_group", r.width_per_group);
  read("replace_stride_with_dilation", r.replace_stride_with_dilation);
  read("stem", r.stem);
  read("in_channels", r.in_channels);
  read("width", r.width);
  r.validate();
  c = std::move(r);
}

namespace detail {

/// torchvision's conv3x3 (padding = dilation) and conv1x1: no bias.
inline torch::nn::Conv2d resnet_conv(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride = 1,
                                     std::int64_t groups = 1, std::int64_t dilation = 1) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel)
                               .stride(stride)
                               .padding(kernel == 3 ? dilation : 0)
                               .dilation(dilation)
                               .groups(groups)
                               .bias(false));
}

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
                 torch::nn::Sequential downsample_ = nullptr)
      : conv1(register_module("conv1", detail::resnet_conv(inplanes, planes, 3, stride))),
        bn1(register_module("bn1", BatchNorm2d(planes))),
        conv2(register_module("conv2", detail::resnet_conv(planes, planes, 3))),
        bn2(register_module("bn2", BatchNorm2d(planes))) {
    if (downsample_) downsample = register_module("downsample", std::move(downsample_));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = at::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return at::relu(y + (downsample ? downsample->forward(x) : x));
  }

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
                 std::int64_t dilation = 1)
      : conv1(register_module("conv1", detail::resnet_conv(inplanes, width(planes, groups, base_width), 1))),
        bn1(register_module("bn1", BatchNorm2d(width(planes, groups, base_width)))),
        conv2(register_module("conv2", detail::resnet_conv(width(planes, groups, base_width),
                                                           width(planes, groups, base_width), 3, stride, groups, dilation))),
        bn2(register_module("bn2", BatchNorm2d(width(planes, groups, base_width)))),
        conv3(register_module("conv3", detail::resnet_conv(width(planes, groups, base_width), planes * expansion, 1))),
        bn3(register_module("bn3", BatchNorm2d(planes * expansion))) {
    if (downsample_) downsample = register_module("downsample", std::move(downsample_));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = at::relu(bn1(conv1(x)));
    y = at::relu(bn2(conv2(y)));
    y = bn3(conv3(y));
    return at::relu(y + (downsample ? downsample->forward(x) : x));
  }

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
  explicit ResNetImpl(const Config& c = {}) : config(c) {
    config.validate();
    const bool bottleneck = c.block == "bottleneck";
    const std::int64_t expansion = bottleneck ? BottleneckImpl::expansion : BasicBlockImpl::expansion;
    const bool small = c.stem == "small";
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(c.in_channels, c.width, small ? 3 : 7)
                                                           .stride(small ? 1 : 2)
                                                           .padding(small ? 1 : 3)
                                                           .bias(false)));
    bn1 = register_module("bn1", BatchNorm2d(c.width));
    // torchvision's _make_layer, stage by stage.
    std::int64_t inplanes = c.width, dilation = 1;
    std::array<torch::nn::Sequential*, 4> stages = {&layer1, &layer2, &layer3, &layer4};
    for (std::size_t s = 0; s < 4; ++s) {
      const std::int64_t planes = c.width << s;
      std::int64_t stride = s == 0 ? 1 : 2;
      const std::int64_t previous_dilation = dilation;
      if (s > 0 && c.replace_stride_with_dilation[s - 1]) {
        dilation *= stride;
        stride = 1;
      }
      torch::nn::Sequential stage;
      torch::nn::Sequential down{nullptr};
      if (stride != 1 || inplanes != planes * expansion) down = detail::resnet_downsample(inplanes, planes * expansion, stride);
      if (bottleneck) stage->push_back(Bottleneck(inplanes, planes, stride, down, c.groups, c.width_per_group, previous_dilation));
      else stage->push_back(BasicBlock(inplanes, planes, stride, down));
      inplanes = planes * expansion;
      for (std::int64_t b = 1; b < c.layers[s]; ++b) {
        if (bottleneck) stage->push_back(Bottleneck(inplanes, planes, 1, nullptr, c.groups, c.width_per_group, dilation));
        else stage->push_back(BasicBlock(inplanes, planes));
      }
      *stages[s] = register_module("layer" + std::to_string(s + 1), stage);
    }
    fc = register_module("fc", torch::nn::Linear((c.width << 3) * expansion, c.num_classes));
    // torchvision's initialisation: Kaiming-normal (fan_out, relu) convolutions, BatchNorm weight 1
    // and bias 0 (LibTorch's own), fc as nn.Linear; zero_init_residual zeroes each block's last
    // BatchNorm weight.
    torch::NoGradGuard no_grad;
    for (auto& m : modules(/*include_self=*/false))
      if (auto* conv = m->as<torch::nn::Conv2dImpl>()) torch::nn::init::kaiming_normal_(conv->weight, 0, torch::kFanOut, torch::kReLU);
    if (c.zero_init_residual)
      for (auto& m : modules(/*include_self=*/false)) {
        if (auto* b = m->as<BottleneckImpl>()) b->bn3->weight.zero_();
        if (auto* b = m->as<BasicBlockImpl>()) b->bn2->weight.zero_();
      }
  }

  torch::Tensor features(const torch::Tensor& x) {
    if (x.dim() != 4 || x.size(1) != config.in_channels)
      throw ConfigError("nn::ResNet: images must be [batch, " + std::to_string(config.in_channels) +
                        ", height, width] (in_channels), got " + c10::str(x.sizes()));
    auto y = at::relu(bn1(conv1(x)));
    if (config.stem == "imagenet") y = at::max_pool2d(y, {3, 3}, {2, 2}, {1, 1});
    y = layer4->forward(layer3->forward(layer2->forward(layer1->forward(y))));
    return at::flatten(at::adaptive_avg_pool2d(y, {1, 1}), 1);
  }

  torch::Tensor forward(const torch::Tensor& x) { return fc(features(x)); }

  /// Every BatchNorm reduces its batch statistics over the workers with `reduce` while training
  /// (SyncBatchNorm, nn/batchnorm.hpp); an empty function turns it off again.
  void sync_batchnorm(ReduceSum reduce) {
    auto shared = reduce ? std::make_shared<const ReduceSum>(std::move(reduce)) : nullptr;
    for (auto& m : modules(/*include_self=*/false))
      if (auto* bn = m->as<BatchNorm2dImpl>()) bn->sync(shared);
  }

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
inline ResNet resnext50_32x4d(std::int64_t num_classes = 1000) {
  auto c = ResNetConfig::bottleneck({3, 4, 6, 3}, num_classes);
  c.groups = 32;
  c.width_per_group = 4;
  return ResNet(c);
}
inline ResNet wide_resnet50_2(std::int64_t num_classes = 1000) {
  auto c = ResNetConfig::bottleneck({3, 4, 6, 3}, num_classes);
  c.width_per_group = 128;
  return ResNet(c);
}

/// Loads torchvision weights at `path` (a torch.save state_dict, safetensors: weights::read) into
/// `model` for fine-tuning: as weights::load, strict by default, except that a file whose `fc`
/// has another number of classes than the model's, or no fc at all (a backbone), leaves the
/// model's fc as it is (its initialisation) and reports fc.weight and fc.bias missing. Any other
/// missing or unexpected name, or another shape, is an Error listing them (a resnet18 file into a
/// resnet34, an ImageNet stem's 7x7 conv1.weight into a small stem's 3x3).
inline weights::LoadReport load_pretrained(ResNetImpl& model, const std::filesystem::path& path,
                                           weights::LoadOptions options = {}) {
  auto state = weights::read(path);
  const auto source = weights::detail::weights_format(path).second.string();
  const auto fc = std::find_if(state.begin(), state.end(), [&](const auto& kv) {
    return kv.first == options.prefix + "fc.weight" || (options.prefix.empty() && kv.first == "module.fc.weight");
  });
  if (fc != state.end() && fc->second.sizes() == model.fc->weight.sizes())
    return weights::load_state_dict(model, std::move(state), source, options);
  // Another head or none: the model's own fc stands in for the file's, so that the rest loads as asked.
  const bool ddp = options.prefix.empty() && !state.empty() &&
                   std::all_of(state.begin(), state.end(), [](const auto& kv) { return kv.first.starts_with("module."); });
  const auto prefix = fc != state.end() ? fc->first.substr(0, fc->first.size() - std::string("fc.weight").size())
                                        : (ddp ? std::string("module.") : options.prefix);
  std::erase_if(state, [&](const auto& kv) { return kv.first == prefix + "fc.weight" || kv.first == prefix + "fc.bias"; });
  state.emplace_back(prefix + "fc.weight", model.fc->weight.detach());
  state.emplace_back(prefix + "fc.bias", model.fc->bias.detach());
  auto report = weights::load_state_dict(model, std::move(state), source, options);
  report.loaded -= 2;
  report.missing.insert(report.missing.end(), {"fc.weight", "fc.bias"});
  return report;
}

/// load_pretrained of a model handle (nn::ResNet, nn::resnet18(), ...).
inline weights::LoadReport load_pretrained(ResNet& model, const std::filesystem::path& path, weights::LoadOptions options = {}) {
  return load_pretrained(*model, path, std::move(options));
}

}  // namespace nn

DTRAIN_NAMESPACE_END
