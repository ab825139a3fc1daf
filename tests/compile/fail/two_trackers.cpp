// SPDX-License-Identifier: Apache-2.0
// Two Tracker policies: tracker::mlflow<> already writes tracker::directory's files.
// Expected: "more than one Tracker policy given; keep exactly one".

#include <dtrain/dtrain.hpp>
#include <torch/nn/modules/container/sequential.h>

void declare() {
  dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist, dtrain::tracker::directory,
                  dtrain::tracker::mlflow<>>
      trainer;
  (void)trainer;
}
