// SPDX-License-Identifier: Apache-2.0
// A scheduler of one's own that lacks on_result: rejected with the Tuner's message naming the concept.
// Expected: "the scheduler must model dtrain::tune::Scheduler".

#include <dtrain/dtrain.hpp>
#include <dtrain/tune.hpp>
#include <torch/nn/modules/container/sequential.h>

struct half_scheduler {
  static constexpr const char* name = "half";
  nlohmann::json describe() const { return {}; }
};

void declare() {
  using Trainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist>;
  dtrain::tune::Tuner<Trainer, half_scheduler> tuner(Trainer{}, {}, {});
  (void)tuner;
}
