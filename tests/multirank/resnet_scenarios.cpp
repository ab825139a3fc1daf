// SPDX-License-Identifier: Apache-2.0
// torchvision's ResNet-18 (nn::resnet18, random weights, 3 classes) trained for 2 steps on 2
// workers, 2 images of 3x64x64 each per step, under each strategy and precision the issue names
// (issue 27):
//   resnet_scenarios ddp|fsdp|amp STORAGE
// ddp: strategy::ddp<>; fsdp: strategy::fsdp<full_shard, wrap::layers> (a unit per residual block);
// amp: ddp<> with precision::amp<bf16>. Prints "RESULT <scenario> loss=... finite=1 steps=2 spread=0
// tensors=122 units=... logits=<dtype>"; spread is the largest difference, over ranks, of a checksum
// of each rank's model after the steps (its eval-mode logits, which read the BatchNorm running
// statistics, and under ddp<> its parameters and buffers; 0: every rank holds the same model);
// tensors, the full state's count (parameters and buffers, as torchvision's state_dict).

#include <cmath>
#include <iomanip>
#include <iostream>
#include <string>

#include <dtrain/dtrain.hpp>
#include <dtrain/nn/resnet.hpp>

namespace {

using ResNet = dtrain::nn::ResNet;

// 8 images of 3x64x64, labels 0..2.
dtrain::data::TensorDataset images() {
  auto gen = at::detail::createCPUGenerator(11);
  return {at::randn({8, 3, 64, 64}, gen), at::arange(8) % 3};
}

template <class Trainer>
int run(const std::string& name, const std::string& storage) {
  const auto data = images();
  Trainer trainer({.num_workers = 2, .threads_per_worker = 1},
                  {.storage_path = storage, .name = name, .collective_timeout = std::chrono::seconds(60),
                   .start = dtrain::Start::fresh});
  const auto result = trainer.fit([&](typename Trainer::context& ctx) {
    torch::manual_seed(ctx.world_rank() + 1);  // prepare_model makes the ranks agree
    auto model = ctx.prepare_model(dtrain::nn::resnet18(3));
    torch::optim::AdamW opt(ctx.parameters(model), torch::optim::AdamWOptions(1e-3));
    model->train();
    double loss_sum = 0;
    int steps = 0;
    std::string logits_dtype;
    for (const dtrain::data::Batch& batch : ctx.shard(data, 4)) {
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
    // Every rank's model after the steps, checksummed: its logits on a fixed batch in eval mode
    // (under fsdp<> a rank holds only shards: ctx.forward gathers the full weights), and under
    // ddp<> its parameters themselves, every value weighted by its position so that a swap shows.
    const auto weighted = [](const torch::Tensor& t) {
      const torch::Tensor flat = t.detach().to(torch::kDouble).reshape(-1);
      return (flat * torch::arange(1, flat.numel() + 1, flat.options())).sum().item<double>();
    };
    model->eval();
    double checksum = 0;
    {
      torch::NoGradGuard no_grad;
      const auto fixed = data.get_batch(torch::arange(4));
      auto autocast = ctx.autocast();
      checksum += weighted(ctx.forward(model, fixed.data));
    }
    bool sharded = false;
    if constexpr (requires { ctx.strategy().stats().reduce_scatters; }) sharded = true;
    if (!sharded) {
      for (const auto& p : model->named_parameters()) checksum += weighted(p.value());
      for (const auto& b : model->named_buffers()) checksum += weighted(b.value());
    }
    const double spread =
        ctx.all_reduce(checksum, dtrain::reduce::max) - ctx.all_reduce(checksum, dtrain::reduce::min);
    const auto full = ctx.full_state(model);  // on rank 0 (a collective under fsdp<>: every rank calls it)
    dtrain::Metrics m{{"loss", ctx.all_reduce(loss_sum / steps)}, {"steps", steps}, {"spread", spread},
                      {"tensors", static_cast<std::int64_t>(full.size())}, {"logits", logits_dtype}};
    if constexpr (requires { ctx.strategy().stats().reduce_scatters; }) m["units"] = ctx.strategy().stats().units;
    else m["units"] = 0;
    ctx.report(m);
  });
  const double loss = result.metrics.at("loss").number();
  std::cout << "RESULT " << name << " loss=" << std::setprecision(10) << loss << " finite=" << std::isfinite(loss)
            << " steps=" << result.metrics.at("steps").text() << " spread=" << result.metrics.at("spread").text()
            << " tensors=" << result.metrics.at("tensors").text() << " units=" << result.metrics.at("units").text()
            << " logits=" << result.metrics.at("logits").text()
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string scenario = argc == 3 ? argv[1] : "";
  using dtrain::data::TensorDataset;
  namespace s = dtrain::strategy;
  if (scenario == "ddp") return run<dtrain::Trainer<ResNet, TensorDataset, s::ddp<>>>(scenario, argv[2]);
  if (scenario == "fsdp")
    return run<dtrain::Trainer<ResNet, TensorDataset, s::fsdp<s::sharding::full_shard, s::wrap::layers>>>(scenario, argv[2]);
  if (scenario == "amp")
    return run<dtrain::Trainer<ResNet, TensorDataset, s::ddp<>, dtrain::precision::amp<dtrain::precision::bf16>>>(
        scenario, argv[2]);
  std::cerr << "usage: resnet_scenarios ddp|fsdp|amp STORAGE\n";
  return 2;
} catch (const std::exception& e) {
  std::cerr << "resnet_scenarios: " << e.what() << "\n";
  return 1;
}
