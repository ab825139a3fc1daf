// SPDX-License-Identifier: Apache-2.0
// nn/resnet.hpp: ResNetConfig (JSON, refusals), parameter and buffer names that are torchvision's,
// strict loads that fail when the depth or the classes differ; and, through the Python environment
// of scripts/python-env (tests/unit/resnet_reference.py), torchvision's resnet18, resnet34, resnet50
// and resnet18 with the small-image stem (conv1 3x3 stride 1, maxpool an nn.Identity(), as the image
// workload uses it) state_dicts (torch.save and safetensors) loading strictly and computing what torchvision
// computes in eval and train mode (running statistics included), and dtrain's model.pt and
// safetensors loading strictly back into torchvision with equal outputs.

#include "../dtrain_catch.hpp"
#include "../run_command.hpp"
#include "support.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <dtrain/checkpointer/files.hpp>
#include <dtrain/checkpointer/model_config.hpp>
#include <dtrain/checkpointer/python_format.hpp>
#include <dtrain/nn/resnet.hpp>
#include <dtrain/weights.hpp>

namespace fs = std::filesystem;
namespace nn = dtrain::nn;
namespace weights = dtrain::weights;

static_assert(dtrain::checkpointer::DescribedModel<nn::ResNet>);

namespace {

struct Dir {
  fs::path path;
  Dir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("dtrain_resnet_" + std::to_string(rd()) + std::to_string(getpid()));
    fs::create_directories(path);
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& n) const { return path / n; }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

using State = std::vector<std::pair<std::string, torch::Tensor>>;

/// Parameters and buffers by name, as a state_dict holds them.
State state_of(torch::nn::Module& m) {
  State s;
  for (const auto& p : m.named_parameters()) s.emplace_back(p.key(), p.value().detach().clone());
  for (const auto& b : m.named_buffers()) s.emplace_back(b.key(), b.value().clone());
  return s;
}

std::map<std::string, std::vector<std::int64_t>> shapes_of(torch::nn::Module& m) {
  std::map<std::string, std::vector<std::int64_t>> out;
  for (const auto& [k, v] : state_of(m)) out[k] = v.sizes().vec();
  return out;
}

nn::ResNet build(const std::string& arch, std::int64_t classes) {
  if (arch == "resnet18") return nn::resnet18(classes);
  if (arch == "resnet18_small") {  // resnet_reference.py's: conv1 3x3 stride 1, no max-pool
    auto c = nn::ResNetConfig::basic({2, 2, 2, 2}, classes);
    c.stem = "small";
    return nn::ResNet(c);
  }
  if (arch == "resnet34") return nn::resnet34(classes);
  if (arch == "resnet50") return nn::resnet50(classes);
  if (arch == "resnet101") return nn::resnet101(classes);
  if (arch == "resnet152") return nn::resnet152(classes);
  if (arch == "resnext50_32x4d") return nn::resnext50_32x4d(classes);
  if (arch == "wide_resnet50_2") return nn::wide_resnet50_2(classes);
  FAIL("unknown architecture " << arch);
  return nullptr;
}

/// The classes resnet_reference.py gives each architecture (CLASSES there).
std::int64_t classes_of(const std::string& arch) {
  return arch == "resnet18" ? 1000 : arch == "resnet34" || arch == "resnet18_small" ? 10 : 7;
}

using dtrain_test::max_diff;

/// Runs tests/unit/resnet_reference.py with the Python of scripts/python-env.
dtrain_test::CommandResult reference(const std::string& args) {
  return dtrain_test::run_command(std::string(DTRAIN_VENV_PYTHON) + " " + DTRAIN_RESNET_REFERENCE + " " + args);
}

/// resnet_reference.py make: torchvision's weights, the images and its outputs, in `dir`.
void make_reference(const Dir& dir) {
  const auto r = reference("make " + dir.path.string());
  INFO(r.output);
  std::cout << r.output;
  REQUIRE(r.status == 0);
}

std::map<std::string, torch::Tensor> read_all(const fs::path& file) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [k, v] : weights::read(file)) out[k] = v.clone();
  return out;
}

constexpr double kTolerance = 1e-5;

}  // namespace

