// SPDX-License-Identifier: Apache-2.0
// Fashion-MNIST on N workers: the models, optimiser, batch and flags of the PyTorch DDP peer
// (benchmarks/peers/fashion_mnist.py, Python DDP over Gloo; benchmarks/vs_peer.py runs both), ending with one
// JSON line of the peer's keys.
//
//   fashion_mnist --workers 2 --model cnn --epochs 1
//
// Every epoch ends with a test-set evaluation and a checkpoint (checkpointer::directory<>; the 2
// best by test accuracy are kept, beside the latest). SIGINT or SIGTERM (Ctrl-C) stops the training
// at the next step: the epoch so far is evaluated and checkpointed, and running the same command
// again resumes it. --max-failures N restarts the workers after
// a failure, from the latest checkpoint. Running the same --storage-path and --name again resumes
// the earlier run from its latest checkpoint (as Ray Train does); --fresh starts over, and the
// library moves the earlier run aside to <name>.old-<time> (RunConfig::start), deleting nothing.
// --seed N seeds torch and the sampler's shuffle (RunConfig::seed); --deterministic also turns on
// LibTorch's deterministic algorithms (dtrain::enable_reproducibility).
// --strategy fsdp trains with strategy::fsdp<> (parameters, gradients and Adam's state sharded over
// the workers) instead of strategy::ddp<>: both trainers are compiled in, and one loop serves both.
//
// After training, the best checkpoint (by test accuracy) is evaluated on the test set on every
// worker (a Predictor, a confusion matrix summed over the ranks) and its accuracy, precision,
// recall and F1 are printed. The run directory holds params.json, metrics.{jsonl,csv},
// checkpoints.json, evaluations.json, outcome.json, report.html and mlruns/ (tracker::mlflow<>).
// Rank 0 shows a progress line on stderr; --quiet hides it, --verbose adds a line per report.
// The model describes itself (FashionMnistNet's Config): serving builds it from the checkpoint
// alone. --predictions DIR scores the test set with the best checkpoint by batch inference on 2
// workers (--predict-workers N; evaluation::batch_predict), writing DIR/predictions.csv.

#include <dtrain/dtrain.hpp>
#include <dtrain/inference.hpp>

#include "fashion_mnist_models.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace {

const double process_start = dtrain::launch::process_start_unix();

struct Options {
  std::string model = "cnn";
  int workers = 1, threads_per_worker = 1;
  std::int64_t global_batch = 128, epochs = 1;
  std::optional<std::int64_t> max_steps;
  std::string data_dir = dtrain::data::FashionMnist::default_directory;
  std::string storage_path = "dtrain_runs", name = "fashion_mnist", predictions;
  std::uint64_t seed = 0;
  int max_failures = 0, keep = 2, predict_workers = 2;
  std::int64_t report_every = 0, record_every = 10;
  bool fresh = false, deterministic = false;
  std::string strategy = "ddp";
  dtrain::Verbosity verbosity = dtrain::Verbosity::normal;
};

constexpr const char* usage =
    "usage: fashion_mnist [--model cnn|mlp] [--workers N] [--threads-per-worker N]\n"
    "                     [--global-batch N] [--epochs N] [--max-steps N] [--data-dir DIR]\n"
    "                     [--storage-path DIR] [--name NAME] [--seed N]\n"
    "                     [--max-failures N] [--keep-checkpoints N] [--fresh | --resume]\n"
    "                     [--deterministic]\n"
    "                     [--strategy ddp|fsdp] [--report-every STEPS] [--record-every STEPS]\n"
    "                     [--quiet | --verbose] [--predictions DIR [--predict-workers N]]\n";

