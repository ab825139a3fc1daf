// SPDX-License-Identifier: Apache-2.0
// Tuner scenarios, run by check_tune.py. A real loop (a small network trained by SGD on 1
// worker) whose reported val_loss is known in advance: quality + 1 / iteration, so that which
// trials a scheduler stops can be computed independently.
//
//   tune_scenarios STORAGE NAME SCHEDULER CONCURRENT [options]
//     SCHEDULER: fifo | asha | median
//     --quality q1,q2,...   a grid over "quality" (else tune::uniform(0, 1), --samples of them)
//     --samples N --seed S --epochs E --sleep-ms MS --fail-quality Q --fresh
// Prints one line per trial: "TRIAL id status stopped_early iteration val_loss quality", then
// "BEST id"; exits 2 when a signal stopped the experiment.

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include <dtrain/dtrain.hpp>
#include <dtrain/tune.hpp>
#include <dtrain/tune.hpp>

#include <torch/torch.h>

namespace {

struct ModelConfig {
  std::int64_t width = 4;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ModelConfig, width)

struct LoopConfig {
  double quality = 0.5;
  double lr = 0.05;
  std::int64_t epochs = 6;
  std::int64_t sleep_ms = 0;
  double fail_quality = -1;
  ModelConfig model;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(LoopConfig, quality, lr, epochs, sleep_ms, fail_quality, model)

dtrain::data::TensorDataset make_data() {
  torch::manual_seed(3);
  auto x = torch::randn({64, 6});
  return {x, (x.sum(1) > 0).to(torch::kInt64)};
}

std::vector<dtrain::Metric> numbers(const std::string& list) {
  std::vector<dtrain::Metric> out;
  std::stringstream s(list);
  for (std::string v; std::getline(s, v, ',');) out.emplace_back(std::stod(v));
  return out;
}

template <class Scheduler>
int run_search(const std::string& storage, const std::string& name, int concurrent, const dtrain::tune::Space& space,
         int samples, std::uint64_t seed, bool fresh, Scheduler scheduler) {
  using Trainer = dtrain::Trainer<torch::nn::Linear, dtrain::data::TensorDataset, dtrain::checkpointer::directory<>,
                                  dtrain::tracker::mlflow<>>;
  dtrain::RunConfig run{.storage_path = storage, .name = name};
  run.progress.verbosity = dtrain::Verbosity::quiet;
  run.failure.stop_grace = std::chrono::seconds(20);
  run.train_loop_config = {{"epochs", 6}};
  if (fresh) run.start = dtrain::Start::fresh;
  Trainer trainer({.num_workers = 1}, run);
  dtrain::tune::Tuner tuner(trainer, space,
                            {.metric = "val_loss", .mode = dtrain::tune::Mode::min, .num_samples = samples,
                             .seed = seed, .max_concurrent_trials = concurrent},
                            scheduler);
  const auto data = make_data();
  auto grid = tuner.fit([&](Trainer::context& ctx) {
    const auto cfg = dtrain::tune::config<LoopConfig>(ctx);
    torch::manual_seed(11);
    auto model = ctx.prepare_model(torch::nn::Linear(6, 2));
    torch::optim::SGD opt(ctx.parameters(model), cfg.lr);
    std::int64_t resumed = 0;
    if (auto ck = ctx.get_checkpoint()) {
      ctx.restore(*ck, model, opt);
      resumed = ck->iteration();
    }
    const auto dir = ctx.run_config().path();
    std::ofstream(dir / "starts.txt", std::ios::app)
        << std::fixed << std::setprecision(3) << resumed << " " << std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()
        << " " << cfg.model.width << "\n";
    for (auto epoch : ctx.epochs(cfg.epochs)) {
      for (const auto& b : ctx.shard(data, 16)) {
        opt.zero_grad();
        ctx.backward(torch::nn::functional::cross_entropy(ctx.forward(model, b.data), b.target));
        ctx.step(opt);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(cfg.sleep_ms));
      const double iteration = static_cast<double>(ctx.reports() + 1);
      if (cfg.quality == cfg.fail_quality && iteration == 2) throw std::runtime_error("deliberate failure at iteration 2");
      ctx.report({{"val_loss", cfg.quality + 1.0 / iteration}, {"epoch", epoch}}, ctx.checkpoint(model, opt));
    }
    std::ofstream(dir / "ends.txt", std::ios::app)
        << std::fixed << std::setprecision(3) << std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() << "\n";
  });
  for (const auto& t : grid) {
    const auto q = t.config.find("quality");
    std::cout << "TRIAL " << t.id << " " << t.status << " " << t.stopped_early << " "
              << (t.metrics().count("iteration") ? t.metrics().at("iteration").text() : "0") << " "
              << t.score("val_loss", dtrain::tune::Mode::min) << " " << (q == t.config.end() ? "-" : q->second.text())
              << std::endl;
  }
  std::cout << "BEST " << grid.best_result().id << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 5) {
    std::cerr << "usage: tune_scenarios STORAGE NAME fifo|asha|median CONCURRENT [options]\n";
    return 64;
  }
  const std::string storage = argv[1], name = argv[2], scheduler = argv[3];
  const int concurrent = std::stoi(argv[4]);
  std::string quality;
  int samples = 1;
  std::uint64_t seed = 0;
  dtrain::Metric epochs = std::int64_t{6}, sleep_ms = std::int64_t{0}, fail = -1.0;
  bool fresh = false;
  for (int i = 5; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--quality") quality = value();
    else if (flag == "--samples") samples = std::stoi(value());
    else if (flag == "--seed") seed = std::stoull(value());
    else if (flag == "--epochs") epochs = std::stoll(value());
    else if (flag == "--sleep-ms") sleep_ms = std::stoll(value());
    else if (flag == "--fail-quality") fail = std::stod(value());
    else if (flag == "--fresh") fresh = true;
    else throw std::invalid_argument("unknown argument " + flag);
  }
  namespace tune = dtrain::tune;
  const tune::Space space{
      {"quality", quality.empty() ? tune::uniform(0, 1) : tune::grid(numbers(quality))},
      {"lr", tune::loguniform(1e-3, 1e-1)},
      {"epochs", epochs},
      {"sleep_ms", sleep_ms},
      {"fail_quality", fail},
      {"model", tune::Space{{"width", tune::choice({2, 4, 8})}}},
  };
  if (scheduler == "fifo") return run_search(storage, name, concurrent, space, samples, seed, fresh, tune::fifo{});
  if (scheduler == "asha")
    return run_search(storage, name, concurrent, space, samples, seed, fresh,
                tune::asha{.max_t = 8, .grace_period = 1, .reduction_factor = 2});
  if (scheduler == "median")
    return run_search(storage, name, concurrent, space, samples, seed, fresh,
                tune::median_stopping{.grace_period = 2, .min_samples_required = 2});
  std::cerr << "unknown scheduler " << scheduler << "\n";
  return 64;
} catch (const dtrain::Stopped& e) {
  std::cout << "STOPPED " << e.what() << std::endl;
  return 2;
} catch (const std::exception& e) {
  std::cerr << "tune_scenarios: " << e.what() << "\n";
  return 1;
}