TEST_CASE("resnet_config_round_trips_and_refuses_what_torchvision_refuses", "[nn]") {
  auto c = nn::ResNetConfig::bottleneck({3, 4, 6, 3}, 5);
  c.zero_init_residual = true;
  c.groups = 32;
  c.width_per_group = 4;
  c.replace_stride_with_dilation = {false, true, true};
  CHECK(nlohmann::json(c).get<nn::ResNetConfig>() == c);
  CHECK(nlohmann::json::object().get<nn::ResNetConfig>() == nn::ResNetConfig{});  // resnet18, 1000 classes
  CHECK(nlohmann::json(nn::resnet50(3)->config) ==
        nlohmann::json::parse(R"({"block": "bottleneck", "layers": [3, 4, 6, 3], "num_classes": 3,
                                  "zero_init_residual": false, "groups": 1, "width_per_group": 64,
                                  "replace_stride_with_dilation": [false, false, false], "stem": "imagenet",
                                  "in_channels": 3, "width": 64})"));
  const auto refused = [](const char* json) {
    return error_of([&] { nlohmann::json::parse(json).get<nn::ResNetConfig>(); });
  };
  CHECK_THAT(refused(R"({"block": "bottleneck", "groups": 32, "width_per_group": 4})"), Catch::Contains("(no error)"));
  CHECK_THAT(refused(R"({"block": "basic", "groups": 32})"), Catch::Contains("BasicBlock only supports groups=1"));
  CHECK_THAT(refused(R"({"replace_stride_with_dilation": [false, false, true]})"),
             Catch::Contains("dilation > 1 is not supported in BasicBlock"));
  CHECK_THAT(refused(R"({"block": "pyramid"})"), Catch::Contains("\"pyramid\""));
  CHECK_THAT(refused(R"({"layers": [2, 2, 2]})"), Catch::Contains("4 stages, got 3"));
  CHECK_THAT(refused(R"({"num_classes": "ten"})"), Catch::Contains("nn::ResNetConfig"));
  CHECK_THAT(refused("[]"), Catch::Contains("JSON object"));
  CHECK_THAT(refused(R"({"num_classes": "ten"})"), Catch::Contains("\"num_classes\" is \"ten\""));
  CHECK_THAT(refused(R"({"stem": "cifar"})"), Catch::Contains("stem must be \"imagenet\" or \"small\", got \"cifar\""));
  CHECK_THAT(refused(R"({"stem": 3})"), Catch::Contains("\"stem\" is 3"));
  CHECK_THAT(refused(R"({"in_channels": 0})"), Catch::Contains("in_channels must be positive"));
  CHECK_THAT(refused(R"({"width": -8})"), Catch::Contains("width must be positive"));
  CHECK_THAT(error_of([] { nn::ResNet(nn::ResNetConfig::basic({2, 0, 2, 2}, 10)); }), Catch::Contains("at least one block"));
  CHECK_THAT(error_of([] { nn::resnet18(4)(torch::zeros({1, 1, 32, 32})); }), Catch::Contains("[batch, 3, height, width]"));

  // The small-image stem (conv1 3x3 stride 1, no max-pool), grey images and a width: the names stay
  // torchvision's, every stage scales with the width, and 28x28 images keep their resolution in layer1.
  auto small = nn::ResNetConfig::basic({2, 2, 2, 2}, 10);
  small.stem = "small";
  small.in_channels = 1;
  small.width = 16;
  CHECK(nlohmann::json(small).get<nn::ResNetConfig>() == small);
  nn::ResNet grey(small);
  const auto shapes = shapes_of(*grey);
  CHECK(shapes.size() == 122);
  CHECK(shapes.at("conv1.weight") == std::vector<std::int64_t>{16, 1, 3, 3});
  CHECK(shapes.at("layer2.0.downsample.0.weight") == std::vector<std::int64_t>{32, 16, 1, 1});
  CHECK(shapes.at("layer4.1.conv2.weight") == std::vector<std::int64_t>{128, 128, 3, 3});
  CHECK(shapes.at("fc.weight") == std::vector<std::int64_t>{10, 128});
  CHECK(grey->layer1->forward(at::relu(grey->bn1(grey->conv1(torch::randn({2, 1, 28, 28}))))).sizes() ==
        std::vector<std::int64_t>{2, 16, 28, 28});
  CHECK(grey(torch::randn({2, 1, 28, 28})).sizes() == std::vector<std::int64_t>{2, 10});
  CHECK_THAT(error_of([&] { grey(torch::zeros({1, 3, 28, 28})); }), Catch::Contains("[batch, 1, height, width] (in_channels)"));

  // zero_init_residual: every block's last BatchNorm starts at weight 0 (and only those).
  auto z = nn::ResNetConfig::basic({2, 2, 2, 2}, 10);
  z.zero_init_residual = true;
  nn::ResNet zeroed(z);
  std::size_t zeroed_norms = 0;
  for (const auto& p : zeroed->named_parameters()) {
    INFO(p.key());
    if (p.key().ends_with(".bn2.weight")) {
      CHECK(p.value().eq(0).all().item<bool>());
      ++zeroed_norms;
    } else if (p.key().ends_with("bn1.weight")) {
      CHECK(p.value().eq(1).all().item<bool>());
    }
  }
  CHECK(zeroed_norms == 8);
  // Dilation keeps the resolution of layer3 and layer4 (a 64x64 image: 8x8 features, not 2x2).
  auto d = nn::ResNetConfig::bottleneck({1, 1, 1, 2}, 10);
  d.replace_stride_with_dilation = {false, true, true};
  nn::ResNet dilated(d);
  dilated->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({1, 3, 64, 64});
  CHECK(dilated->layer4->forward(dilated->layer3->forward(dilated->layer2->forward(dilated->layer1->forward(
                  at::max_pool2d(at::relu(dilated->bn1(dilated->conv1(x))), {3, 3}, {2, 2}, {1, 1})))))
            .sizes() == std::vector<std::int64_t>{1, 2048, 8, 8});
  // torchvision's rule: a stage's first block keeps the previous stage's dilation.
  CHECK(dilated->layer4[0]->as<nn::BottleneckImpl>()->conv2->options.dilation()->at(0) == 2);
  CHECK(dilated->layer4[0]->as<nn::BottleneckImpl>()->conv2->options.stride()->at(0) == 1);
  CHECK(dilated->layer4[1]->as<nn::BottleneckImpl>()->conv2->options.dilation()->at(0) == 4);
}

