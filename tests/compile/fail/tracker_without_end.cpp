// SPDX-License-Identifier: Apache-2.0
// A Tracker policy of one's own that lacks end(RunRecord): rejected with the TrackerPolicy message.
// Expected: "the Tracker policy lacks".

#include <dtrain/dtrain.hpp>
#include <torch/nn/modules/container/sequential.h>

struct half_tracker {
  using category = dtrain::category::tracker;
  static constexpr const char* name = "half";
  static void start(const dtrain::tracking::RunRecord&) {}
};

void declare() {
  dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist, half_tracker> trainer;
  (void)trainer;
}
