// SPDX-License-Identifier: Apache-2.0
// Signal scenarios: a real driver with real workers over Gloo on loopback, checkpointing with
// checkpointer::directory<> and tracking with tracker::mlflow<>. test_signals.py sends SIGINT and
// SIGTERM to it, reads its MLflow store while it runs, and checks what it leaves.
//
//   signal_scenarios --name NAME --storage DIR [--workers N] [--steps K] [--every E] [--sleep-ms M]
//       [--grace-ms G] [--on-stop checkpoint|auto|ignore] [--fail-step S] [--no-throw 1]
//       [--linger-ms L] [--tag T]
//
// --on-stop: checkpoint - the loop asks ctx.should_stop() after each shard and saves a checkpoint;
// auto - it never asks (ctx.shard and ctx.epochs end early), and reports with a checkpoint at each
// epoch's end; ignore - a loop built on neither ctx.shard nor ctx.epochs that never asks, which the
// grace period's SIGKILL ends. Each rank prints "LOOP_END rank=R steps=N unix=T" when its loop
// ends (T: the end of its last step). --linger-ms: the loop sleeps that long after training.

#include <dtrain/dtrain.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

#include <torch/torch.h>

namespace {

struct Args {
  std::string name = "run", storage = "signal_runs", on_stop = "checkpoint";
  int workers = 2, steps = 200, every = 10, sleep_ms = 10, grace_ms = 10000, fail_step = -1, linger_ms = 0;
  bool no_throw = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--name") a.name = v;
    else if (f == "--storage") a.storage = v;
    else if (f == "--workers") a.workers = std::stoi(v);
    else if (f == "--steps") a.steps = std::stoi(v);
    else if (f == "--every") a.every = std::stoi(v);
    else if (f == "--sleep-ms") a.sleep_ms = std::stoi(v);
    else if (f == "--grace-ms") a.grace_ms = std::stoi(v);
    else if (f == "--on-stop") a.on_stop = v;
    else if (f == "--fail-step") a.fail_step = std::stoi(v);
    else if (f == "--no-throw") a.no_throw = v == "1";
    else if (f == "--linger-ms") a.linger_ms = std::stoi(v);
    else if (f == "--tag") {}  // only marks the processes
    else throw std::invalid_argument("unknown flag " + f);
  }
  return a;
}

// tests/tools builds this file again with DTRAIN_SCENARIO_TRACKER=tracker::tensorboard<tracker::mlflow<>>.
#ifndef DTRAIN_SCENARIO_TRACKER
#define DTRAIN_SCENARIO_TRACKER dtrain::tracker::mlflow<>
#endif
using Trainer = dtrain::Trainer<torch::nn::Linear, dtrain::data::TensorDataset, dtrain::checkpointer::directory<>,
                                DTRAIN_SCENARIO_TRACKER>;

void print(const char* label, const dtrain::Result& r) {
  std::cout << label << " status=" << r.status << " restarts=" << r.restarts << " rows=" << r.metrics_history.size()
            << " latest=" << (r.latest_checkpoint() ? r.latest_checkpoint()->path().filename().string() : "-")
            << " best=" << (r.best_checkpoint() ? r.best_checkpoint()->path().filename().string() : "-")
            << " ranked=";
  for (const auto& c : r.best_checkpoints()) std::cout << c.iteration() << ":" << c.metrics().at("score").text() << ",";
  std::cout << " error_rank=" << (r.error ? r.error->rank : -2)
            << " error_status=" << (r.error ? r.error->status : "-") << std::endl;
  if (r.error) std::cout << label << "_ERROR " << r.error->message << std::endl;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  auto gen = at::detail::createCPUGenerator(99);
  dtrain::data::TensorDataset data{at::randn({512, 8}, gen), at::randint(0, 4, {512}, gen)};
  dtrain::RunConfig run{.storage_path = a.storage, .name = a.name,
                        .rendezvous_timeout = std::chrono::seconds(20),
                        .collective_timeout = std::chrono::seconds(20)};
  run.checkpoint = {.num_to_keep = 3, .score_attribute = "score", .score_order = dtrain::ScoreOrder::max};
  run.failure.stop_grace = std::chrono::milliseconds(a.grace_ms);
  run.failure.throw_on_failure = !a.no_throw;
  run.progress.verbosity = dtrain::Verbosity::quiet;
  Trainer trainer({.num_workers = a.workers}, run);

  const auto result = trainer.fit([&](Trainer::context& ctx) {
    torch::manual_seed(3);
    auto model = ctx.prepare_model(torch::nn::Linear(8, 4));
    torch::optim::SGD sgd(model->parameters(), 0.05);
    if (auto ck = ctx.get_checkpoint()) {
      ctx.restore(*ck, model, sgd);
      if (ctx.world_rank() == 0) std::cerr << "RESUMED steps=" << ck->steps() << std::endl;
    }
    double last_step_end = dtrain::unix_now();
    auto train_step = [&](const dtrain::data::Batch& batch) {
      if (ctx.world_rank() == 1 && ctx.steps() == a.fail_step) throw std::runtime_error("injected failure");
      sgd.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
      ctx.backward(loss);
      ctx.step(sgd);
      std::this_thread::sleep_for(std::chrono::milliseconds(a.sleep_ms));
      last_step_end = dtrain::unix_now();
      if (ctx.steps() % a.every == 0) {
        const auto s = ctx.steps();
        // "val:loss" has a ':' that MLflow's key must not keep.
        ctx.report({{"loss", loss.item<double>()}, {"val:loss", loss.item<double>()}, {"score", (s * 7) % 11}},
                   ctx.checkpoint(model, sgd));
      }
    };
    if (a.on_stop == "ignore") {  // neither ctx.epochs nor ctx.shard: nothing ends it but SIGKILL
      const auto batch = data.get_batch(torch::arange(16 * ctx.world_rank(), 16 * ctx.world_rank() + 16));
      while (ctx.steps() < a.steps) train_step(batch);
    } else {
      for (auto epoch : ctx.epochs(1000)) {
        (void)epoch;
        for (auto batch : ctx.shard(data, 32)) {
          if (ctx.steps() == a.steps) break;
          train_step(batch);
        }
        if (a.on_stop == "checkpoint" && ctx.should_stop()) {
          if (ctx.world_rank() == 0) std::cerr << "STOPPING at step " << ctx.steps() << std::endl;
          ctx.report({{"loss", 0.0}, {"score", 0}}, ctx.checkpoint(model, sgd));
          break;
        }
        if (a.on_stop == "auto" && ctx.steps() % a.every != 0)  // the epoch's end, cut short or not
          ctx.report({{"loss", 0.0}, {"score", 0}}, ctx.checkpoint(model, sgd));
        if (ctx.steps() == a.steps) break;
      }
    }
    std::fprintf(stderr, "LOOP_END rank=%d steps=%lld unix=%.3f\n", ctx.world_rank(),
                 static_cast<long long>(ctx.steps()), last_step_end);
    std::this_thread::sleep_for(std::chrono::milliseconds(a.linger_ms));
  });
  print("RESULT", result);
  print("FROM_PATH", dtrain::Result::from_path(result.path));
  return 0;
} catch (const dtrain::Stopped& e) {
  std::cout << "STOPPED " << e.what() << std::endl;
  return 4;
} catch (const dtrain::Error& e) {
  std::cout << "ERROR " << e.what() << std::endl;
  return 3;
}