TEST_CASE("resnet_names_are_torchvision_names", "[nn]") {
  auto r18 = shapes_of(*nn::resnet18());
  CHECK(r18.size() == 122);  // torchvision's resnet18().state_dict(): 62 parameters, 60 buffers
  CHECK(r18.at("conv1.weight") == std::vector<std::int64_t>{64, 3, 7, 7});
  CHECK(r18.at("bn1.num_batches_tracked").empty());
  CHECK(r18.at("layer1.1.bn2.running_var") == std::vector<std::int64_t>{64});
  CHECK(r18.at("layer2.0.downsample.0.weight") == std::vector<std::int64_t>{128, 64, 1, 1});
  CHECK(r18.at("layer2.0.downsample.1.running_mean") == std::vector<std::int64_t>{128});
  CHECK(r18.at("layer4.1.conv2.weight") == std::vector<std::int64_t>{512, 512, 3, 3});
  CHECK(r18.at("fc.weight") == std::vector<std::int64_t>{1000, 512});
  CHECK(!r18.count("layer1.0.downsample.0.weight"));
  CHECK(shapes_of(*nn::resnet34()).size() == 218);
  auto r50 = shapes_of(*nn::resnet50(7));
  CHECK(r50.size() == 320);
  CHECK(r50.at("layer1.0.downsample.0.weight") == std::vector<std::int64_t>{256, 64, 1, 1});
  CHECK(r50.at("layer3.5.conv3.weight") == std::vector<std::int64_t>{1024, 256, 1, 1});
  CHECK(r50.at("fc.weight") == std::vector<std::int64_t>{7, 2048});
  auto m = nn::resnet18();
  CHECK(m->bn1->running_mean.dtype() == torch::kFloat);
  CHECK(m->bn1->num_batches_tracked.dtype() == torch::kLong);
}

