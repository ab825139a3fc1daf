// SPDX-License-Identifier: Apache-2.0
// A policy of one's own that forgot its category is not a policy.
// Expected: "this argument is not a dtrain policy (it has no nested `using category = ...;`)".

#include <dtrain/dtrain.hpp>
#include <torch/nn/modules/container/sequential.h>

struct my_sampler {  // missing: using category = dtrain::category::sampler;
  static std::vector<std::int64_t> indices(std::int64_t n, int rank, int world, std::int64_t epoch);
};

void declare() {
  dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist, my_sampler> trainer;
  (void)trainer;
}
