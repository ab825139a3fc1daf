// SPDX-License-Identifier: Apache-2.0
// Individually valid policies that cannot work together: fp16 autocast needs CUDA, Gloo is CPU.
// Expected: "precision::amp<fp16> needs CUDA autocast ... Use precision::amp<bf16> on CPU".

#include <dtrain/dtrain.hpp>
#include <torch/nn/modules/container/sequential.h>

void declare() {
  dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist, dtrain::backend::gloo,
                  dtrain::precision::amp<dtrain::precision::fp16>>
      trainer;
  (void)trainer;
}