TEST_CASE("resnet_strict_load_fails_when_the_depth_or_the_classes_differ", "[nn]") {
  Dir dir;
  torch::manual_seed(1);
  auto r18 = nn::resnet18(10);
  weights::save_safetensors(dir / "resnet18.safetensors", state_of(*r18));
  const auto err = error_of([&] { weights::load(*nn::resnet34(10), dir / "resnet18.safetensors"); });
  CHECK_THAT(err, Catch::Contains("resnet18.safetensors") && Catch::Contains("strict") &&
                      Catch::Contains("missing from the file \"layer1.2.conv1.weight\""));
  auto r34 = nn::resnet34(10);
  weights::save_safetensors(dir / "resnet34.safetensors", state_of(*r34));
  CHECK_THAT(error_of([&] { weights::load(*nn::resnet18(10), dir / "resnet34.safetensors"); }),
             Catch::Contains("unexpected in the file \"layer1.2.bn1.bias\""));
  CHECK_THAT(error_of([&] { weights::load(*nn::resnet18(1000), dir / "resnet18.safetensors"); }),
             Catch::Contains("\"fc.weight\" has shape [10, 512]") && Catch::Contains("[1000, 512]"));
  CHECK_THAT(error_of([&] { weights::load(*nn::resnet50(10), dir / "resnet18.safetensors"); }), Catch::Contains("has shape"));
  // Non-strict: the 18-layer weights go into the first blocks of a 34, the rest reported missing.
  auto partial = nn::resnet34(10);
  const auto report = weights::load(*partial, dir / "resnet18.safetensors", {.strict = false});
  CHECK(report.loaded == 122);
  CHECK(report.missing.size() == 218 - 122);
  CHECK(report.unexpected.empty());
  CHECK(torch::equal(partial->layer1[1]->as<nn::BasicBlockImpl>()->conv1->weight,
                     r18->layer1[1]->as<nn::BasicBlockImpl>()->conv1->weight));
  // And a strict load of its own file is whole: every tensor equal.
  auto again = nn::resnet18(10);
  CHECK(weights::load(*again, dir / "resnet18.safetensors").loaded == 122);
  for (const auto& [k, v] : state_of(*again)) CHECK(torch::equal(v, r18->named_parameters().contains(k)
                                                                       ? r18->named_parameters()[k]
                                                                       : r18->named_buffers()[k]));
}

