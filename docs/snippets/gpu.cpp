// SPDX-License-Identifier: Apache-2.0
// docs/gpu.md's C++ block. It needs CUDA, NCCL and one GPU per worker: built where LibTorch has
// CUDA (tests/docs/CMakeLists.txt, DTRAIN_WITH_CUDA), and compiled on every machine against
// LibTorch 2.6's CUDA headers by scripts/check-cuda.

#include "snippets.hpp"

int main() {
  using snippets::Net;
  const auto data = dtrain::data::FashionMnist::load();
  // [gpu.md]
  using Trainer = dtrain::Trainer<Net, dtrain::data::FashionMnist,
                                  dtrain::backend::nccl,                               // one GPU per worker
                                  dtrain::precision::amp<dtrain::precision::fp16>>;    // autocast + loss scaling
  Trainer trainer({.num_workers = 4});  // one GPU per worker: backend::nccl decides
  trainer.fit([&](Trainer::context& ctx) {
    auto model = ctx.prepare_model(Net());                 // moved to cuda:LOCAL_RANK, DDP-wrapped
    torch::optim::SGD sgd(model->parameters(), 0.05);
    for (auto epoch : ctx.epochs(10))
      for (const auto& batch : ctx.shard(data.train(), 1024)) {  // already on the GPU, prefetched
        sgd.zero_grad();
        torch::Tensor loss;
        {
          auto autocast = ctx.autocast();                  // fp16 kernels where autocast chooses them
          loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
        }
        ctx.backward(loss);                                // scaled loss; buckets allreduced on NCCL's stream
        ctx.step(sgd);                                     // unscale, skip on inf/NaN, update the scale
      }
  });
  // [gpu.md]

  // [gpu.md graphed]
  using OneGpu = dtrain::Trainer<Net, dtrain::data::FashionMnist, dtrain::backend::nccl,
                                 dtrain::precision::amp<dtrain::precision::bf16>,  // bf16 or fp32: no loss scaling
                                 dtrain::checkpointer::directory<>>;
  OneGpu one_gpu({.num_workers = 1});
  one_gpu.fit([&](OneGpu::context& ctx) {
    auto model = ctx.prepare_model(Net());
    torch::optim::AdamW adamw(model->parameters(), 1e-3);  // SGD, Adam or AdamW
    dtrain::schedule::WarmupCosine schedule(adamw, {.warmup_steps = 100, .total_steps = 5000});
    auto step = ctx.graphed_step(adamw, [&](const torch::Tensor& x, const torch::Tensor& y) {
      auto autocast = ctx.autocast();
      return torch::nn::functional::cross_entropy(model->forward(x), y);  // forward only: returns the loss
    });
    for (auto epoch : ctx.epochs(10)) {
      for (const auto& batch : ctx.shard(data.train(), 1024)) {
        auto loss = step(batch.data, batch.target);  // forward, backward and AdamW's step: one graph launch
        schedule.step();                              // the new learning rate reaches the graph
      }
      ctx.report({{"epoch", epoch}, {"replays", step.replays()}}, ctx.checkpoint(model, adamw));
    }
  });
  // [gpu.md graphed]
}
