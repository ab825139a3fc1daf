// SPDX-License-Identifier: Apache-2.0
// nn::ResNet's SyncBatchNorm (nn/batchnorm.hpp), checked on real workers: each of 2 workers
// trains-mode forwards its 32 of 64 images through a ResNet-18 (small-image stem, layer1 --width
// channels wide) whose BatchNorms reduce their statistics over the workers,
// and compares with one model that forwards all 64 alone: the outputs, every running statistic
// and the input gradients agree. Ends with one JSON line (the largest differences over the ranks).
//
//   resnet_syncbn [--workers N] [--width N]

#include <dtrain/dtrain.hpp>
#include <dtrain/nn/resnet.hpp>

#include <cstdio>
#include <iostream>
#include <string>

#include <torch/torch.h>

namespace {

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  int workers = 2;
  std::int64_t width = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--workers") workers = std::stoi(argv[i + 1]);
    else if (f == "--width") width = std::stoll(argv[i + 1]);
    else {
      std::cerr << "usage: resnet_syncbn [--workers N] [--width N]\n";
      return 2;
    }
  }
  using Trainer = dtrain::Trainer<dtrain::nn::ResNet, dtrain::data::TensorDataset, dtrain::checkpointer::none>;
  auto config = dtrain::nn::ResNetConfig::basic({2, 2, 2, 2}, 10);  // resnet18 for 16x16 images
  config.stem = "small";
  config.width = width;
  Trainer trainer({.num_workers = workers}, {.storage_path = "runs", .name = "resnet_syncbn"});
  const std::int64_t global = 64;
  auto result = trainer.fit([&](Trainer::context& ctx) {
    const auto x = torch::randn({global, 3, 16, 16}, at::detail::createCPUGenerator(1));
    const auto w = torch::randn({global, 10}, at::detail::createCPUGenerator(2));
    const std::int64_t per = global / ctx.world_size(), first = per * ctx.world_rank();
    torch::manual_seed(0);
    dtrain::nn::ResNet synced(config);
    torch::manual_seed(0);
    dtrain::nn::ResNet alone(config);
    synced->sync_batchnorm([&](torch::Tensor& t) { ctx.all_reduce(t); });
    synced->train(), alone->train();

    auto mine = x.narrow(0, first, per).clone().requires_grad_(true);
    const auto out = synced->forward(mine);
    (out * w.narrow(0, first, per)).sum().backward();
    auto all = x.clone().requires_grad_(true);
    const auto ref = alone->forward(all);
    (ref * w).sum().backward();  // the sum of every rank's loss

    double stats = 0;
    const auto a = synced->named_buffers(), b = alone->named_buffers();
    for (const auto& kv : a) stats = std::max(stats, max_diff(kv.value(), b[kv.key()]));
    const double outputs = max_diff(out, ref.narrow(0, first, per));
    const double grads = max_diff(mine.grad(), all.grad().narrow(0, first, per));
    ctx.report({{"max_output_diff", ctx.all_reduce(outputs, dtrain::reduce::max)},
                {"max_running_stat_diff", ctx.all_reduce(stats, dtrain::reduce::max)},
                {"max_input_grad_diff", ctx.all_reduce(grads, dtrain::reduce::max)},
                {"batchnorm_buffers", static_cast<std::int64_t>(a.size())}});
  });
  const auto& m = result.metrics;
  std::printf("{\"workers\": %d, \"max_output_diff\": %.3g, \"max_running_stat_diff\": %.3g, "
              "\"max_input_grad_diff\": %.3g, \"batchnorm_buffers\": %lld}\n",
              workers, m.at("max_output_diff").number(), m.at("max_running_stat_diff").number(),
              m.at("max_input_grad_diff").number(), static_cast<long long>(m.at("batchnorm_buffers").number()));
  return 0;
}
