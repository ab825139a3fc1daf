// SPDX-License-Identifier: Apache-2.0
// The checkpoint stall (issue 15, item 4): what an asynchronous checkpoint of a large model costs
// the training thread, against what writing it costs, and against a synchronous checkpoint.
//
//   checkpoint_stall [--mb 105] [--checkpoints 3] [--seconds-between 8] [--sync] [--dir DIR]
//
// One worker trains a model of `--mb` MB of float parameters (a stack of square Linear layers)
// with Adam (so the optimizer holds two more copies) and reports with a checkpoint every
// `--seconds-between` seconds of training (longer than a write takes, so that a checkpoint never
// waits for the previous write: what is measured is the training thread's own part). It prints
// one JSON line: the model's size, the seconds the training thread spent in ctx.checkpoint() and
// ctx.report() (blocked_s, as ctx.checkpoint_stats() counts it), the seconds the writes took
// (write_s), their ratio, the first checkpoint() call's seconds apart from the later ones' (the first
// copies into new memory, the later ones into the previous snapshot's buffers), and the median step
// time with and without a write running beside it. benchmarks/checkpoint_stall.py runs it async and
// --sync alternately and prints the medians side by side.

#include <dtrain/dtrain.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace {

struct Options {
  double mb = 105;
  int checkpoints = 3;
  double seconds_between = 8;
  bool sync = false;
  std::string dir = "/dev/shm/dtrain_checkpoint_stall";
};

[[noreturn]] void usage_error(const std::string& why) {
  std::cerr << "checkpoint_stall: " << why
            << "\nusage: checkpoint_stall [--mb MB] [--checkpoints N] [--seconds-between S] [--sync] [--dir DIR]\n";
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--sync") {
      o.sync = true;
      continue;
    }
    if (i + 1 >= argc) usage_error(flag == "--mb" || flag == "--checkpoints" || flag == "--seconds-between" || flag == "--dir"
                                       ? flag + " needs a value"
                                       : "unknown flag " + flag);
    const std::string value = argv[++i];
    try {
      if (flag == "--mb") o.mb = std::stod(value);
      else if (flag == "--checkpoints") o.checkpoints = std::stoi(value);
      else if (flag == "--seconds-between") o.seconds_between = std::stod(value);
      else if (flag == "--dir") o.dir = value;
      else usage_error("unknown flag " + flag);
    } catch (const std::logic_error&) {
      usage_error(flag + " needs a number, got '" + value + "'");
    }
  }
  if (!(o.mb >= 1 && o.mb <= 8192) || o.checkpoints < 1 || !(o.seconds_between > 0))
    usage_error("--mb must be 1 to 8192, --checkpoints at least 1, --seconds-between above 0");
  return o;
}

constexpr std::int64_t width = 2048;  // a 2048 x 2048 Linear layer: 16.8 MB of float parameters

torch::nn::Sequential make_model(double mb) {
  torch::nn::Sequential model;
  const double layer_mb = (width * width + width) * 4.0 / 1e6;
  const int layers = std::max(1, static_cast<int>(std::ceil(mb / layer_mb)));
  for (int i = 0; i < layers; ++i) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::Tanh());
  }
  return model;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <bool Async>
using TrainerOf = dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset,
                                  dtrain::checkpointer::directory<Async>>;

template <bool Async>
int run(const Options& opt) {
  const std::int64_t batch = 8;
  const auto data = dtrain::data::TensorDataset(torch::randn({batch * 64, width}), torch::randn({batch * 64, width}));
  // The run directory is the benchmark's own: removed before and after (a fresh start would keep
  // the earlier run, hundreds of MB, beside it).
  const auto run_dir = std::filesystem::path(opt.dir) / (Async ? "async" : "sync");
  std::filesystem::remove_all(run_dir);
  dtrain::RunConfig run{.storage_path = opt.dir, .name = Async ? "async" : "sync"};
  run.checkpoint.num_to_keep = 1;
  run.progress.verbosity = dtrain::Verbosity::quiet;
  const auto result = TrainerOf<Async>({.num_workers = 1}, run).fit([&](auto& ctx) {
    torch::manual_seed(0);
    auto model = ctx.prepare_model(make_model(opt.mb));
    torch::optim::Adam adam(ctx.parameters(model), torch::optim::AdamOptions(1e-4));
    std::vector<double> quiet_steps, writing_steps;  // steps without and with a write beside them
    double in_checkpoint = 0, in_report = 0, first_checkpoint = 0;
    auto seconds = [](auto t0) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    int written = 0;
    std::int64_t since_checkpoint = -1;  // steps since the last checkpoint; -1: none yet
    auto interval_start = std::chrono::steady_clock::now();
    for (auto epoch : ctx.epochs(1000000)) {
      (void)epoch;
      for (const dtrain::data::Batch& b : ctx.shard(data, batch)) {
        const auto t0 = std::chrono::steady_clock::now();
        adam.zero_grad();
        torch::mse_loss(ctx.forward(model, b.data), b.target).backward();
        ctx.step(adam);
        const double took = seconds(t0);
        // The first 3 steps after a checkpoint run beside its write; the last ones of an interval
        // (its second half) with none.
        const double into = seconds(interval_start);
        if (since_checkpoint >= 0 && since_checkpoint < 3) writing_steps.push_back(took);
        else if (into > opt.seconds_between / 2) quiet_steps.push_back(took);
        if (since_checkpoint >= 0) ++since_checkpoint;
        if (into < opt.seconds_between) continue;
        const auto c0 = std::chrono::steady_clock::now();
        auto snapshot = ctx.checkpoint(model, adam);
        const double took_checkpoint = seconds(c0);
        in_checkpoint += took_checkpoint;
        if (written == 0) first_checkpoint = took_checkpoint;
        const auto r0 = std::chrono::steady_clock::now();
        ctx.report({{"checkpoint", ++written}}, std::move(snapshot));
        in_report += seconds(r0);
        since_checkpoint = 0;
        interval_start = std::chrono::steady_clock::now();
        if (written == opt.checkpoints) break;
      }
      if (written == opt.checkpoints) break;
    }
    ctx.report({{"in_checkpoint_s", in_checkpoint}, {"in_report_s", in_report}, {"first_checkpoint_s", first_checkpoint},
                {"quiet_step_s", median(quiet_steps)}, {"writing_step_s", median(writing_steps)}});
  });
  const auto& st = *result.checkpoint_stats;
  const auto& m = result.metrics;
  nlohmann::json line = {{"mode", Async ? "async" : "sync"},
                         {"checkpoints", st.written},
                         {"seconds_between", opt.seconds_between},
                         {"blocked_s", st.blocked_s},
                         {"write_s", st.write_s},
                         {"blocked_over_write", st.write_s > 0 ? st.blocked_s / st.write_s : 0},
                         {"in_checkpoint_s", m.at("in_checkpoint_s").number()},
                         {"in_report_s", m.at("in_report_s").number()},
                         {"first_checkpoint_s", m.at("first_checkpoint_s").number()},
                         {"quiet_step_s", m.at("quiet_step_s").number()},
                         {"writing_step_s", m.at("writing_step_s").number()}};
  double bytes = 0;
  for (const auto& p : make_model(opt.mb)->parameters()) bytes += static_cast<double>(p.numel()) * 4;
  line["model_mb"] = bytes / 1e6;
  std::filesystem::remove_all(run_dir);
  std::cout << line.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse(argc, argv);
  return opt.sync ? run<false>(opt) : run<true>(opt);
} catch (const dtrain::Error& e) {
  std::cerr << "checkpoint_stall: " << e.what() << "\n";
  return 1;
}
