// SPDX-License-Identifier: Apache-2.0
// docs/checkpoints.md's C++ block (a run with retention by score and restarts), and guide.md's
// batch prediction block, which loads that run's best checkpoint. `snippets checkpoints run` runs both.

#include "snippets.hpp"

#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>

namespace snippets {
namespace {

int run_then_predict() {
  const auto data = SmallFashionMnist::load();
  // The test split's accuracy, every rank its block (as guide.md's evaluation block).
  auto test_accuracy = [&](auto& ctx, Net& model) {
    torch::NoGradGuard no_grad;
    dtrain::evaluation::ConfusionMatrix cm(10);
    for (auto batch : ctx.shard(data.test(), 128 * ctx.world_size(), dtrain::sampler::sequential{}))
      cm.update(model->forward(batch.data), batch.target);
    ctx.all_reduce(cm);
    return cm.accuracy();
  };
  // [checkpoints.md]
  using Trainer = dtrain::Trainer<Net, dtrain::data::FashionMnist, dtrain::checkpointer::directory<>>;

  dtrain::RunConfig run{.storage_path = "runs", .name = "fmnist"};
  run.checkpoint = {.num_to_keep = 2, .score_attribute = "test_accuracy", .score_order = dtrain::ScoreOrder::max};
  run.failure.max_failures = 3;
  Trainer trainer({.num_workers = 2}, run);
  auto result = trainer.fit([&](Trainer::context& ctx) {
    auto model = ctx.prepare_model(Net{});
    torch::optim::Adam opt(model->parameters());
    if (auto ck = ctx.get_checkpoint()) ctx.restore(*ck, model, opt);  // model, optimizer, RNGs, GradScaler
    std::int64_t n = 0;                                             // a counter of the loop's own
    for (auto epoch : ctx.epochs(10)) {                             // starts at the checkpoint's epoch
      for (auto batch : ctx.shard(data.train(), 128)) {            // skips the batches it had consumed
        opt.zero_grad();
        ctx.backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
        ctx.step(opt);
        ++n;
      }
      const double acc = test_accuracy(ctx, model);           // guide.md's evaluation block
      ctx.report({{"test_accuracy", acc}}, ctx.checkpoint(model, opt, {{"my_counter", n}}));
    }
  });
  Net net;
  result.best_checkpoint()->load_model(net);
  // [checkpoints.md]
  std::cout << "checkpoints: " << result.metrics_history.size() << " reports, best "
            << result.best_checkpoint()->path().filename().string() << " of " << run.checkpoint.num_to_keep << " kept\n";
  const auto images = data.test().data().narrow(0, 0, 4);
  // [prediction]
  using Predictor = dtrain::evaluation::Predictor<Net>;
  const auto names = dtrain::evaluation::class_names(dtrain::data::FashionMnist::class_names);
  auto predictor = Predictor::best(result.path, run.checkpoint, names);  // best by score, Net from its config
  // or Predictor::from_checkpoint(result.best_checkpoint()->path())
  const auto p = predictor.predict(images);       // p[i].label, p[i].class_index, p[i].probabilities
  // [prediction]
  std::cout << "prediction: " << p[0].label << " (" << p[0].class_index << ")\n";
  // [batch inference]
  namespace ev = dtrain::evaluation;
  const auto scored = ev::batch_predict<Net>(result.best_checkpoint()->path(), data.test(),
                                             {.output = "predictions", .class_names = names}, {.num_workers = 2});
  // scored.file: predictions/predictions.csv, one row per test sample, in order
  // [batch inference]
  std::ifstream csv(scored.file);
  std::string header, first;
  std::getline(csv, header);
  std::getline(csv, first);
  std::cout << "batch: " << scored.samples << " predictions in " << scored.file.string() << ", the first "
            << first.substr(0, first.find(',', first.find(',') + 1)) << ", the job's record "
            << (std::filesystem::exists("predictions/run/outcome.json") ? "in predictions/run" : "missing") << "\n";
  // [later process]
  // Another process, later: the run's record and its checkpoints, read back from the storage path.
  const auto record = dtrain::Result::from_path("runs/fmnist");
  const auto best = record.best_checkpoint();  // by the run's score, as it was kept
  std::string why;
  const auto opened = dtrain::checkpointer::Checkpoint::open(best->path(), &why);  // every file's size and CRC-32
  if (!opened) throw std::runtime_error(why);  // why: the damaged file and field
  Net later;
  opened->load_model(later);  // as Predictor::from_checkpoint(best->path()) and batch_predict do
  // [later process]
  std::cout << "later: " << opened->path().filename().string() << " opened, test_accuracy "
            << opened->metrics().at("test_accuracy").number() << "\n";
  return 0;
}

// A learning-rate schedule of the loop's own: state that changes every epoch and must survive a
// restart (save/load make it a checkpointer::SavableState).
struct StepSchedule {
  std::int64_t epochs_seen = 0;
  double lr() const { return 1e-3 * (epochs_seen >= 2 ? 0.5 : 1.0); }
  void save(torch::serialize::OutputArchive& archive) const { archive.write("epochs_seen", torch::tensor(epochs_seen)); }
  void load(torch::serialize::InputArchive& archive) {
    torch::Tensor t;
    archive.read("epochs_seen", t);
    epochs_seen = t.item<std::int64_t>();
  }
};

int user_state() {
  const auto data = SmallFashionMnist::load();
  std::ofstream("vocab.txt") << "shirt\ntrouser\n";
  using Trainer = dtrain::Trainer<Net, dtrain::data::FashionMnist, dtrain::checkpointer::directory<>>;
  Trainer trainer({.num_workers = 2}, {.storage_path = "runs", .name = "user_state"});
  std::string first_word;
  auto result = trainer.fit([&](Trainer::context& ctx) {
    auto model = ctx.prepare_model(Net{});
    torch::optim::Adam opt(model->parameters());
    StepSchedule scheduler;
    // [user state: restore]
    if (auto ck = ctx.get_checkpoint()) {
      ctx.restore(*ck, model, opt);
      ck->load_object("scheduler", scheduler);
      std::ifstream vocab(ck->file("vocab.txt"));  // or ck->as_directory() / "vocab.txt"
    }
    // [user state: restore]
    for (auto epoch : ctx.epochs(3)) {
      double loss = 0;
      for (auto batch : ctx.shard(data.train(), 128)) {
        opt.zero_grad();
        auto l = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
        ctx.backward(l);
        ctx.step(opt);
        loss = l.item<double>();
      }
      ++scheduler.epochs_seen;
      // [user state: save]
      auto snapshot = ctx.checkpoint(model, opt).with_file("vocab.txt", "vocab.txt").with_object("scheduler", scheduler);
      ctx.report({{"loss", loss}}, std::move(snapshot));
      // [user state: save]
      (void)epoch;
    }
  });
  std::ifstream saved(result.latest_checkpoint()->file("vocab.txt"));
  std::getline(saved, first_word);
  StepSchedule restored;
  result.latest_checkpoint()->load_object("scheduler", restored);
  std::cout << "user state: " << first_word << ", scheduler at " << restored.epochs_seen << " epochs\n";
  return 0;
}


int schedules() {
  const auto data = SmallFashionMnist::load();
  using Trainer = dtrain::Trainer<Net, dtrain::data::FashionMnist, dtrain::checkpointer::directory<>,
                                  dtrain::precision::amp<dtrain::precision::bf16, dtrain::precision::dynamic_loss_scale>>;
  Trainer trainer({.num_workers = 2}, {.storage_path = "runs", .name = "schedules"});
  auto result = trainer.fit([&](Trainer::context& ctx) {
    auto model = ctx.prepare_model(Net{});
    // [schedules]
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    dtrain::schedule::ReduceLROnPlateau schedule(opt, {.factor = 0.5, .patience = 1});
    if (auto ck = ctx.get_checkpoint()) {
      ctx.restore(*ck, model, opt);  // state and param-group options (lr, momentum), RNGs, GradScaler
      ck->load_object(dtrain::schedule::checkpoint_name, schedule);  // its counters and best metric
    }
    for (auto epoch : ctx.epochs(3)) {
      double loss = 0;
      for (auto batch : ctx.shard(data.train(), 128)) {
        opt.zero_grad();
        torch::Tensor l;
        {
          auto autocast = ctx.autocast();
          l = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
        }
        ctx.backward(l);
        ctx.step(opt);
        loss = l.item<double>();
      }
      const double mean_loss = ctx.all_reduce(loss);  // the same metric on every rank
      schedule.step(mean_loss);
      ctx.report({{"loss", mean_loss}, {"lr", schedule.lrs()[0]}},
                 ctx.checkpoint(model, opt).with_object(dtrain::schedule::checkpoint_name, schedule));
      (void)epoch;
    }
    // [schedules]
  });
  const auto ck = result.latest_checkpoint();
  std::cout << "schedules: " << result.metrics_history.size() << " reports, schedule saved "
            << (ck->has_object(dtrain::schedule::checkpoint_name) ? "yes" : "no") << "\n";
  // model.pt is in torch.save's format, as a Python user's exported state_dict is.
  const auto model_file = ck->path() / "model.pt";
  // [weights]
  Net pretrained;
  const auto report = dtrain::weights::load_python_state_dict(*pretrained, model_file, {.strict = false});
  for (const auto& name : report.missing) std::cout << "not in the file: " << name << '\n';
  for (const auto& name : report.unexpected) std::cout << "not in the model: " << name << '\n';
  // [weights]
  std::cout << "weights: " << report.loaded << " loaded\n";
  // [safetensors]
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& p : pretrained->named_parameters()) named.emplace_back(p.key(), p.value());
  dtrain::weights::save_safetensors("model.safetensors", named, {{"format", "pt"}});
  Net reloaded;  // weights::load takes safetensors, a sharded index, a model directory or model.pt
  const auto again = dtrain::weights::load(*reloaded, "model.safetensors");
  // [safetensors]
  std::cout << "safetensors: " << again.loaded << " loaded, equal "
            << torch::equal(reloaded->fc1->weight, pretrained->fc1->weight) << "\n";
  return 0;
}

}  // namespace

int checkpoints(const std::string& block) {
  fresh_directory("checkpoints_" + block);
  if (block == "run") return run_then_predict();
  if (block == "user_state") return user_state();
  if (block == "schedules") return schedules();
  std::cerr << "snippets checkpoints: no block " << block << "; the block is run\n";
  return 2;
}

}  // namespace snippets
