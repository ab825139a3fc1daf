// dtrain on GPUs end to end, and the dtrain half of the GPU benchmark (benchmarks/gpu_vs_torch.py
// runs it beside the same loop in Python torch). A Trainer over backend::nccl with DDP, the
// prefetching input pipeline and amp<fp16> (or fp32, or amp<bf16>) trains the Fashion-MNIST CNN on
// a synthetic Fashion-MNIST-shaped set and prints one JSON line.
//
//   train_gpu [--precision fp16|bf16|fp32] [--workers N] [--steps S] [--warmup W] [--batch B]

#include <dtrain/dtrain.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include <c10/cuda/CUDAFunctions.h>
#include <torch/torch.h>

namespace {

struct Args {
  std::string precision = "fp16";
  int workers = 1, steps = 300, warmup = 30;
  std::int64_t batch = 256;  // per worker
};

torch::nn::Sequential cnn() {
  using namespace torch::nn;
  return Sequential(Conv2d(Conv2dOptions(1, 32, 3).padding(1)), ReLU(), MaxPool2d(2),
                    Conv2d(Conv2dOptions(32, 64, 3).padding(1)), ReLU(), MaxPool2d(2), Flatten(),
                    Linear(64 * 7 * 7, 128), ReLU(), Linear(128, 10));
}

// 60 000 images as Fashion-MNIST has them: 1x28x28 floats in [0, 1], labels 0..9.
dtrain::data::TensorDataset synthetic() {
  auto gen = at::detail::createCPUGenerator(99);
  return {at::rand({60000, 1, 28, 28}, gen), at::randint(0, 10, {60000}, gen)};
}

template <class Precision>
int run(const Args& a) {
  using Trainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset, dtrain::backend::nccl, Precision>;
  const auto data = synthetic();
  Trainer trainer({.num_workers = a.workers, .use_gpu = true}, {.storage_path = "gpu_runs", .name = "train_gpu"});
  const auto result = trainer.fit([&](typename Trainer::context& ctx) {
    torch::manual_seed(1);
    auto model = ctx.prepare_model(cnn());
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    int step = 0;
    double loss_value = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (auto epoch : ctx.epochs(1000)) {
      (void)epoch;
      for (const auto& batch : ctx.shard(data, a.batch * ctx.world_size())) {
        if (step == a.warmup) {
          c10::cuda::device_synchronize();
          t0 = std::chrono::steady_clock::now();
        }
        if (step == a.warmup + a.steps) break;
        sgd.zero_grad();
        torch::Tensor loss;
        {
          auto autocast = ctx.autocast();
          loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
        }
        ctx.backward(loss);
        ctx.step(sgd);
        ++step;
      }
      if (step == a.warmup + a.steps) break;
    }
    c10::cuda::device_synchronize();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      torch::NoGradGuard no_grad;
      auto b = data.get_batch(torch::arange(a.batch));
      auto autocast = ctx.autocast();
      const torch::Tensor logits = model->forward(b.data.to(ctx.device()));
      loss_value = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), b.target.to(ctx.device())).template item<double>();
    }
    ctx.report({{"steps_per_s", a.steps / seconds},
                {"samples_per_s", a.steps * a.batch * ctx.world_size() / seconds},
                {"loss", loss_value},
                {"skipped", ctx.skipped_steps()},
                {"allreduce_wait_s", ctx.strategy().stats().allreduce_wait_s}});
  });
  std::cout << "{\"impl\": \"dtrain\", \"precision\": \"" << a.precision << "\", \"workers\": " << a.workers
            << ", \"batch_per_worker\": " << a.batch << ", \"steps\": " << a.steps;
  for (const auto& key : {"steps_per_s", "samples_per_s", "loss", "skipped"})
    std::cout << ", \"" << key << "\": " << result.metrics.at(key).text();
  std::cout << "}" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--precision") a.precision = v;
    else if (f == "--workers") a.workers = std::stoi(v);
    else if (f == "--steps") a.steps = std::stoi(v);
    else if (f == "--warmup") a.warmup = std::stoi(v);
    else if (f == "--batch") a.batch = std::stoll(v);
    else throw std::invalid_argument("unknown flag " + f);
  }
  if (a.precision == "fp16") return run<dtrain::precision::amp<dtrain::precision::fp16>>(a);
  if (a.precision == "bf16") return run<dtrain::precision::amp<dtrain::precision::bf16>>(a);
  if (a.precision == "fp32") return run<dtrain::precision::fp32>(a);
  throw std::invalid_argument("--precision must be fp16, bf16 or fp32");
} catch (const std::exception& e) {
  std::cerr << "train_gpu: " << e.what() << std::endl;
  return 1;
}
