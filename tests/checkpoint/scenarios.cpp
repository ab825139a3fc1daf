// SPDX-License-Identifier: Apache-2.0
// Checkpoint scenarios: a real driver with real workers over Gloo on loopback, checkpointing with
// checkpointer::directory<>. test_checkpoint.cpp runs this program and checks what it prints, the
// files it leaves and the parameters it saves.
//
//   checkpoint_scenarios --name NAME [--storage DIR] [--workers N] [--steps K] [--every E]
//       [--kill-step S] [--kill-rank R] [--kill-attempts A] [--kill-always 1] [--max-failures F] [--keep N] [--score ATTR]
//       [--order min|max] [--resume-from DIR] [--fault-iteration I] [--out FILE]
//       [--sync 1]         checkpointer::directory<false>: every write done within report() (not with --amp or --fsdp)
//       [--hold-snapshots 1]  the loop keeps a copy of every Snapshot, so that no checkpoint's copies
//                          go into the buffers of an earlier one (SnapshotBuffers falls back to new memory)
//       [--python-optimizer 1]  CheckpointConfig::python_optimizer_state: optimizer_state.pt too
//       [--user-state 1]   a vocabulary file and a learning-rate schedule in every checkpoint
//       [--amp 1]          amp<bf16> with a GradScaler whose scale grows every 3 steps
//       [--schedule cosine|plateau]  schedule::WarmupCosine stepped every step, or
//                          schedule::ReduceLROnPlateau stepped on the mean loss at every checkpoint;
//                          saved in every checkpoint as schedule::checkpoint_name
//       [--fresh 1] [--seed N] [--reproducible N] [--epoch-steps K] [--fail-at-step S] [--final 1]
//       [--hidden N] (another model's shape: its checkpoints do not load into the default one)
//       [--trace DIR]      1008 samples whose last feature is their index; each rank appends
//                          "epoch index step" for every sample it trains to DIR/w<world>_a<attempt>_r<rank>
//       [--min-workers M] [--regrow-after C]  an elastic group (ScalingConfig::min_workers,
//                          regrow_after_checkpoints)
//       [--fsdp 1]         strategy::fsdp<> (its SGD momentum sharded, re-cut when the count changes)
//       [--eval 1] [--eval-samples N]  evaluates a held-out set of N (200) samples with the Trainer's
//                          Sampler at each epoch's start and before each checkpoint, and reports its loss
//                          as eval_loss; rank 0 prints "EVAL batches=K" for each
//
// --kill-step S: rank R (default 1) kills itself with SIGKILL after S steps, in attempts below A
// (default 1), or in every attempt with --kill-always 1. With --kill-settled 1 every rank first
// waits for the checkpoints in flight (ctx.best_checkpoint()), so the latest one at the kill is known.
//
// --epoch-steps K leaves every epoch after K steps with ctx.end_epoch(); --fail-at-step S throws
// at step S on every attempt; --seed N is RunConfig::seed; --reproducible N calls
// dtrain::enable_reproducibility(N) before fit(); --final 1 checkpoints once more after the loop.

#include <dtrain/dtrain.hpp>
#include <dtrain/schedule/plateau.hpp>
#include <dtrain/schedule/warmup_cosine.hpp>