[[noreturn]] void usage_error(const std::string& why) {
  std::cerr << "fashion_mnist: " << why << "\n" << usage;
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "--help" || flag == "-h") {
      std::cout << usage;
      std::exit(0);
    }
    if (flag == "--resume" || flag == "--fresh" || flag == "--deterministic") {
      // --resume is the default (kept for older command lines).
      if (flag == "--fresh") o.fresh = true;
      if (flag == "--deterministic") o.deterministic = true;
      continue;
    }
    if (flag == "--quiet" || flag == "--verbose") {
      o.verbosity = flag == "--quiet" ? dtrain::Verbosity::quiet : dtrain::Verbosity::verbose;
      continue;
    }
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (flag.rfind("--", 0) == 0) {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      value = argv[++i];
    } else {
      usage_error("unexpected argument '" + flag + "'");
    }
    // An integer in [min, max]; out of range (also past long long) is a usage error naming both.
    auto integer = [&](long long min, long long max) {
      try {
        std::size_t used = 0;
        const long long v = std::stoll(value, &used);
        if (used != value.size() || v < min || v > max) throw std::invalid_argument(value);
        return v;
      } catch (const std::exception&) {
        usage_error(flag + " needs an integer from " + std::to_string(min) + " to " + std::to_string(max) +
                    ", got '" + value + "'");
      }
    };
    constexpr long long int_max = std::numeric_limits<int>::max();
    constexpr long long int64_max = std::numeric_limits<std::int64_t>::max();
    if (flag == "--model") {
      if (value != "cnn" && value != "mlp") usage_error("--model must be cnn or mlp, got '" + value + "'");
      o.model = value;
    } else if (flag == "--workers") o.workers = static_cast<int>(integer(1, 4096));
    else if (flag == "--threads-per-worker") o.threads_per_worker = static_cast<int>(integer(1, 4096));
    else if (flag == "--global-batch") o.global_batch = integer(1, int_max);
    else if (flag == "--epochs") o.epochs = integer(1, int_max);
    else if (flag == "--max-steps") o.max_steps = integer(1, int64_max);
    else if (flag == "--data-dir") o.data_dir = value;
    else if (flag == "--storage-path") o.storage_path = value;
    else if (flag == "--name") o.name = value;
    else if (flag == "--seed") o.seed = static_cast<std::uint64_t>(integer(0, int64_max));
    else if (flag == "--max-failures") o.max_failures = static_cast<int>(integer(-1, int_max));
    else if (flag == "--keep-checkpoints") o.keep = static_cast<int>(integer(0, int_max));
    else if (flag == "--strategy") {
      if (value != "ddp" && value != "fsdp") usage_error("--strategy must be ddp or fsdp, got '" + value + "'");
      o.strategy = value;
    }
    else if (flag == "--report-every") o.report_every = integer(0, int64_max);
    else if (flag == "--record-every") o.record_every = integer(0, int64_max);
    else if (flag == "--predictions") o.predictions = value;
    else if (flag == "--predict-workers") o.predict_workers = static_cast<int>(integer(1, 4096));
    else usage_error("unknown flag " + flag);
  }
  if (o.global_batch % o.workers != 0)
    usage_error("--global-batch " + std::to_string(o.global_batch) + " must be divisible by --workers " +
                std::to_string(o.workers));
  return o;
}

template <class Strategy>
using TrainerWith = dtrain::Trainer<FashionMnistNet, dtrain::data::FashionMnist,
                                    dtrain::backend::gloo, dtrain::sampler::distributed<>,
                                    dtrain::checkpointer::directory<>, Strategy, dtrain::tracker::mlflow<>>;
