// SPDX-License-Identifier: Apache-2.0
// Two Precision policies.
// Expected: "two Precision policies given; keep exactly one".

#include <dtrain/dtrain.hpp>
#include <torch/nn/modules/container/sequential.h>

void declare() {
  dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist, dtrain::precision::fp32,
                  dtrain::precision::amp<dtrain::precision::bf16>>
      trainer;
  (void)trainer;
}
