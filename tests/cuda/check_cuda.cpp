// SPDX-License-Identifier: Apache-2.0
// The whole CUDA path, instantiated: compiled with -fsyntax-only by scripts/check-cuda against
// LibTorch 2.6's CUDA headers (Debian trixie's libtorch-cuda-dev) and the CUDA/NCCL headers, on a
// machine without a GPU. Nothing here runs; tests/gpu runs the same code on a GPU.

#include <dtrain/all.hpp>

#include <torch/torch.h>

static_assert(DTRAIN_WITH_CUDA, "check_cuda.cpp must see LibTorch's CUDA headers, cuda_runtime_api.h and nccl.h");
static_assert(dtrain::backend::nccl::available);
static_assert(dtrain::BackendPolicy<dtrain::backend::nccl>);
static_assert(dtrain::data::Transfer<dtrain::data::cuda_transfer>);

namespace check_cuda {

struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(784, 128))), fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x.flatten(1)))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

template <class Trainer>
dtrain::Result train(Trainer& trainer, const dtrain::data::FashionMnist& data) {
  return trainer.fit([&](typename Trainer::context& ctx) {
    auto model = ctx.prepare_model(Net());
    torch::optim::Adam adam(model->parameters());
    for (auto epoch : ctx.epochs(2)) {
      for (const auto& batch : ctx.shard(data.train(), 256)) {  // prefetched: pinned memory, copy stream
        adam.zero_grad();
        torch::Tensor loss;
        {
          auto autocast = ctx.autocast();
          loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
        }
        ctx.backward(loss);  // scaled; DDP's buckets allreduced on the NCCL stream during backward
        if (auto* scaler = ctx.precision().scaler()) {
          scaler->unscale(adam);  // before clipping
          torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
        }
        ctx.step(adam);
      }
      ctx.report({{"epoch", epoch}, {"skipped", ctx.skipped_steps()}}, ctx.checkpoint(model, adam));
    }
  });
}

// The step captured in a CUDA graph (ctx.graphed_step), with AdamW and SGD.
template <class Trainer, class Optimizer>
dtrain::Result train_graphed(Trainer& trainer, const dtrain::data::FashionMnist& data) {
  return trainer.fit([&](typename Trainer::context& ctx) {
    auto model = ctx.prepare_model(Net());
    Optimizer opt(model->parameters(), 0.01);
    auto step = ctx.graphed_step(opt, [&](const torch::Tensor& x, const torch::Tensor& y) {
      auto autocast = ctx.autocast();
      return torch::nn::functional::cross_entropy(model->forward(x), y);
    });
    for (auto epoch : ctx.epochs(2)) {
      for (const auto& batch : ctx.shard(data.train(), 256)) step(batch.data, batch.target);
      ctx.report({{"epoch", epoch}, {"replays", step.replays()}}, ctx.checkpoint(model, opt));
    }
  });
}
using GraphedTrainer = dtrain::Trainer<Net, dtrain::data::FashionMnist, dtrain::backend::nccl,
                                       dtrain::precision::amp<dtrain::precision::bf16>, dtrain::checkpointer::directory<>>;
template dtrain::Result train_graphed<GraphedTrainer, torch::optim::AdamW>(GraphedTrainer&, const dtrain::data::FashionMnist&);
template dtrain::Result train_graphed<GraphedTrainer, torch::optim::SGD>(GraphedTrainer&, const dtrain::data::FashionMnist&);

// The Trainers of the GPU path, fit() and all.
template dtrain::Result train(dtrain::Trainer<Net, dtrain::data::FashionMnist, dtrain::backend::nccl,
                                              dtrain::precision::amp<dtrain::precision::fp16>, dtrain::strategy::ddp<>,
                                              dtrain::checkpointer::directory<>>&,
                              const dtrain::data::FashionMnist&);
template dtrain::Result train(dtrain::Trainer<Net, dtrain::data::FashionMnist, dtrain::backend::nccl,
                                              dtrain::precision::amp<dtrain::precision::bf16>,
                                              dtrain::checkpointer::directory<>>&,
                              const dtrain::data::FashionMnist&);

}  // namespace check_cuda

// The communicator's whole interface, including FSDP's flat collectives.
void communicator_calls(dtrain::backend::nccl::communicator& comm, torch::Tensor& t, std::vector<torch::Tensor>& parts) {
  comm.allreduce(t, dtrain::reduce::mean).wait();
  comm.broadcast(t, 0).wait();
  auto full = torch::empty({t.numel() * comm.size()}, t.options());
  comm.allgather(full, t).wait();
  comm.allgather(parts, t).wait();
  comm.reduce_scatter(t, full, dtrain::reduce::sum).wait();
  comm.barrier();
  comm.on_stall([] {});
}

// The prefetcher and the GradScaler's fused path on their own.
void pieces(const dtrain::data::TensorDataset& ds, torch::optim::SGD& sgd) {
  std::vector<dtrain::data::Batch> v{ds.get_batch(torch::arange(4))};
  for (const auto& b : dtrain::data::prefetch(v, dtrain::data::cuda_transfer(torch::Device(torch::kCUDA, 0)))) (void)b;
  // Batches of named fields take the same path.
  std::vector<dtrain::data::Fields> named{{{"input_ids", torch::ones({4, 3}, torch::kInt64)}, {"label", torch::zeros({4})}}};
  for (const auto& b : dtrain::data::prefetch(named, dtrain::data::cuda_transfer(torch::Device(torch::kCUDA, 0)))) (void)b;
  dtrain::precision::GradScaler scaler(torch::Device(torch::kCUDA, 0));
  scaler.step(sgd);
  dtrain::precision::amp<dtrain::precision::fp16>::state state(torch::Device(torch::kCUDA, 0));
  auto scope = state.autocast();
}