using Trainer = TrainerWith<dtrain::strategy::ddp<>>;
using FsdpTrainer = TrainerWith<dtrain::strategy::fsdp<>>;
using Predictor = dtrain::evaluation::Predictor<FashionMnistNet>;

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse(argc, argv);
  if (opt.deterministic) dtrain::enable_reproducibility(opt.seed);
  const auto data = dtrain::data::FashionMnist::load(opt.data_dir);  // runs on every worker

  dtrain::RunConfig run{.storage_path = opt.storage_path, .name = opt.name};
  run.start = opt.fresh ? dtrain::Start::fresh : dtrain::Start::resume;
  run.seed = opt.seed;  // the sampler's shuffle
  run.checkpoint = {.num_to_keep = opt.keep, .score_attribute = "test_accuracy",
                    .score_order = dtrain::ScoreOrder::max};
  run.failure.max_failures = opt.max_failures;
  run.progress.verbosity = opt.verbosity;
  run.progress.record_every = opt.record_every;  // rank 0's steps.jsonl: the report's loss curve
  run.train_loop_config = {{"model", opt.model}, {"global_batch", opt.global_batch}, {"epochs", opt.epochs},
                           {"learning_rate", 1e-3}, {"optimizer", "adam"}, {"seed", static_cast<std::int64_t>(opt.seed)},
                           {"max_steps", opt.max_steps ? *opt.max_steps : std::int64_t{-1}}};
  const auto class_names = dtrain::evaluation::class_names(dtrain::data::FashionMnist::class_names);
  const dtrain::ScalingConfig scaling{.num_workers = opt.workers, .threads_per_worker = opt.threads_per_worker};
  // The train loop, the same for both strategies: the optimizer is built over ctx.parameters(model)
  // (fsdp<>: this rank's shards) and the model is called through ctx.forward.
  auto loop = [&](auto& ctx) {
    torch::manual_seed(opt.seed);
    auto model = ctx.prepare_model(FashionMnistNet(FashionMnistConfig{opt.model}));
    torch::optim::Adam adam(ctx.parameters(model), torch::optim::AdamOptions(1e-3));
    const auto& train = data.train();

    // Counters that a resumed run continues from its checkpoint's extras. The sample count is the
    // group's (a resume may have another worker count); the first step's time only when the
    // checkpoint was written by this same invocation (a restart), else this run's startup counts.
    std::int64_t samples = 0, samples_before = 0;
    double loop_s = 0, first_step_unix = 0;
    if (auto ck = ctx.get_checkpoint()) {
      ctx.restore(*ck, model, adam);
      // Typed reads: a value that is not a number is a damaged checkpoint, passed over for an older one.
      samples_before = static_cast<std::int64_t>(
          ck->extra("global_samples", ck->extra("samples", 0) * ck->world_size()));
      loop_s = ck->extra("loop_s", 0);
      if (const double t = ck->extra("first_step_unix", 0); t >= process_start) first_step_unix = t;
    }
    auto done = [&] { return opt.max_steps && ctx.steps() >= *opt.max_steps; };
    if (opt.max_steps) {
      const std::int64_t per_epoch = (static_cast<std::int64_t>(train.size()) + opt.global_batch - 1) / opt.global_batch;
      ctx.set_total_steps(std::min(*opt.max_steps, per_epoch * opt.epochs));
    }
    double last_loss = std::nan("");
    ctx.communicator().barrier();
    for (auto epoch : ctx.epochs(opt.epochs)) {
      (void)epoch;
      model->train();
      const auto epoch_start = std::chrono::steady_clock::now();
      for (const dtrain::data::Batch& batch : ctx.shard(train, opt.global_batch)) {
        if (done()) break;
        adam.zero_grad();
        const torch::Tensor loss = torch::nn::functional::cross_entropy(ctx.forward(model, batch.data), batch.target);
        ctx.backward(loss);
        ctx.step(adam);
        if (first_step_unix == 0) first_step_unix = dtrain::unix_now();
        samples += batch.target.size(0);
        last_loss = loss.item<double>();
        // A finer loss curve than once per epoch: a report without a checkpoint.
        if (opt.report_every > 0 && ctx.steps() % opt.report_every == 0) ctx.report({{"train_loss", last_loss}});
      }
      ctx.communicator().barrier();
      loop_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
      const double global_samples =
          static_cast<double>(samples_before) + ctx.all_reduce(static_cast<double>(samples), dtrain::reduce::sum);
      const double final_loss = ctx.all_reduce(last_loss, dtrain::reduce::mean);

      // Every rank evaluates its contiguous block of the test set; the counts add up exactly.
      model->eval();
      dtrain::evaluation::ConfusionMatrix test_cm(10);
      {
        torch::NoGradGuard no_grad;
        for (const dtrain::data::Batch& batch : ctx.shard(data.test(), 128 * ctx.world_size(), dtrain::sampler::sequential{}))
          test_cm.update(ctx.forward(model, batch.data), batch.target);
      }
      ctx.all_reduce(test_cm);
      // What the largest worker holds: parameters, gradients and Adam's state; and its peak RSS.
      const double state_bytes =
          ctx.all_reduce(static_cast<double>(ctx.model_state_bytes(model, adam)), dtrain::reduce::max);
      const double peak_rss = ctx.all_reduce(dtrain::launch::peak_rss_mb(), dtrain::reduce::max);

      ctx.report({{"steps", ctx.steps()},
                  {"train_samples", static_cast<std::int64_t>(global_samples)},
                  {"train_loop_s", loop_s},
                  {"train_samples_per_s", global_samples / loop_s},
                  {"first_step_unix", first_step_unix},
                  {"final_train_loss", final_loss},
                  {"test_accuracy", test_cm.accuracy()},
                  {"test_f1_macro", test_cm.summary().at("f1_macro")},
                  {"model_state_bytes_per_worker", state_bytes},
                  {"peak_rss_mb", peak_rss}},
                 ctx.checkpoint(model, adam, {{"samples", samples}, {"global_samples", global_samples}, {"loop_s", loop_s},
                                              {"first_step_unix", first_step_unix}}));
      if (done()) break;
    }

    // A stop request (SIGINT, SIGTERM) ended ctx.shard and ctx.epochs early, and the cut epoch
    // was reported and checkpointed above: a re-run resumes there and evaluates at its end.
    if (ctx.should_stop()) return;

    // The best checkpoint, evaluated on the test set by every worker: predictions gathered in
    // order, the confusion matrix summed over the ranks.
    if (auto best = ctx.best_checkpoint()) {
      const auto eval_start = std::chrono::steady_clock::now();
      // The model as the checkpoint says it was built: no sizes here.
      auto predictor = Predictor::from_checkpoint(*best, dtrain::checkpointer::build_model<FashionMnistNet>(*best), class_names);
      dtrain::evaluation::ConfusionMatrix cm(10);
      const auto predictions = predictor.predict(ctx, data.test(), 128 * ctx.world_size(), &cm);
      ctx.record_evaluation("best_checkpoint_test", cm, class_names, best->path().string(),
                            {{"samples", predictions.size()},
                             {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - eval_start).count()}});
    }
  };
  const auto result = opt.strategy == "fsdp" ? FsdpTrainer(scaling, run).fit(loop) : Trainer(scaling, run).fit(loop);

  // Only the driver gets here.
  const auto& m = result.metrics;
  const auto* eval = result.evaluation("best_checkpoint_test");
  // The peer does not evaluate a best checkpoint: wall_s leaves that time out (best_eval_s).
  double eval_s = 0;
  if (eval) {
    const auto driver_eval_start = std::chrono::steady_clock::now();
    const auto& e = eval->metrics;
    std::printf("best checkpoint %s on the test set (%lld samples, %d workers):\n", eval->checkpoint.c_str(),
                static_cast<long long>(e.at("samples").number()), opt.workers);
    std::printf("  accuracy %.4f\n  precision %.4f (macro) %.4f (weighted)\n  recall %.4f (macro) %.4f (weighted)\n"
                "  F1 %.4f (macro) %.4f (weighted)\n",
                e.at("accuracy").number(), e.at("precision_macro").number(), e.at("precision_weighted").number(),
                e.at("recall_macro").number(), e.at("recall_weighted").number(), e.at("f1_macro").number(),
                e.at("f1_weighted").number());
    // Batch prediction in this process: the best checkpoint's answer for the first test images.
    auto predictor = Predictor::best(result.path, run.checkpoint, class_names);
    const auto first = data.test().get_batch(torch::arange(3));
    const auto p = predictor.predict(first.data);
    for (std::int64_t i = 0; i < p.size(); ++i)
      std::printf("  test sample %lld: %s (p=%.3f), true class %s\n", static_cast<long long>(i), p[i].label.c_str(),
                  p[i].probabilities[p[i].class_index], class_names[first.target[i].item<std::int64_t>()].c_str());
    eval_s = eval->metrics.at("seconds").number() +
             std::chrono::duration<double>(std::chrono::steady_clock::now() - driver_eval_start).count();
  }
  // Rounded to `digits` decimals, as the peer rounds its figures.
  auto round = [](double v, int digits) { const double s = std::pow(10.0, digits); return std::round(v * s) / s; };
  const double first_step = m.at("first_step_unix").number();
  nlohmann::json line = {
      {"model", opt.model},
      {"strategy", opt.strategy},
      {"workers", opt.workers},
      {"global_batch", opt.global_batch},
      {"per_worker_batch", opt.global_batch / opt.workers},
      {"threads_per_worker", opt.threads_per_worker},
      {"epochs", opt.epochs},
      {"steps", static_cast<std::int64_t>(m.at("steps").number())},
      {"train_samples", static_cast<std::int64_t>(m.at("train_samples").number())},
      {"train_loop_s", round(m.at("train_loop_s").number(), 3)},
      {"train_samples_per_s", round(m.at("train_samples_per_s").number(), 1)},
      // null when this process trained no step (the run had finished already).
      {"startup_s", first_step >= process_start ? nlohmann::json(round(first_step - process_start, 3)) : nlohmann::json()},
      {"final_train_loss", round(m.at("final_train_loss").number(), 5)},
      {"test_accuracy", round(m.at("test_accuracy").number(), 4)},
      {"run_dir", result.path.string()},
      {"wall_s", round(dtrain::unix_now() - process_start - eval_s, 3)},
      {"restarts", result.restarts},
      {"latest_checkpoint", result.latest_checkpoint() ? result.latest_checkpoint()->path().string() : ""},
      {"model_state_bytes_per_worker", static_cast<std::int64_t>(m.at("model_state_bytes_per_worker").number())},
      {"peak_rss_mb", round(m.at("peak_rss_mb").number(), 1)},
  };
  if (const auto& st = result.checkpoint_stats) {
    line["checkpoint_blocked_s"] = round(st->blocked_s, 4);
    line["checkpoint_write_s"] = round(st->write_s, 4);
    line["checkpoints_written"] = st->written;
  }
  if (opt.max_steps) line["max_steps"] = *opt.max_steps;
  // Batch inference: the best checkpoint over the test set on 2 workers, one predictions file.
  if (!opt.predictions.empty() && result.best_checkpoint()) {
    dtrain::RunConfig scoring{.storage_path = opt.storage_path, .name = opt.name + "_predictions"};
    scoring.progress.verbosity = opt.verbosity;
    const double t0 = dtrain::unix_now();
    const auto out = dtrain::evaluation::batch_predict<FashionMnistNet>(
        result.best_checkpoint()->path(), data.test(),
        {.output = opt.predictions, .class_names = class_names, .start = dtrain::Start::fresh},
        {.num_workers = opt.predict_workers}, scoring);
    const double seconds = dtrain::unix_now() - t0;  // the whole job: workers started, scored, joined
    line["predictions"] = out.file.string();
    line["predictions_samples"] = out.samples;
    line["predict_workers"] = opt.predict_workers;
    line["predictions_s"] = round(seconds, 3);
    line["predictions_samples_per_s"] = round(static_cast<double>(out.samples) / seconds, 1);
  }
  if (eval) {
    for (const char* k : {"accuracy", "precision_macro", "recall_macro", "f1_macro", "f1_weighted"})
      line[std::string("best_") + k] = round(eval->metrics.at(k).number(), 4);
    line["best_eval_s"] = round(eval_s, 3);
  }
  std::cout << line.dump() << std::endl;
  return 0;
} catch (const dtrain::Error& e) {
  std::cerr << "fashion_mnist: " << e.what() << "\n";
  return 1;
}