TEST_CASE("resnet_load_pretrained_keeps_a_new_head_and_is_strict_about_the_rest", "[nn]") {
  Dir dir;
  torch::manual_seed(2);
  auto imagenet = nn::resnet18();  // 1000 classes, as torchvision's published weights
  weights::save_safetensors(dir / "resnet18.safetensors", state_of(*imagenet));
  State ddp;  // a DDP wrapper's state_dict: every key under "module."
  for (auto& [k, v] : state_of(*imagenet)) ddp.emplace_back("module." + k, v);
  weights::save_safetensors(dir / "ddp.safetensors", ddp);
  for (const auto* file : {"resnet18.safetensors", "ddp.safetensors"}) {
    INFO(file);
    auto tuned = nn::resnet18(3);
    const auto head = tuned->fc->weight.clone();
    const auto report = nn::load_pretrained(tuned, dir / file);
    CHECK(report.loaded == 120);
    CHECK(report.missing == std::vector<std::string>{"fc.weight", "fc.bias"});
    CHECK(report.unexpected.empty());
    CHECK(torch::equal(tuned->fc->weight, head));  // the new head keeps its initialisation
    CHECK(torch::equal(tuned->layer4[1]->as<nn::BasicBlockImpl>()->conv2->weight,
                       imagenet->layer4[1]->as<nn::BasicBlockImpl>()->conv2->weight));
    CHECK(torch::equal(tuned->bn1->running_var, imagenet->bn1->running_var));
  }
  // A backbone (no fc in the file, as a user saves one without its classifier): the same.
  State headless;
  for (auto& [k, v] : state_of(*imagenet))
    if (!k.starts_with("fc.")) headless.emplace_back(k, v);
  weights::save_safetensors(dir / "backbone.safetensors", headless);
  auto backbone = nn::resnet18(3);
  const auto from_backbone = nn::load_pretrained(backbone, dir / "backbone.safetensors");
  CHECK(from_backbone.loaded == 120);
  CHECK(from_backbone.missing == std::vector<std::string>{"fc.weight", "fc.bias"});
  CHECK(torch::equal(backbone->layer4[1]->as<nn::BasicBlockImpl>()->conv2->weight,
                     imagenet->layer4[1]->as<nn::BasicBlockImpl>()->conv2->weight));
  // An ImageNet stem's weights into a small stem: refused, naming conv1.weight and both shapes.
  auto small = nn::ResNetConfig::basic({2, 2, 2, 2}, 3);
  small.stem = "small";
  CHECK_THAT(error_of([&] { nn::load_pretrained(*nn::ResNet(small), dir / "resnet18.safetensors"); }),
             Catch::Contains("\"conv1.weight\" has shape [64, 3, 7, 7]") && Catch::Contains("[64, 3, 3, 3]"));
  // The same classes: everything loads, the head too.
  auto same = nn::resnet18();
  CHECK(nn::load_pretrained(same, dir / "resnet18.safetensors").complete());
  CHECK(torch::equal(same->fc->weight, imagenet->fc->weight));
  // Anything else is still refused, strictly, naming the keys; and nothing is copied.
  auto deeper = nn::resnet34(3);
  const auto before = deeper->conv1->weight.clone();
  CHECK_THAT(error_of([&] { nn::load_pretrained(deeper, dir / "resnet18.safetensors"); }),
             Catch::Contains("missing from the file \"layer1.2.conv1.weight\"") && !Catch::Contains("\"fc.weight\""));
  CHECK(torch::equal(deeper->conv1->weight, before));
  CHECK_THAT(error_of([&] { nn::load_pretrained(*nn::resnet50(3), dir / "resnet18.safetensors"); }),
             Catch::Contains("has shape"));
}

TEST_CASE("resnet_names_and_shapes_equal_torchvision_for_every_depth", "[nn][python]") {
  Dir dir;
  const auto r = reference("names " + (dir / "names.json").string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  std::ifstream in(dir / "names.json");
  const auto theirs = nlohmann::json::parse(in);
  REQUIRE(theirs.size() == 7);
  for (const auto& [arch, tensors] : theirs.items()) {
    std::map<std::string, std::vector<std::int64_t>> expected;
    for (const auto& t : tensors) expected[t[0].get<std::string>()] = t[1].get<std::vector<std::int64_t>>();
    INFO(arch);
    const auto ours = shapes_of(*build(arch, 1000));
    CHECK(ours.size() == expected.size());
    CHECK(ours == expected);
  }
}

TEST_CASE("resnet_loads_torchvision_weights_and_matches_its_outputs", "[nn][python]") {
  Dir dir;
  make_reference(dir);
  const auto images = read_all(dir / "inputs.safetensors").at("images");
  for (const std::string arch : {"resnet18", "resnet34", "resnet50", "resnet18_small"}) {
    INFO(arch);
    const auto expected = read_all(dir / (arch + "_reference.safetensors"));
    // torch.save's pickle and safetensors, strictly: the same tensors.
    auto model = build(arch, classes_of(arch));
    const auto report = weights::load(*model, dir / (arch + ".pt"));
    CHECK(report.complete());
    auto from_safetensors = build(arch, classes_of(arch));
    CHECK(weights::load(*from_safetensors, dir / (arch + ".safetensors")).loaded == report.loaded);
    const auto a = state_of(*model), b = state_of(*from_safetensors);
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i].second, b[i].second));

    torch::NoGradGuard no_grad;
    // The same weights in fp64 against torchvision in fp64: equal but for rounding, whatever the
    // conditioning of the fp32 result.
    auto wide = build(arch, classes_of(arch));
    weights::load(*wide, dir / (arch + ".pt"));
    wide->to(torch::kDouble);
    wide->eval();
    const double eval64_diff = max_diff(wide(images.to(torch::kDouble)), expected.at("eval64"));
    wide->train();
    const double train64_diff = max_diff(wide(images.to(torch::kDouble)), expected.at("train64"));
    double stats64_diff = 0;
    for (const auto& buffer : wide->named_buffers())
      stats64_diff = std::max(stats64_diff, max_diff(buffer.value(), expected.at("after_train64." + buffer.key())));

    model->eval();
    const double eval_diff = max_diff(model(images), expected.at("eval"));
    model->train();
    const double train_diff = max_diff(model(images), expected.at("train"));
    double stats_diff = 0;
    std::size_t buffers = 0;
    for (const auto& buffer : model->named_buffers()) {
      stats_diff = std::max(stats_diff, max_diff(buffer.value(), expected.at("after_train." + buffer.key())));
      ++buffers;
    }
    std::cout << arch << ": largest absolute difference from torchvision, fp32: " << eval_diff << " (eval logits), "
              << train_diff << " (train logits), " << stats_diff << " (" << buffers
              << " buffers after the train-mode forward); fp64: " << eval64_diff << ", " << train64_diff << ", "
              << stats64_diff << std::endl;
    CHECK(eval_diff <= kTolerance);
    CHECK(train_diff <= kTolerance);
    CHECK(stats_diff <= kTolerance);
    CHECK(eval64_diff <= 1e-10);
    CHECK(train64_diff <= 1e-10);
    CHECK(stats64_diff <= 1e-10);
    CHECK(model->bn1->num_batches_tracked.item<std::int64_t>() == 8);  // 7 in the file, one forward
  }
}

