// Multi-process scenarios for the multirank tests: each run is a real driver that starts real
// workers over Gloo on loopback. test_multirank.cpp runs this program and checks what it prints.
//
//   scenarios <scenario> [--workers N] [--threads N] [--steps K] [--batch B] [--out FILE] [--tag T]

#include <dtrain/dtrain.hpp>

#include <csignal>
#include <cstdlib>
#include <iostream>
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

// Evaluation across workers: one fixed model (the same weights on every rank and in every run)
// predicts 1001 samples (an uneven split) with a Predictor, gathered in order, while a confusion
// matrix is accumulated per batch on each rank and summed over the ranks; and a hand-computed case
// of 10 samples (truth i % 3, prediction (i / 2) % 3) split the same way. --out gets rank 0's
// gathered probabilities; the RESULT line the matrices and their summaries.
int evaluate(Trainer& trainer, const Args& a, const dtrain::data::TensorDataset& data, std::int64_t features,
             std::int64_t hidden) {
  const dtrain::data::TensorDataset subset{data.data().narrow(0, 0, 1001), data.targets().narrow(0, 0, 1001)};
  auto table = [](const dtrain::evaluation::ConfusionMatrix& cm) {
    std::string s;
    for (const auto& row : cm.counts_table())
      for (auto v : row) s += (s.empty() ? "" : ",") + std::to_string(v);
    return s;
  };
  const auto result = trainer.fit([&](Trainer::context& ctx) {
    torch::manual_seed(3);
    dtrain::evaluation::Predictor<torch::nn::Sequential> predictor(small_model(features, hidden));
    dtrain::evaluation::ConfusionMatrix cm(10);
    const auto predictions = predictor.predict(ctx, subset, a.batch, &cm);
    dtrain::evaluation::ConfusionMatrix hand(3);
    const auto mine = dtrain::sampler::sequential::indices(10, ctx.world_rank(), ctx.world_size(), 0);
    if (!mine.empty()) {
      const auto i = torch::tensor(mine);
      hand.update(torch::floor_divide(i, 2).remainder(3), i.remainder(3));  // (predictions, targets)
    }
    ctx.all_reduce(hand);
    if (ctx.world_rank() == 0 && !a.out.empty()) torch::save(predictions.probabilities(), a.out);
    dtrain::Metrics m = cm.summary("eval_");
    for (const auto& [k, v] : hand.summary("hand_")) m.emplace(k, v);
    m.emplace("cm", table(cm));
    m.emplace("hand_cm", table(hand));
    m.emplace("predicted", predictions.size());
    m.emplace("predicted_equals_cm", predictions.classes().eq(subset.targets()).sum().item<std::int64_t>() ==
                                         static_cast<std::int64_t>(std::llround(cm.accuracy() * 1001)));
    m.emplace("label0", predictions[0].label);
    ctx.report(m);
  });
  std::cout << "RESULT";
  for (const auto& [k, v] : result.metrics) std::cout << ' ' << k << '=' << v.text();
  std::cout << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  const bool big = a.scenario == "overlap";
  const std::int64_t features = big ? 512 : 20, hidden = big ? 512 : 32;
  const auto data = synthetic(1024, features);

  Trainer trainer({.num_workers = a.workers, .threads_per_worker = a.threads},
                  {.storage_path = a.storage, .name = a.scenario,
                   .rendezvous_timeout = std::chrono::milliseconds(a.rendezvous_ms),
                   .collective_timeout = std::chrono::seconds(20)});
  if (a.scenario == "evaluate") return evaluate(trainer, a, data, features, hidden);
  const auto result = trainer.fit([&](Trainer::context& ctx) {
    torch::manual_seed(ctx.world_rank() + 7);  // different initial weights: prepare_model must fix that
    auto model = ctx.prepare_model(small_model(features, hidden));
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    int step = 0;
    for (auto epoch : ctx.epochs(1000)) {
      (void)epoch;
      for (auto batch : ctx.shard(data, a.batch)) {
        if (step == a.steps) break;
        if (a.scenario == "throw" && ctx.world_rank() == 1 && step == 3)
          throw std::runtime_error("boom at step 3");
        if (a.scenario == "sigkill" && ctx.world_rank() == 1 && step == 3) std::raise(SIGKILL);
        if (a.scenario == "hang") std::this_thread::sleep_for(std::chrono::hours(1));
        sgd.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
        if (a.scenario == "no_sync" && step % 2 == 0) {
          auto guard = ctx.no_sync();
          ctx.backward(loss);
        } else {
          ctx.backward(loss);
        }
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
    for (const auto& p : model->parameters()) checksum += p.sum().item<double>();
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
                {"world", ctx.world_size()}});
  });
  std::cout << "RESULT";
  for (const auto& [k, v] : result.metrics) std::cout << ' ' << k << '=' << v.text();
  std::cout << " rows=" << result.metrics_history.size() << " path=" << result.path.string() << std::endl;
  return 0;
} catch (const dtrain::Error& e) {
  std::cout << "ERROR " << e.what() << std::endl;
  return 3;
}
