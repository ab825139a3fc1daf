// SPDX-License-Identifier: Apache-2.0
// The README's example: an MLP on Fashion-MNIST with 2 worker processes.
#include <dtrain/dtrain.hpp>

#include <iostream>

#include <torch/torch.h>

using Trainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist,
                                dtrain::backend::gloo,           // collectives (CPU: TCP, shared memory)
                                dtrain::sampler::distributed<>,  // seeded shuffle, re-drawn per epoch
                                dtrain::strategy::ddp<>>;        // bucketed allreduce overlapped with backward

int main() try {
  const auto data = dtrain::data::FashionMnist::load();  // before fit(): the driver loads it once
  Trainer trainer({.num_workers = 2}, {.storage_path = "dtrain_runs", .name = "quickstart"});
  auto result = trainer.fit([&](Trainer::context& ctx) {  // once per worker process
    using namespace torch::nn;
    auto model = ctx.prepare_model(Sequential(Flatten(), Linear(784, 256), ReLU(), Linear(256, 10)));
    torch::optim::Adam adam(model->parameters(), 1e-3);
    for (auto epoch : ctx.epochs(2)) {
      double loss_sum = 0;
      std::int64_t batches = 0;
      for (auto batch : ctx.shard(data.train(), /*global batch*/ 128)) {
        adam.zero_grad();
        auto loss = functional::cross_entropy(model->forward(batch.data), batch.target);
        ctx.backward(loss);  // gradients averaged over the workers
        ctx.step(adam);
        loss_sum += loss.item<double>();
        ++batches;
      }
      ctx.report({{"epoch", epoch}, {"loss", ctx.all_reduce(loss_sum / batches)}});
    }
  });
  // Only the driver gets here.
  std::cout << "epochs: " << result.metrics_history.size()
            << ", final loss: " << result.metrics.at("loss").number() << '\n';
} catch (const dtrain::Error& e) {  // bad input, a failed run, or a stop (Ctrl-C): says what to do
  std::cerr << e.what() << '\n';
  return 1;
}
