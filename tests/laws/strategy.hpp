// SPDX-License-Identifier: Apache-2.0
#pragma once
// Laws of the Strategy concept (policy/concepts.hpp), checked for one model through a Trainer:
// N workers (2 and 3) train to the parameters 1 worker reaches on the same global batches, within
// 1e-5 relative (the sums are taken in another order), after a few SGD-with-momentum steps:
//   - prepare_model() makes the ranks agree (each rank seeds its initial weights differently);
//   - a synchronised backward leaves every rank the mean of the ranks' gradients, which for equal
//     per-rank batches is the gradient of the global batch;
//   - under ctx.no_sync() gradients accumulate locally, and the next synchronised backward
//     averages the accumulated sums (the `accumulate` variant: every other micro-batch);
//   - ctx.parameters(model), ctx.forward(model, x) and ctx.full_state(model) work the same loop
//     under every strategy.
// Worker processes are forks of the test process (the driver is the test process itself).

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <dtrain/dtrain.hpp>

#include "../dtrain_catch.hpp"
#include "../unit/support.hpp"

namespace dtrain_laws::strategy {

namespace detail {

inline torch::nn::Sequential model() {
  using namespace torch::nn;
  return Sequential(Linear(10, 32), Tanh(), Linear(32, 32), Tanh(), Linear(32, 5));
}

// The same 240 samples in every process and every run.
inline dtrain::data::TensorDataset samples() {
  auto gen = at::detail::createCPUGenerator(4321);
  return {at::randn({240, 10}, gen), at::randint(0, 5, {240}, gen)};
}

// Rank 0's full parameters after `steps` optimizer steps on `workers` workers.
template <class Strategy>
std::vector<torch::Tensor> train(int workers, int steps, bool accumulate, const std::filesystem::path& storage) {
  using Trainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset, Strategy>;
  const auto data = samples();
  const std::string name = "w" + std::to_string(workers) + (accumulate ? "_accumulate" : "");
  const auto out = storage / (name + ".pt");
  Trainer trainer({.num_workers = workers},
                  {.storage_path = storage, .name = name, .rendezvous_timeout = std::chrono::seconds(30),
                   .collective_timeout = std::chrono::seconds(30)});
  trainer.fit([&](typename Trainer::context& ctx) {
    torch::manual_seed(7 + ctx.world_rank());  // prepare_model must make the ranks agree
    auto net = ctx.prepare_model(model());
    torch::optim::SGD sgd(ctx.parameters(net), torch::optim::SGDOptions(0.05).momentum(0.9));
    int taken = 0, micro = 0;
    for (auto epoch : ctx.epochs(10)) {
      (void)epoch;
      for (auto batch : ctx.shard(data, 24)) {
        const auto loss = torch::nn::functional::cross_entropy(ctx.forward(net, batch.data), batch.target);
        if (accumulate && micro++ % 2 == 0) {
          auto local = ctx.no_sync();
          ctx.backward(loss);
          continue;
        }
        ctx.backward(loss);
        ctx.step(sgd);
        sgd.zero_grad();
        if (++taken == steps) break;
      }
      if (taken == steps) break;
    }
    const auto full = ctx.full_state(net);  // a collective under fsdp<>: every rank calls it
    if (ctx.world_rank() == 0) {
      std::vector<torch::Tensor> params;
      for (const auto& p : net->named_parameters()) params.push_back(full.at(p.key()));
      torch::save(params, out.string());
    }
    ctx.report({{"steps", taken}});
  });
  std::vector<torch::Tensor> params;
  torch::load(params, out.string());
  return params;
}

// max |a - b| / max |a| over each tensor.
inline void check_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double tolerance) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(a[i].sizes() == b[i].sizes());
    CHECK(((a[i] - b[i]).abs().max() / a[i].abs().max().clamp_min(1e-12)).item<double>() <= tolerance);
  }
}

}  // namespace detail

/// Checks the laws above for the Strategy policy S on each of `worlds` workers against 1 worker,
/// with and without gradient accumulation.
template <class S>
void check(std::vector<int> worlds = {2, 3}, int steps = 4, double tolerance = 1e-5) {
  dtrain_test::TempDir storage;
  for (const bool accumulate : {false, true}) {
    INFO((accumulate ? "every other micro-batch under no_sync()" : "every batch synchronised"));
    const auto one = detail::train<S>(1, steps, accumulate, storage.path());
    // The steps moved the weights: the comparison is not between untouched models.
    torch::manual_seed(7);
    const auto initial = detail::model()->parameters();
    REQUIRE(one.size() == initial.size());
    bool moved = false;
    for (std::size_t i = 0; i < one.size(); ++i) moved = moved || !torch::allclose(one[i], initial[i]);
    CHECK(moved);
    for (const int workers : worlds) {
      INFO(workers << " workers against 1");
      detail::check_close(one, detail::train<S>(workers, steps, accumulate, storage.path()), tolerance);
    }
  }
}

}  // namespace dtrain_laws::strategy
