// SPDX-License-Identifier: Apache-2.0
// Batch inference scenarios, run by check_batch_predict.py:
//   inference_scenarios train STORAGE                  trains a Net (a model with a Config) for a few
//                                                      steps on 2 workers; prints its checkpoint
//   inference_scenarios predict CHECKPOINT OUTPUT N [--kill-at FIRST] [--log FILE] [--jsonl]
//                                                      batch_predict on N workers; --kill-at: the worker
//                                                      that reads sample FIRST in attempt 0 is SIGKILLed
//   inference_scenarios reference CHECKPOINT           the same predictions from one process's Predictor,
//                                                      rows as batch_predict writes them, on stdout
//   inference_scenarios train-then-predict STORAGE OUTPUT
//                                                      both in one program, workers started anew
//                                                      (threads_per_worker 2: not forks of the driver)

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string>

#include <dtrain/dtrain.hpp>
#include <dtrain/data.hpp>
#include <dtrain/inference.hpp>
#include <dtrain/evaluation/batch_predict.hpp>

#include <torch/torch.h>

namespace {

struct NetConfig {
  std::int64_t inputs = 8, hidden = 16, classes = 4;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(NetConfig, inputs, hidden, classes)

struct NetImpl : torch::nn::Module {
  using Config = NetConfig;
  explicit NetImpl(const Config& c) : config(c) {
    fc1 = register_module("fc1", torch::nn::Linear(c.inputs, c.hidden));
    fc2 = register_module("fc2", torch::nn::Linear(c.hidden, c.classes));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::relu(fc1->forward(x))); }
  Config config;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

constexpr std::int64_t samples = 1003;  // not a multiple of the part size (49) nor the batch (7)

dtrain::data::TensorDataset make_data() {
  torch::manual_seed(42);
  auto x = torch::randn({samples, 8});
  return {x, (x.sum(1) > 0).to(torch::kInt64) + 2 * (x.select(1, 0) > 0).to(torch::kInt64)};
}

// The samples, which log every batch read (attempt, first index, count) and kill the process that
// reads sample `kill_at` in attempt 0.
struct Watched {
  dtrain::data::TensorDataset data = make_data();
  std::int64_t kill_at = -1;
  std::string log;
  std::int64_t size() const { return data.size(); }
  dtrain::data::Batch get_batch(const torch::Tensor& indices) const {
    const char* a = std::getenv("DTRAIN_ATTEMPT");
    const int attempt = a ? std::atoi(a) : 0;
    const auto first = indices[0].item<std::int64_t>();
    if (!log.empty()) {
      const std::string line = std::to_string(attempt) + " " + std::to_string(first) + " " +
                               std::to_string(indices.numel()) + "\n";
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        (void)!::write(fd, line.data(), line.size());
        ::close(fd);
      }
    }
    if (attempt == 0 && first == kill_at) std::raise(SIGKILL);
    return data.get_batch(indices);
  }
};

dtrain::RunConfig quiet_run(const std::string& storage, const std::string& name) {
  dtrain::RunConfig run{.storage_path = storage, .name = name};
  run.progress.verbosity = dtrain::Verbosity::quiet;
  run.failure.max_failures = 2;
  return run;
}

std::filesystem::path train(const std::string& storage, int threads) {
  using Trainer = dtrain::Trainer<Net, dtrain::data::TensorDataset, dtrain::checkpointer::directory<>>;
  auto run = quiet_run(storage, "train");
  run.start = dtrain::Start::fresh;
  Trainer trainer({.num_workers = 2, .threads_per_worker = threads}, run);
  const auto data = make_data();
  auto result = trainer.fit([&](Trainer::context& ctx) {
    torch::manual_seed(7);
    auto model = ctx.prepare_model(Net(NetConfig{}));
    torch::optim::SGD opt(ctx.parameters(model), 0.1);
    for (auto epoch : ctx.epochs(2)) {
      for (const auto& b : ctx.shard(data, 64)) {
        opt.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(ctx.forward(model, b.data), b.target);
        ctx.backward(loss);
        ctx.step(opt);
      }
      ctx.report({{"epoch", epoch}}, ctx.checkpoint(model, opt).with_object(
                                         "labels", dtrain::data::LabelEncoder::fit(std::vector<std::string>{
                                                       "cold", "cool", "mild", "warm"})));
    }
  });
  return result.best_checkpoint()->path();
}

dtrain::evaluation::BatchPredictConfig job(const std::string& output, bool jsonl) {
  return {.output = output,
          .format = jsonl ? dtrain::evaluation::PredictionFormat::jsonl : dtrain::evaluation::PredictionFormat::csv,
          .batch = 7,
          .part_size = 49};
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "train" && argc == 3) {
    std::cout << "CHECKPOINT " << train(argv[2], 1).string() << std::endl;
    return 0;
  }
  if (mode == "predict" && argc >= 5) {
    Watched data;
    bool jsonl = false;
    for (int i = 5; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "--kill-at" && i + 1 < argc) data.kill_at = std::stoll(argv[++i]);
      else if (flag == "--log" && i + 1 < argc) data.log = argv[++i];
      else if (flag == "--jsonl") jsonl = true;
      else throw std::invalid_argument("unknown argument " + flag);
    }
    const std::string output = argv[3];
    auto out = dtrain::evaluation::batch_predict<Net>(argv[2], data, job(output, jsonl), {.num_workers = std::stoi(argv[4])},
                                                      quiet_run(output + "_runs", "predict"));
    std::cout << "PREDICTIONS " << out.file.string() << " samples " << out.samples << " restarts "
              << out.run.restarts << " status " << out.run.status << std::endl;
    return 0;
  }
  if (mode == "reference" && argc == 3) {
    auto predictor = dtrain::evaluation::Predictor<Net>::from_checkpoint(std::filesystem::path(argv[2]));
    const auto data = make_data();
    predictor.set_class_names({"cold", "cool", "mild", "warm"});
    const auto p = predictor.predict(data, 7);
    std::cout << dtrain::evaluation::detail::header(p.class_names(), job("-", false))
              << dtrain::evaluation::detail::rows(p.probabilities(), 0, p.class_names(), job("-", false));
    return 0;
  }
  if (mode == "train-then-predict" && argc == 4) {
    const auto checkpoint = train(argv[2], 2);  // workers of the run below pass over this fit()
    auto out = dtrain::evaluation::batch_predict<Net>(checkpoint, make_data(), job(argv[3], false),
                                                      {.num_workers = 2, .threads_per_worker = 2},
                                                      quiet_run(argv[2], "predict"));
    std::cout << "PREDICTIONS " << out.file.string() << " samples " << out.samples << std::endl;
    return 0;
  }
  std::cerr << "usage: see the head of tests/inference/scenarios.cpp\n";
  return 2;
} catch (const std::exception& e) {
  std::cerr << "inference_scenarios: " << e.what() << std::endl;
  return 1;
}
