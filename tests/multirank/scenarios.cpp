// Multi-process scenarios for the multirank tests: each run is a real driver that starts real
// workers over Gloo on loopback. test_multirank.cpp runs this program and checks what it prints.
//
//   scenarios <scenario> [--workers N] [--threads N] [--steps K] [--batch B] [--out FILE] [--tag T]

#include <dtrain/dtrain.hpp>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>
#include <thread>

#include <torch/torch.h>

namespace {

struct Args {
  std::string scenario;
  int workers = 2, threads = 1, steps = 6;
  std::int64_t batch = 32;
  std::string out, storage = "multirank_runs";
  int rendezvous_ms = 20000;
};

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) throw std::invalid_argument("usage: scenarios <scenario> [--flag value]...");
  a.scenario = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--workers") a.workers = std::stoi(v);
    else if (f == "--threads") a.threads = std::stoi(v);
    else if (f == "--steps") a.steps = std::stoi(v);
    else if (f == "--batch") a.batch = std::stoll(v);
    else if (f == "--out") a.out = v;
    else if (f == "--storage") a.storage = v;
    else if (f == "--rendezvous-ms") a.rendezvous_ms = std::stoi(v);
    else if (f == "--tag") {}  // only marks the processes, for the orphan checks
    else throw std::invalid_argument("unknown flag " + f);
  }
  return a;
}

// A fixed synthetic classification set: the same on every rank and in every run.
dtrain::data::TensorDataset synthetic(std::int64_t n, std::int64_t features) {
  auto gen = at::detail::createCPUGenerator(1234);
  auto x = at::randn({n, features}, gen);
  auto y = at::randint(0, 10, {n}, gen);
  return {x, y};
}

torch::nn::Sequential small_model(std::int64_t features, std::int64_t hidden) {
  using namespace torch::nn;
  return Sequential(Linear(features, hidden), Tanh(), Linear(hidden, hidden), Tanh(), Linear(hidden, 10));
}

using Trainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset>;
// Loss scaling on CPU: bf16 autocast with the GradScaler fp16 uses on GPUs.
using ScaledTrainer =
    dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset,
                    dtrain::precision::amp<dtrain::precision::bf16, dtrain::precision::dynamic_loss_scale>>;

// The CPU stand-in for backend::nccl's cuda_transfer: a backend with a batch_transfer makes
// ctx.shard() prefetch, which this exercises without a GPU.
struct cpu_transfer {
  explicit cpu_transfer(torch::Device) {}
  dtrain::data::Batch start(dtrain::data::Batch b) const { return b; }
  dtrain::data::Batch finish(dtrain::data::Batch b) const { return b; }
};
struct prefetching_gloo : dtrain::backend::gloo {
  using batch_transfer = cpu_transfer;
};
using PrefetchTrainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset, prefetching_gloo>;

template <class Trainer>
int run(const Args& a) {
  const bool big = a.scenario == "overlap";
  const std::int64_t features = big ? 512 : 20, hidden = big ? 512 : 32;
  const auto data = synthetic(1024, features);

  Trainer trainer({.num_workers = a.workers, .threads_per_worker = a.threads, .use_gpu = a.scenario == "use_gpu"},
                  {.storage_path = a.storage, .name = a.scenario,
                   .rendezvous_timeout = std::chrono::milliseconds(a.rendezvous_ms),
                   .collective_timeout = std::chrono::seconds(20)});
  const auto result = trainer.fit([&](typename Trainer::context& ctx) {
    torch::manual_seed(ctx.world_rank() + 7);  // different initial weights: prepare_model must fix that
    auto model = ctx.prepare_model(small_model(features, hidden));
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    int step = 0;
    for (auto epoch : ctx.epochs(1000)) {
      (void)epoch;
      for (auto batch : ctx.shard(data, a.batch)) {
        if (step == a.steps) break;
        // The position a checkpoint saves counts the batches the loop received, even when the
        // next one was read ahead.
        if ((a.scenario == "prefetch" || a.scenario == "equivalence") && ctx.sampler_position() != step + 1)
          throw std::runtime_error("sampler position " + std::to_string(ctx.sampler_position()) + " at batch " +
                                   std::to_string(step));
        if (a.scenario == "throw" && ctx.world_rank() == 1 && step == 3)
          throw std::runtime_error("boom at step 3");
        if (a.scenario == "sigkill" && ctx.world_rank() == 1 && step == 3) std::raise(SIGKILL);
        if (a.scenario == "hang") std::this_thread::sleep_for(std::chrono::hours(1));
        sgd.zero_grad();
        torch::Tensor loss;
        {
          auto autocast = ctx.autocast();
          loss = torch::nn::functional::cross_entropy(model->forward(batch.data).to(torch::kFloat), batch.target);
        }
        if (a.scenario == "no_sync" && step % 2 == 0) {
          auto guard = ctx.no_sync();
          ctx.backward(loss);
        } else {
          ctx.backward(loss);
        }
        // amp_overflow: rank 1 alone finds an inf in its (already averaged) gradients at step 2;
        // every rank must skip that step, so the parameters stay equal.
        if (a.scenario == "amp_overflow" && ctx.world_rank() == 1 && step == 2)
          model->parameters()[0].mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
        if (a.scenario != "no_sync" || step % 2 == 1) ctx.step(sgd);
        ++step;
      }
      if (step == a.steps) break;
    }
    if (a.scenario == "skip_report" && ctx.world_rank() == 1) return;
    const double sum = ctx.all_reduce(ctx.world_rank() + 1.0, dtrain::reduce::sum);
    const double mean = ctx.all_reduce(ctx.world_rank() + 1.0, dtrain::reduce::mean);
    const double max = ctx.all_reduce(ctx.world_rank() + 1.0, dtrain::reduce::max);
    const auto& stats = ctx.strategy().stats();
    // Every rank must hold the same parameters: compare each rank's checksum with rank 0's.
    double checksum = 0;
    for (const torch::Tensor& p : model->parameters()) checksum += p.sum().item<double>();
    const double checksum_max = ctx.all_reduce(checksum, dtrain::reduce::max);
    const double checksum_min = ctx.all_reduce(checksum, dtrain::reduce::min);
    if (ctx.world_rank() == 0 && !a.out.empty()) {
      std::vector<torch::Tensor> params;
      for (const auto& p : model->parameters()) params.push_back(p.detach().clone());
      torch::save(params, a.out);
    }
    ctx.report({{"rank", ctx.world_rank()},
                {"sum", sum}, {"mean", mean}, {"max", max},
                {"buckets", stats.buckets},
                {"grads_pending_at_first_launch", stats.grads_pending_at_first_launch},
                {"synced_steps", stats.synced_steps},
                {"ranks_agree", checksum_max == checksum_min},
                {"world", ctx.world_size()},
                {"skipped_min", ctx.all_reduce(static_cast<double>(ctx.skipped_steps()), dtrain::reduce::min)},
                {"skipped_max", ctx.all_reduce(static_cast<double>(ctx.skipped_steps()), dtrain::reduce::max)}});
  });
  std::cout << "RESULT";
  for (const auto& [k, v] : result.metrics) std::cout << ' ' << k << '=' << v.text();
  std::cout << " rows=" << result.metrics_history.size() << " path=" << result.path.string() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  if (a.scenario.rfind("amp_", 0) == 0) return run<ScaledTrainer>(a);
  if (a.scenario == "prefetch") return run<PrefetchTrainer>(a);
  return run<Trainer>(a);
} catch (const dtrain::Error& e) {
  std::cout << "ERROR " << e.what() << std::endl;
  return 3;
}