#include "crashing_checkpointer.hpp"

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace {

struct Args {
  std::string name = "run", storage = "checkpoint_runs", out, score, order = "max", resume_from, schedule, trace;
  int workers = 2, steps = 40, every = 5, kill_step = -1, max_failures = 0, keep = 0;
  int epoch_steps = -1, fail_at_step = -1, hidden = 32;
  int kill_rank = 1, kill_attempts = 1, min_workers = 0, regrow_after = 2;
  bool kill_settled = false;
  bool kill_always = false, user_state = false, amp = false, fresh = false, final_checkpoint = false, fsdp = false;
  bool sync = false, hold_snapshots = false, python_optimizer = false, eval = false;
  std::int64_t eval_samples = 200;
  std::optional<std::uint64_t> seed, reproducible;
  std::int64_t batch = 32;
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
    else if (f == "--kill-step") a.kill_step = std::stoi(v);
    else if (f == "--kill-always") a.kill_always = v == "1";
    else if (f == "--kill-rank") a.kill_rank = std::stoi(v);
    else if (f == "--kill-settled") a.kill_settled = v == "1";
    else if (f == "--kill-attempts") a.kill_attempts = std::stoi(v);
    else if (f == "--min-workers") a.min_workers = std::stoi(v);
    else if (f == "--regrow-after") a.regrow_after = std::stoi(v);
    else if (f == "--max-failures") a.max_failures = std::stoi(v);
    else if (f == "--keep") a.keep = std::stoi(v);
    else if (f == "--score") a.score = v;
    else if (f == "--order") a.order = v;
    else if (f == "--resume-from") a.resume_from = v;
    else if (f == "--fault-iteration") dtrain_test::crash_at_iteration = std::stoll(v);
    else if (f == "--out") a.out = v;
    else if (f == "--batch") a.batch = std::stoll(v);
    else if (f == "--user-state") a.user_state = v == "1";
    else if (f == "--amp") a.amp = v == "1";
    else if (f == "--fsdp") a.fsdp = v == "1";
    else if (f == "--schedule") a.schedule = v;
    else if (f == "--fresh") a.fresh = v == "1";
    else if (f == "--sync") a.sync = v == "1";
    else if (f == "--hold-snapshots") a.hold_snapshots = v == "1";
    else if (f == "--python-optimizer") a.python_optimizer = v == "1";
    else if (f == "--final") a.final_checkpoint = v == "1";
    else if (f == "--hidden") a.hidden = std::stoi(v);
    else if (f == "--seed") a.seed = std::stoull(v);
    else if (f == "--reproducible") a.reproducible = std::stoull(v);
    else if (f == "--epoch-steps") a.epoch_steps = std::stoi(v);
    else if (f == "--fail-at-step") a.fail_at_step = std::stoi(v);
    else if (f == "--trace") a.trace = v;
    else if (f == "--eval") a.eval = v == "1";
    else if (f == "--eval-samples") a.eval_samples = std::stoll(v);
    else if (f == "--tag") {}  // only marks the processes
    else throw std::invalid_argument("unknown flag " + f);
  }
  return a;
}

dtrain::data::TensorDataset synthetic(std::int64_t n, std::int64_t features) {
  auto gen = at::detail::createCPUGenerator(1234);
  auto x = at::randn({n, features}, gen);
  auto y = at::randint(0, 10, {n}, gen);
  return {x, y};
}

// The same kind of set, each sample's last feature its index / 1024 (exact in float): the samples
// a rank trains on can be counted.
dtrain::data::TensorDataset indexed(std::int64_t n) {
  auto gen = at::detail::createCPUGenerator(1234);
  auto x = at::randn({n, 20}, gen);
  auto y = at::randint(0, 10, {n}, gen);
  x.select(1, 19).copy_(torch::arange(n, torch::kFloat) / 1024);
  return {x, y};
}

// Dropout draws from each rank's generator, and momentum keeps optimizer state: an exact resume
// needs both restored.
torch::nn::Sequential small_model(std::int64_t hidden = 32) {
  using namespace torch::nn;
  return Sequential(Linear(20, hidden), Tanh(), Dropout(0.2), Linear(hidden, 32), Tanh(), Linear(32, 10));
}

// A scheduler-like user object: the learning rate decays every step, so a resume that lost its
// state would train with another rate and end with other parameters.
struct StepDecay {
  double lr = 0.05;
  std::int64_t steps = 0;
  double next() {
    ++steps;
    lr *= 0.98;
    return lr;
  }
  void save(torch::serialize::OutputArchive& a) const {
    a.write("lr", torch::tensor(lr, torch::kDouble));
    a.write("steps", torch::tensor(steps));
  }
  void load(torch::serialize::InputArchive& a) {
    torch::Tensor l, s;
    a.read("lr", l);
    a.read("steps", s);
    lr = l.item<double>();
    steps = s.item<std::int64_t>();
  }
};

// checkpointer::directory<>, with a crash in the middle of one write when --fault-iteration asks.
using PlainTrainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset, dtrain_test::crashing_directory>;

// Loss scaling whose state changes within a short run: the scale doubles every 3 clean steps, so a
// resume that did not restore the GradScaler would report another loss_scale.
struct fast_growth {
  static constexpr bool enabled = true;
  static constexpr dtrain::precision::GradScalerOptions options{.init_scale = 1024, .growth_interval = 3};
};
using SyncTrainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset, dtrain::checkpointer::directory<false>>;

using AmpTrainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset, dtrain_test::crashing_directory,
                                   dtrain::precision::amp<dtrain::precision::bf16, fast_growth>>;
using FsdpTrainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset, dtrain_test::crashing_directory,
                                    dtrain::strategy::fsdp<>>;

