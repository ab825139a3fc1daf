// SPDX-License-Identifier: Apache-2.0
// The text tagger of text_classifier.cpp tuned the way Made-With-ML tunes it: a search over the
// learning rate and the dropout before the head, ASHA stopping the trials that fall behind, the
// best trial's best checkpoint (by val_loss) scoring the holdout set and raw strings.
//
//   tune_text_classifier --data DIR [--model bag|transformer] [--samples N] [--epochs N]
//       [--scheduler asha|fifo] [--workers N] [--concurrent N] [--seed N] [--global-batch N]
//       [--storage-path DIR] [--name NAME] [--fresh]
//
// Each trial is a dtrain run in STORAGE/NAME/trial_NNNN (its report.html, checkpoints and MLflow
// run); STORAGE/NAME/report.html draws every trial's val_loss. Interrupted (Ctrl-C, SIGTERM, a
// killed process) it continues when run again with the same flags. Prints one JSON line.

#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>

#include <dtrain/data/splits.hpp>
#include <dtrain/dtrain.hpp>
#include <dtrain/data.hpp>
#include <dtrain/models.hpp>
#include <dtrain/inference.hpp>
#include <dtrain/tune.hpp>
#include <dtrain/evaluation/validation.hpp>

#include "text_tagger.hpp"

namespace tune = dtrain::tune;
using namespace text_tagger;

namespace {

struct Options {
  std::string data_dir, model = "bag", scheduler = "asha", storage = "text_runs", name = "tune_text_classifier";
  int samples = 8, workers = 1, concurrent = 0;
  std::int64_t epochs = 10, global_batch = 64, seed = 0;
  bool fresh = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--fresh") {
      o.fresh = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(f + " needs a value");
    const std::string v = argv[++i];
    if (f == "--data") o.data_dir = v;
    else if (f == "--model") o.model = v;
    else if (f == "--scheduler") o.scheduler = v;
    else if (f == "--samples") o.samples = std::stoi(v);
    else if (f == "--epochs") o.epochs = std::stoll(v);
    else if (f == "--workers") o.workers = std::stoi(v);
    else if (f == "--concurrent") o.concurrent = std::stoi(v);
    else if (f == "--seed") o.seed = std::stoll(v);
    else if (f == "--global-batch") o.global_batch = std::stoll(v);
    else if (f == "--storage-path") o.storage = v;
    else if (f == "--name") o.name = v;
    else throw std::invalid_argument("unknown flag " + f + " (see the comment at the top of tune_text_classifier.cpp)");
  }
  if (o.data_dir.empty()) throw std::invalid_argument("--data DIR (holding dataset.csv and holdout.csv) is required");
  if (o.model != "transformer" && o.model != "bag") throw std::invalid_argument("--model is bag or transformer");
  if (o.scheduler != "asha" && o.scheduler != "fifo") throw std::invalid_argument("--scheduler is asha or fifo");
  if (o.epochs < 1 || o.samples < 1) throw std::invalid_argument("--epochs and --samples must be at least 1");
  return o;
}

// What a trial trains with: the search's choices over the defaults (text_classifier's).
struct TaggerConfig {
  double lr = 1e-3;
  double dropout = 0.0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TaggerConfig, lr, dropout)

}  // namespace

