// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of resnet.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/nn/resnet.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {

DTRAIN_INLINE void ResNetConfig::validate() const {
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

DTRAIN_INLINE void to_json(nlohmann::json& j, const ResNetConfig& c) {
  j = {{"block", c.block}, {"layers", c.layers}, {"num_classes", c.num_classes},
       {"zero_init_residual", c.zero_init_residual}, {"groups", c.groups}, {"width_per_group", c.width_per_group},
       {"replace_stride_with_dilation", c.replace_stride_with_dilation}, {"stem", c.stem},
       {"in_channels", c.in_channels}, {"width", c.width}};
}

DTRAIN_INLINE void from_json(const nlohmann::json& j, ResNetConfig& c) {
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

DTRAIN_INLINE torch::nn::Conv2d resnet_conv(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride,
                                            std::int64_t groups, std::int64_t dilation) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel)
                               .stride(stride)
                               .padding(kernel == 3 ? dilation : 0)
                               .dilation(dilation)
                               .groups(groups)
                               .bias(false));
}
}  // namespace detail

DTRAIN_INLINE BasicBlockImpl::BasicBlockImpl(std::int64_t inplanes, std::int64_t planes, std::int64_t stride,
                                             torch::nn::Sequential downsample_)
    : conv1(register_module("conv1", detail::resnet_conv(inplanes, planes, 3, stride))),
      bn1(register_module("bn1", BatchNorm2d(planes))),
      conv2(register_module("conv2", detail::resnet_conv(planes, planes, 3))),
      bn2(register_module("bn2", BatchNorm2d(planes))) {
  if (downsample_) downsample = register_module("downsample", std::move(downsample_));
}

DTRAIN_INLINE torch::Tensor BasicBlockImpl::forward(const torch::Tensor& x) {
  auto y = at::relu(bn1(conv1(x)));
  y = bn2(conv2(y));
  return at::relu(y + (downsample ? downsample->forward(x) : x));
}

DTRAIN_INLINE BottleneckImpl::BottleneckImpl(std::int64_t inplanes, std::int64_t planes, std::int64_t stride,
               torch::nn::Sequential downsample_, std::int64_t groups, std::int64_t base_width,
                                             std::int64_t dilation)
    : conv1(register_module("conv1", detail::resnet_conv(inplanes, width(planes, groups, base_width), 1))),
      bn1(register_module("bn1", BatchNorm2d(width(planes, groups, base_width)))),
      conv2(register_module("conv2", detail::resnet_conv(width(planes, groups, base_width),
                                                         width(planes, groups, base_width), 3, stride, groups, dilation))),
      bn2(register_module("bn2", BatchNorm2d(width(planes, groups, base_width)))),
      conv3(register_module("conv3", detail::resnet_conv(width(planes, groups, base_width), planes * expansion, 1))),
      bn3(register_module("bn3", BatchNorm2d(planes * expansion))) {
  if (downsample_) downsample = register_module("downsample", std::move(downsample_));
}

DTRAIN_INLINE torch::Tensor BottleneckImpl::forward(const torch::Tensor& x) {
  auto y = at::relu(bn1(conv1(x)));
  y = at::relu(bn2(conv2(y)));
  y = bn3(conv3(y));
  return at::relu(y + (downsample ? downsample->forward(x) : x));
}

DTRAIN_INLINE ResNetImpl::ResNetImpl(const Config& c) : config(c) {
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

DTRAIN_INLINE torch::Tensor ResNetImpl::features(const torch::Tensor& x) {
  if (x.dim() != 4 || x.size(1) != config.in_channels)
    throw ConfigError("nn::ResNet: images must be [batch, " + std::to_string(config.in_channels) +
                      ", height, width] (in_channels), got " + c10::str(x.sizes()));
  auto y = at::relu(bn1(conv1(x)));
  if (config.stem == "imagenet") y = at::max_pool2d(y, {3, 3}, {2, 2}, {1, 1});
  y = layer4->forward(layer3->forward(layer2->forward(layer1->forward(y))));
  return at::flatten(at::adaptive_avg_pool2d(y, {1, 1}), 1);
}

DTRAIN_INLINE void ResNetImpl::sync_batchnorm(ReduceSum reduce) {
  auto shared = reduce ? std::make_shared<const ReduceSum>(std::move(reduce)) : nullptr;
  for (auto& m : modules(/*include_self=*/false))
    if (auto* bn = m->as<BatchNorm2dImpl>()) bn->sync(shared);
}

DTRAIN_INLINE ResNet resnext50_32x4d(std::int64_t num_classes) {
  auto c = ResNetConfig::bottleneck({3, 4, 6, 3}, num_classes);
  c.groups = 32;
  c.width_per_group = 4;
  return ResNet(c);
}

DTRAIN_INLINE ResNet wide_resnet50_2(std::int64_t num_classes) {
  auto c = ResNetConfig::bottleneck({3, 4, 6, 3}, num_classes);
  c.width_per_group = 128;
  return ResNet(c);
}

DTRAIN_INLINE weights::LoadReport load_pretrained(ResNetImpl& model, const std::filesystem::path& path,
                                                  weights::LoadOptions options) {
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
}  // namespace nn
DTRAIN_NAMESPACE_END
