// SPDX-License-Identifier: Apache-2.0
// Two Strategy policies: two instances of one template are two policies of one category.
// Expected: "two Strategy policies given; keep exactly one".

#include <dtrain/dtrain.hpp>
#include <torch/nn/modules/container/sequential.h>

void declare() {
  dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist, dtrain::strategy::ddp<>,
                  dtrain::strategy::ddp<1024>>
      trainer;
  (void)trainer;
}