template <class Scheduler>
int tune_tagger(const Options& o, Scheduler scheduler) {
  const double started = now_s();
  // The corpus, split, vocabulary and labels: built in every process of the search alike.
  const Rows rows(o.data_dir + "/dataset.csv"), holdout(o.data_dir + "/holdout.csv");
  const auto split = data::stratified_split(rows.tags, 0.2, 0.0, static_cast<std::uint64_t>(o.seed));
  // References, not a structured binding: the trial's lambda captures vocab (Clang before 16
  // refuses a captured binding).
  auto fitted = data::WordVocabulary::fit_transform(rows.texts_at(split.train), 20000, 128);
  auto& vocab = fitted.first;
  auto& train_ids = fitted.second;
  const auto labels = data::LabelEncoder::fit(rows.tags);
  const auto train = batches_of({std::move(train_ids), rows.labels_at(split.train, labels)}, 2);
  const auto val = batches_of({vocab.encode_all(rows.texts_at(split.validation)), rows.labels_at(split.validation, labels)}, 2);

  using Trainer = dtrain::Trainer<TextClassifier, Batches, dtrain::checkpointer::directory<>, dtrain::tracker::mlflow<>>;
  dtrain::RunConfig run{.storage_path = o.storage, .name = o.name};
  run.checkpoint = {.num_to_keep = 1, .score_attribute = "val_loss", .score_order = dtrain::ScoreOrder::min};
  run.progress.verbosity = dtrain::Verbosity::quiet;
  if (o.fresh) run.start = dtrain::Start::fresh;
  Trainer trainer({.num_workers = o.workers}, run);
  const tune::Space space{{"lr", tune::loguniform(1e-4, 1e-2)}, {"dropout", tune::uniform(0.0, 0.5)}};
  tune::Tuner tuner(trainer, space,
                    {.metric = "val_loss", .mode = tune::Mode::min, .num_samples = o.samples,
                     .seed = static_cast<std::uint64_t>(o.seed), .max_concurrent_trials = o.concurrent},
                    scheduler);
  const bool transformer = o.model == "transformer";
  auto grid = tuner.fit([&](Trainer::context& ctx) {
    const auto cfg = tune::config<TaggerConfig>(ctx);
    torch::manual_seed(static_cast<std::uint64_t>(o.seed));
    auto model = ctx.prepare_model(TextClassifier(TextClassifierConfig{vocab.size(), labels.size(), transformer, cfg.dropout}));
    torch::optim::Adam opt(ctx.parameters(model), cfg.lr);
    if (auto ck = ctx.get_checkpoint()) ctx.restore(*ck, model, opt);
    for (auto epoch : ctx.epochs(o.epochs)) {
      model->train();
      for (const auto& b : ctx.shard(train, o.global_batch)) {
        opt.zero_grad();
        ctx.backward(torch::nn::functional::cross_entropy(ctx.forward(model, b["input_ids"], b["attention_mask"]), b["label"]));
        ctx.step(opt);
      }
      model->eval();
      const auto v = dtrain::evaluation::validate(ctx, val, 256 * ctx.world_size(), [&](const data::Fields& b) {
        return dtrain::evaluation::Scored{ctx.forward(model, b["input_ids"], b["attention_mask"]), b["label"]};
      });
      ctx.report({{"epoch", epoch}, {"val_loss", v.loss}, {"val_accuracy", v.accuracy}},
                 ctx.checkpoint(model, opt).with_object("vocab", vocab).with_object("labels", labels));
    }
  });
  const auto& best = grid.best_result(tune::Scope::all);  // the lowest val_loss any epoch reached
  // The best trial's best checkpoint alone: its model, vocabulary and labels; raw strings in.
  auto predictor = dtrain::evaluation::Predictor<TextClassifier>::from_checkpoint<data::WordVocabulary>(
      best.result.best_checkpoint()->path(), dtrain::evaluation::TextInputs{});
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < holdout.table.size(); ++i) {
    const auto tag = std::string(holdout.tags[static_cast<std::size_t>(i)]);
    if (!labels.contains(tag)) continue;
    correct += predictor.predict(std::vector<std::string>{holdout.texts[static_cast<std::size_t>(i)]})[0].label == tag;
  }
  std::int64_t known = 0, epochs_run = 0, early = 0;
  for (std::int64_t i = 0; i < holdout.table.size(); ++i) known += labels.contains(std::string(holdout.tags[static_cast<std::size_t>(i)]));
  for (const auto& t : grid) {
    epochs_run += static_cast<std::int64_t>(t.result.metrics_history.size());
    early += t.stopped_early;
  }
  nlohmann::json line = {{"scheduler", o.scheduler}, {"model", o.model}, {"trials", grid.size()},
                         {"stopped_early", early}, {"epochs_run", epochs_run}, {"errors", grid.errors().size()},
                         {"best_trial", best.id}, {"best_config", best.config},
                         {"best_val_loss", best.score("val_loss", tune::Mode::min, tune::Scope::all)},
                         {"best_checkpoint", best.result.best_checkpoint()->path().string()},
                         {"test_accuracy", known ? static_cast<double>(correct) / static_cast<double>(known) : 0.0},
                         {"report", (grid.path() / "report.html").string()}, {"wall_s", now_s() - started}};
  std::cout << line.dump() << std::endl;
  return 0;
}

int main(int argc, char** argv) try {
  dtrain::retain_freed_memory();
  const auto o = parse(argc, argv);
  if (o.scheduler == "fifo") return tune_tagger(o, tune::fifo{});
  return tune_tagger(o, tune::asha{.max_t = static_cast<double>(o.epochs), .grace_period = 1, .reduction_factor = 2});
} catch (const dtrain::Stopped& e) {
  std::cerr << "tune_text_classifier: " << e.what() << std::endl;
  return 2;
} catch (const std::exception& e) {
  std::cerr << "tune_text_classifier: " << e.what() << std::endl;
  return 1;
}
