// SPDX-License-Identifier: Apache-2.0
// A Dataset with a size but no get_batch(indices), and no train() split.
// Expected: "Dataset must model dtrain::data::RandomAccess ... or dtrain::data::Splits".

#include <dtrain/dtrain.hpp>
#include <dtrain/data.hpp>
#include <torch/nn/modules/container/sequential.h>

struct Images {
  std::int64_t size() const { return 0; }
  torch::Tensor get(std::int64_t i) const;  // dtrain asks for get_batch(indices)
};

void declare() {
  dtrain::Trainer<torch::nn::Sequential, Images> trainer;
  (void)trainer;
}
