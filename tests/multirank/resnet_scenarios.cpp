// SPDX-License-Identifier: Apache-2.0
// torchvision's ResNet-18 (nn::resnet18, random weights, 3 classes) trained for 2 steps on 2
// workers, 2 images of 3x64x64 each per step, under ddp<>, fsdp<> (a unit per residual block) and
// amp<bf16> (issue 27); what it prints: model_scenarios.hpp (its checksum includes the BatchNorm
// running statistics: the eval-mode logits read them, and under ddp<> the buffers themselves).
//   resnet_scenarios ddp|fsdp|amp STORAGE

#include "model_scenarios.hpp"

#include <dtrain/nn/resnet.hpp>

int main(int argc, char** argv) {
  auto gen = at::detail::createCPUGenerator(11);
  return model_scenarios::main_of<dtrain::nn::ResNet>(argc, argv, {
      .program = "resnet_scenarios",
      .make = [] { return dtrain::nn::resnet18(3); },
      .data = {at::randn({8, 3, 64, 64}, gen), at::arange(8) % 3},  // labels 0..2
      .global_batch = 4});
}
