// SPDX-License-Identifier: Apache-2.0
// A Model that looks like a network but does not derive from torch::nn::Module.
// Expected: "Model must be a torch::nn::Module subclass or its TORCH_MODULE holder".

#include <dtrain/dtrain.hpp>
#include <torch/nn/modules/container/sequential.h>

struct Net {  // missing: : torch::nn::Module
  torch::Tensor forward(torch::Tensor x) { return x; }
};

void declare() {
  dtrain::Trainer<Net, dtrain::data::FashionMnist> trainer;
  (void)trainer;
}
