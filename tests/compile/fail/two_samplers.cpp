// SPDX-License-Identifier: Apache-2.0
// Two Sampler policies.
// Expected: "two Sampler policies given; keep exactly one".

#include <dtrain/dtrain.hpp>
#include <torch/nn/modules/container/sequential.h>

void declare() {
  dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist, dtrain::sampler::distributed<>,
                  dtrain::sampler::sequential>
      trainer;
  (void)trainer;
}