TEST_CASE("resnet_saved_weights_load_strictly_in_torchvision", "[nn][python]") {
  Dir dir;
  make_reference(dir);
  const auto images = read_all(dir / "inputs.safetensors").at("images");
  std::vector<std::pair<std::string, fs::path>> saved;  // each architecture's two files
  std::string checks;                                   // resnet_reference.py check's arguments for them
  for (const std::string arch : {"resnet18", "resnet34", "resnet50", "resnet18_small"}) {
    INFO(arch);
    auto model = build(arch, classes_of(arch));
    weights::load(*model, dir / (arch + ".safetensors"));
    // One SGD step in train mode: the weights and running statistics written are dtrain's own.
    {
      model->train();
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01));
      const auto loss = torch::nn::functional::cross_entropy(model(images), torch::tensor({1, 2}));
      loss.backward();
      opt.step();
    }
    const auto step = arch + "_step";
    // model.pt as the checkpointer writes it (checkpointer/write.hpp), and save_safetensors.
    const auto pt = dir / (step + ".pt");
    dtrain::checkpointer::detail::write_file(
        pt, dtrain::checkpointer::detail::torch_save_bytes(c10::IValue(dtrain::checkpointer::detail::named_state(*model, true))));
    const auto st = dir / (step + ".safetensors");
    weights::save_safetensors(st, state_of(*model), {{"format", "pt"}});
    // What torchvision must compute from them: eval logits, then train logits and the buffers after.
    State outputs;
    {
      torch::NoGradGuard no_grad;
      model->eval();
      outputs.emplace_back("eval", model(images));
      model->train();
      outputs.emplace_back("train", model(images));
      for (const auto& buffer : model->named_buffers()) outputs.emplace_back("after_train." + buffer.key(), buffer.value().clone());
    }
    const auto out = dir / (step + "_outputs.safetensors");
    weights::save_safetensors(out, outputs);
    for (const auto& file : {pt, st}) {
      saved.emplace_back(arch, file);
      checks += " " + arch + " " + file.string() + " " + (dir / "inputs.safetensors").string() + " " + out.string();
    }
  }
  const auto r = reference("check" + checks);  // one Python process for the eight files
  INFO(r.output);
  std::cout << r.output;
  CHECK(r.status == 0);
  for (const auto& [arch, file] : saved) {
    INFO(arch << " " << file);
    CHECK_THAT(r.output, Catch::Contains(" checks, 0 failed (" + file.string() + ")") &&
                             Catch::Contains("ok   " + arch + " strict load"));
  }
}
