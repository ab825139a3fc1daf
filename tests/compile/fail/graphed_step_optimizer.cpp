// SPDX-License-Identifier: Apache-2.0
// ctx.graphed_step with an optimizer whose step cannot be captured (RMSprop keeps its step count on
// the host): rejected with the message naming the optimizers it captures.
// Expected: "ctx.graphed_step captures torch::optim::SGD, Adam and AdamW".

#include <dtrain/dtrain.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/rmsprop.h>

dtrain::Result fit() {
  using Trainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist>;
  Trainer trainer;
  return trainer.fit([](Trainer::context& ctx) {
    auto model = ctx.prepare_model(torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(784, 10)));
    torch::optim::RMSprop opt(model->parameters());
    auto step = ctx.graphed_step(opt, [&](const torch::Tensor& x, const torch::Tensor& y) {
      return torch::nn::functional::cross_entropy(model->forward(x), y);
    });
    (void)step;
  });
}
