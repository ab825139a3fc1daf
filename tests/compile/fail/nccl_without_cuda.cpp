// SPDX-License-Identifier: Apache-2.0
// backend::nccl in a build whose LibTorch has no CUDA (or no NCCL headers): rejected where the
// Trainer is declared. Expected: "backend::nccl needs a LibTorch built with CUDA and NCCL".

#undef DTRAIN_WITH_CUDA
#define DTRAIN_WITH_CUDA 0  // as a CPU-only LibTorch build has it, even on a machine with CUDA
#include <dtrain/dtrain.hpp>
#include <torch/nn/modules/container/sequential.h>

void declare() {
  dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist, dtrain::backend::nccl,
                  dtrain::precision::amp<dtrain::precision::fp16>>
      trainer;
  (void)trainer;
}
