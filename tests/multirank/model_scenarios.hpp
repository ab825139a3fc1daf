// SPDX-License-Identifier: Apache-2.0
// A pretrained family's model trained for 2 steps on 2 workers under each strategy and precision
// issue 27 names, for programs `<family>_scenarios ddp|fsdp|amp STORAGE`:
//   ddp: strategy::ddp<>; fsdp: strategy::fsdp<full_shard, wrap::layers> (a unit per layer or
//   block); amp: ddp<> with precision::amp<bf16>.
// Prints "RESULT <scenario> loss=... finite=1 steps=2 spread=0 tensors=N units=U logits=<dtype>":
// spread is the largest difference, over ranks, of a checksum of each rank's model after the
// steps (its eval-mode logits on a fixed batch, and under ddp<> its parameters and buffers; 0:
// every rank holds the same model); tensors, the full state's count; units, fsdp<>'s.

#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <iostream>
#include <string>

#include <dtrain/dtrain.hpp>
#include <dtrain/models.hpp>

namespace model_scenarios {

template <class Model>
struct Scenario {
  const char* program;
  std::function<Model()> make;           // random weights; prepare_model makes the ranks agree
  dtrain::data::TensorDataset data;      // inputs [N, ...], labels [N]
  std::int64_t global_batch;             // per step, over both workers
};

template <class Trainer, class Model>
int run(const std::string& name, const std::string& storage, const Scenario<Model>& s) {
  Trainer trainer({.num_workers = 2, .threads_per_worker = 1},
                  {.storage_path = storage, .name = name, .collective_timeout = std::chrono::seconds(60),
                   .start = dtrain::Start::fresh});
  const auto result = trainer.fit([&](typename Trainer::context& ctx) {
    torch::manual_seed(ctx.world_rank() + 1);  // different weights per rank: prepare_model must fix that
    auto model = ctx.prepare_model(s.make());
    torch::optim::AdamW opt(ctx.parameters(model), torch::optim::AdamWOptions(1e-3));
    model->train();
    double loss_sum = 0;
    int steps = 0;
    std::string logits_dtype;
    for (const dtrain::data::Batch& batch : ctx.shard(s.data, s.global_batch)) {
      opt.zero_grad();
      torch::Tensor logits;
      {
        auto autocast = ctx.autocast();  // amp<bf16>: the forward in bf16 where ATen's autocast says
        logits = ctx.forward(model, batch.data);
      }
      logits_dtype = c10::toString(logits.scalar_type());
      torch::Tensor loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), batch.target);
      ctx.backward(loss);
      ctx.step(opt);
      loss_sum += loss.item<double>();
      if (++steps == 2) break;
    }
    // Every value weighted by its position, so that a swap shows.
    const auto weighted = [](const torch::Tensor& t) {
      const torch::Tensor flat = t.detach().to(torch::kDouble).reshape(-1);
      return (flat * torch::arange(1, flat.numel() + 1, flat.options())).sum().item<double>();
    };
    model->eval();
    double checksum = 0;
    {
      torch::NoGradGuard no_grad;
      const auto fixed = s.data.get_batch(torch::arange(s.global_batch));
      auto autocast = ctx.autocast();
      checksum += weighted(ctx.forward(model, fixed.data));  // under fsdp<>, ctx.forward gathers the weights
    }
    constexpr bool sharded = requires { ctx.strategy().stats().reduce_scatters; };
    if constexpr (!sharded) {  // a rank's own parameters and buffers (under fsdp<> it holds shards)
      for (const auto& p : model->named_parameters()) checksum += weighted(p.value());
      for (const auto& b : model->named_buffers()) checksum += weighted(b.value());
    }
    const double spread =
        ctx.all_reduce(checksum, dtrain::reduce::max) - ctx.all_reduce(checksum, dtrain::reduce::min);
    const auto full = ctx.full_state(model);  // on rank 0 (a collective under fsdp<>: every rank calls it)
    dtrain::Metrics m{{"loss", ctx.all_reduce(loss_sum / steps)}, {"steps", steps}, {"spread", spread},
                      {"tensors", static_cast<std::int64_t>(full.size())}, {"logits", logits_dtype}};
    if constexpr (sharded) m["units"] = ctx.strategy().stats().units;
    else m["units"] = 0;
    ctx.report(m);
  });
  const double loss = result.metrics.at("loss").number();
  std::cout << "RESULT " << name << " loss=" << std::setprecision(10) << loss << " finite=" << std::isfinite(loss)
            << " steps=" << result.metrics.at("steps").text() << " spread=" << result.metrics.at("spread").text()
            << " tensors=" << result.metrics.at("tensors").text() << " units=" << result.metrics.at("units").text()
            << " logits=" << result.metrics.at("logits").text() << std::endl;
  return 0;
}

/// main() of a `<family>_scenarios ddp|fsdp|amp STORAGE` program.
template <class Model>
int main_of(int argc, char** argv, const Scenario<Model>& s) try {
  const std::string scenario = argc == 3 ? argv[1] : "";
  using dtrain::data::TensorDataset;
  namespace st = dtrain::strategy;
  if (scenario == "ddp") return run<dtrain::Trainer<Model, TensorDataset, st::ddp<>>>(scenario, argv[2], s);
  if (scenario == "fsdp")
    return run<dtrain::Trainer<Model, TensorDataset, st::fsdp<st::sharding::full_shard, st::wrap::layers>>>(
        scenario, argv[2], s);
  if (scenario == "amp")
    return run<dtrain::Trainer<Model, TensorDataset, st::ddp<>, dtrain::precision::amp<dtrain::precision::bf16>>>(
        scenario, argv[2], s);
  std::cerr << "usage: " << s.program << " ddp|fsdp|amp STORAGE\n";
  return 2;
} catch (const std::exception& e) {
  std::cerr << s.program << ": " << e.what() << "\n";
  return 1;
}

}  // namespace model_scenarios
