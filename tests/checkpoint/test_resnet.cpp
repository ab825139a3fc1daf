// SPDX-License-Identifier: Apache-2.0
// examples/resnet.hpp against torchvision: /usr/bin/python3 (python3-torchvision) builds resnet18
// with the small-image stem (3x3 stride-1 conv1, no max-pool) and random weights and BatchNorm
// statistics, saves its state_dict; the C++ ResNet-18 loads it strictly by name (every name is
// torchvision's) and its eval outputs agree within 1e-5.

#include "../dtrain_catch.hpp"
#include "../run_command.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

#include <torch/torch.h>

#include <dtrain/weights.hpp>

#include "../../examples/resnet.hpp"

namespace fs = std::filesystem;

TEST_CASE("ResNet-18 of examples/resnet.hpp loads torchvision's resnet18 state_dict and computes its outputs") {
  std::random_device rd;
  const auto dir = fs::temp_directory_path() / ("dtrain_resnet_" + std::to_string(rd()) + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string script =
      "import sys, os, torch, torchvision\n"
      "from torch import nn\n"
      "d = sys.argv[1]\n"
      "torch.manual_seed(0)\n"
      "m = torchvision.models.resnet18(num_classes=10)\n"
      "m.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)\n"
      "m.maxpool = nn.Identity()\n"
      "with torch.no_grad():\n"
      "    for mod in m.modules():\n"
      "        if isinstance(mod, nn.BatchNorm2d):\n"
      "            mod.weight.uniform_(0.5, 1.5); mod.bias.uniform_(-0.2, 0.2)\n"
      "            mod.running_mean.uniform_(-0.2, 0.2); mod.running_var.uniform_(0.5, 2.0)\n"
      "            mod.num_batches_tracked.fill_(3)\n"
      "m.eval()\n"
      "torch.save(m.state_dict(), os.path.join(d, \"resnet18.pt\"))\n"
      "x = torch.randn(2, 3, 32, 32)\n"
      "torch.save({\"x\": x, \"y\": m(x).detach()}, os.path.join(d, \"io.pt\"))\n"
      "print(len(m.state_dict()))\n";
  const auto [status, out] = dtrain_test::run_command(std::string(PYTHON3) + " -c '" + script + "' '" + dir.string() + "'");
  INFO(out);
  REQUIRE(status == 0);

  resnet::ResNet net(resnet::Options{.width = 64, .num_classes = 10});
  const auto report = dtrain::weights::load_python_state_dict(*net, dir / "resnet18.pt");  // strict
  CHECK(report.complete());
  CHECK(std::to_string(report.loaded) + "\n" == out);  // every tensor of torchvision's state_dict
  net->eval();
  std::map<std::string, torch::Tensor> io;
  for (auto& [k, v] : dtrain::weights::read_python_state_dict(dir / "io.pt")) io[k] = v;
  torch::NoGradGuard no_grad;
  const auto y = net->forward(io.at("x"));
  CHECK(torch::allclose(y, io.at("y"), /*rtol=*/0, /*atol=*/1e-5));
  INFO("max difference " << (y - io.at("y")).abs().max().item<double>());
  CHECK((y - io.at("y")).abs().max().item<double>() <= 1e-5);

  // The width parameter scales every stage: width 16 has 1/16 of the convolution weights.
  resnet::ResNet small(resnet::Options{.width = 16, .num_classes = 10, .in_channels = 1});
  CHECK(small->named_parameters()["layer4.1.conv2.weight"].sizes() == torch::IntArrayRef{128, 128, 3, 3});
  CHECK(small->named_parameters()["conv1.weight"].sizes() == torch::IntArrayRef{16, 1, 3, 3});
  CHECK(small->forward(torch::randn({2, 1, 28, 28})).sizes() == torch::IntArrayRef{2, 10});
  fs::remove_all(dir);
}