template <class Trainer>
int train(const Args& a) {
  const auto data = a.trace.empty() ? synthetic(1024, 20) : indexed(1008);
  const auto held_out = synthetic(a.eval_samples, 20);
  dtrain::RunConfig run{.storage_path = a.storage, .name = a.name,
                        .rendezvous_timeout = std::chrono::seconds(20),
                        .collective_timeout = std::chrono::seconds(20)};
  run.checkpoint = {.num_to_keep = a.keep, .score_attribute = a.score,
                    .score_order = a.order == "min" ? dtrain::ScoreOrder::min : dtrain::ScoreOrder::max,
                    .python_optimizer_state = a.python_optimizer};
  run.failure.max_failures = a.max_failures;
  if (!a.resume_from.empty()) run.resume_from = a.resume_from;
  if (a.fresh) run.start = dtrain::Start::fresh;
  run.seed = a.seed;
  run.failure.restart_backoff = std::chrono::milliseconds(100);
  dtrain::ScalingConfig scaling{.num_workers = a.workers, .regrow_after_checkpoints = a.regrow_after};
  if (a.min_workers > 0) scaling.min_workers = a.min_workers;
  Trainer trainer(scaling, run);

  const auto result = trainer.fit([&](typename Trainer::context& ctx) {
    torch::manual_seed(ctx.world_rank() + 7);
    auto model = ctx.prepare_model(small_model(a.hidden));
    torch::optim::SGD sgd(ctx.parameters(model), torch::optim::SGDOptions(0.05).momentum(0.9));
    StepDecay decay;
    std::vector<dtrain::checkpointer::Snapshot> held;  // --hold-snapshots: copies share the tensors
    // Built before the restore, as a user would: load() sets the saved rates and counters.
    std::optional<dtrain::schedule::WarmupCosine> cosine;
    std::optional<dtrain::schedule::ReduceLROnPlateau> plateau;
    if (a.schedule == "cosine") cosine.emplace(sgd, dtrain::schedule::WarmupCosineOptions{.warmup_steps = 5, .total_steps = a.steps});
    if (a.schedule == "plateau")
      plateau.emplace(sgd, dtrain::schedule::PlateauOptions{.factor = 0.5, .patience = 0, .threshold = 0.02});
    const std::string vocab = "vocab.txt";  // rank 0's, in the working directory
    if (auto ck = ctx.get_checkpoint()) {
      ctx.restore(*ck, model, sgd);
      if (a.user_state) {
        ck->load_object("scheduler", decay);
        std::ifstream in(ck->file("vocab.txt"));
        const std::string text{std::istreambuf_iterator<char>(in), {}};
        if (ctx.world_rank() == 0)
          std::cerr << "USER STATE scheduler " << (decay.steps == ck->steps() ? "ok" : "bad") << " vocabulary "
                    << (text == "steps " + std::to_string(ck->steps()) + "\n" ? "ok" : "bad") << std::endl;
      }
      if (cosine) ck->load_object(dtrain::schedule::checkpoint_name, *cosine);
      if (plateau) ck->load_object(dtrain::schedule::checkpoint_name, *plateau);
      if (ctx.world_rank() == 0)
        std::cerr << "RESUMED " << ck->path().string() << " steps=" << ck->steps() << std::endl;
    }
    // --eval: the held-out loss over a shard of the Trainer's Sampler, as a user writes it; eval
    // mode, so Dropout draws nothing and the training's generator is untouched.
    auto evaluate = [&] {
      double sum = 0;
      std::int64_t batches = 0;
      if (!a.eval) return sum;
      torch::NoGradGuard no_grad;
      model->eval();
      for (auto batch : ctx.shard(held_out, a.batch)) {
        sum += torch::nn::functional::cross_entropy(ctx.forward(model, batch.data), batch.target).template item<double>();
        ++batches;
      }
      model->train();
      if (ctx.world_rank() == 0) std::cerr << "EVAL batches=" << batches << std::endl;
      return ctx.all_reduce(sum, dtrain::reduce::sum);
    };
    model->train();
    for (auto epoch : ctx.epochs(1000)) {
      (void)epoch;
      (void)evaluate();
      for (auto batch : ctx.shard(data, a.batch)) {
        // A per-epoch step cap: the batches this epoch finished, resumed ones included.
        if (ctx.sampler_position() == a.epoch_steps) {
          ctx.end_epoch();
          break;
        }
        if (ctx.steps() == a.steps) break;
        if (ctx.steps() == a.fail_at_step) throw std::runtime_error("the same failure at step " + std::to_string(a.fail_at_step));
        if (!a.trace.empty()) {
          std::ofstream log(a.trace + "/w" + std::to_string(ctx.world_size()) + "_a" + std::to_string(ctx.attempt()) +
                                "_r" + std::to_string(ctx.world_rank()),
                            std::ios::app);
          const auto index = (batch.data.select(1, 19) * 1024).round().to(torch::kLong);
          for (std::int64_t i = 0; i < index.size(0); ++i)
            log << ctx.epoch() << ' ' << index[i].template item<std::int64_t>() << ' ' << ctx.steps() + 1 << '\n';
        }
        if (ctx.world_rank() == 0 && std::getenv("SCENARIO_TRACE"))
          std::cerr << "TRAIN epoch=" << ctx.epoch() << " first=" << batch.target[0].template item<std::int64_t>() << std::endl;
        if (ctx.steps() == a.kill_step && (a.kill_always || ctx.attempt() < a.kill_attempts)) {
          if (a.kill_settled && ctx.world_size() > a.kill_rank) (void)ctx.best_checkpoint();
          if (ctx.world_rank() == a.kill_rank) std::raise(SIGKILL);
        }
        if (a.user_state)
          for (auto& group : sgd.param_groups()) static_cast<torch::optim::SGDOptions&>(group.options()).lr(decay.next());
        sgd.zero_grad();
        torch::Tensor loss;
        {
          auto autocast = ctx.autocast();
          loss = torch::nn::functional::cross_entropy(ctx.forward(model, batch.data), batch.target);
        }
        ctx.backward(loss);
        ctx.step(sgd);
        if (cosine) cosine->step();
        if (ctx.steps() % a.every == 0) {
          const auto s = ctx.steps();
          if (plateau) plateau->step(ctx.all_reduce(loss.item<double>()));
          const double eval_loss = evaluate();
          auto snapshot = ctx.checkpoint(model, sgd, {{"extra_steps", s}});
          if (a.hold_snapshots) held.push_back(snapshot);
          if (cosine) snapshot.with_object(dtrain::schedule::checkpoint_name, *cosine);
          if (plateau) snapshot.with_object(dtrain::schedule::checkpoint_name, *plateau);
          if (a.user_state) {
            if (ctx.world_rank() == 0) std::ofstream(vocab) << "steps " << s << "\n";
            snapshot.with_file("vocab.txt", vocab).with_object("scheduler", decay);
          }
          dtrain::Metrics metrics{{"loss", loss.item<double>()}, {"score", (s * 7) % 11}};
          if (a.eval) metrics["eval_loss"] = eval_loss;
          ctx.report(metrics, std::move(snapshot));
        }
      }
      if (ctx.steps() == a.steps) break;
    }
    // A checkpoint after the loop (as the example's epoch-end one): its position is what the loop
    // finished, not the batch it broke out on.
    if (a.final_checkpoint && ctx.steps() % a.every != 0) {
      dtrain::Metrics metrics{{"loss", 0.0}, {"score", 0}};
      if (a.eval) metrics["eval_loss"] = evaluate();  // after the loop broke out mid-epoch: it moves no position
      ctx.report(metrics, ctx.checkpoint(model, sgd, {{"extra_steps", ctx.steps()}}));
    }
    // The full parameters (under fsdp<> a collective, so every rank asks).
    const auto full = a.out.empty() ? c10::Dict<std::string, at::Tensor>() : ctx.full_state(model);
    if (ctx.world_rank() == 0) {
      if (!a.out.empty()) {
        std::vector<torch::Tensor> params;
        for (const auto& p : model->named_parameters()) params.push_back(full.at(p.key()));
        torch::save(params, a.out);
      }
      std::ostringstream lr;
      lr.precision(17);
      lr << sgd.param_groups()[0].options().get_lr();
      std::cerr << "FINAL lr=" << lr.str() << std::endl;
      const auto& st = ctx.checkpoint_stats();
      std::cerr << "STATS blocked_s=" << st.blocked_s << " write_s=" << st.write_s << " written=" << st.written
                << std::endl;
    }
  });
  std::cout << "RESULT restarts=" << result.restarts << " rows=" << result.metrics_history.size()
            << " latest=" << (result.latest_checkpoint() ? result.latest_checkpoint()->path().string() : "-")
            << " best=" << (result.best_checkpoint() ? result.best_checkpoint()->path().string() : "-");
  for (const auto& [k, v] : result.metrics) std::cout << ' ' << k << '=' << v.text();
  std::cout << " groups=";
  for (const auto& g : result.groups) std::cout << g.world_size << '@' << g.step << ':' << g.reason << ';';
  std::cout << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  if (a.reproducible) dtrain::enable_reproducibility(*a.reproducible);
  if (a.sync + a.amp + a.fsdp > 1) throw std::invalid_argument("--sync 1, --amp 1 and --fsdp 1 are built one at a time; pass one");
  if (a.fsdp) return train<FsdpTrainer>(a);
  if (a.sync) return train<SyncTrainer>(a);
  return a.amp ? train<AmpTrainer>(a) : train<PlainTrainer>(a);
} catch (const dtrain::Error& e) {
  std::cout << "ERROR " << e.what() << std::endl;
  return 3;
}
