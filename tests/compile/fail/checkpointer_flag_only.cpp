// SPDX-License-Identifier: Apache-2.0
// A Checkpointer of one's own written as the old flag (`persists`) without a per-worker state: it
// used to get directory<>'s files silently; now it is rejected, naming the template to copy.
// Expected: "copy checkpointer::none::state as the template".

#include <dtrain/dtrain.hpp>
#include <torch/nn/modules/container/sequential.h>

struct flag_checkpointer {
  using category = dtrain::category::checkpointer;
  static constexpr bool persists = true;
};

void declare() {
  dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist, flag_checkpointer> trainer;
  (void)trainer;
}
