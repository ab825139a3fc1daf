// SPDX-License-Identifier: Apache-2.0
// Two Backend policies, even differently configured ones.
// Expected: "two Backend policies given; keep exactly one".

#include <dtrain/dtrain.hpp>
#include <torch/nn/modules/container/sequential.h>

void declare() {
  dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist, dtrain::backend::gloo,
                  dtrain::backend::gloo_with_threads<4>>
      trainer;
  (void)trainer;
}
