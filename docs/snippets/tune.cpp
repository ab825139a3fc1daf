// SPDX-License-Identifier: Apache-2.0
// docs/tune.md's blocks: a search over the docs' Net on 1,024 Fashion-MNIST images (the program
// runs again in each trial's process, as every Tuner program does). Prints the best trial.

#include "snippets.hpp"

#include <iostream>

// [tune includes]
#include <dtrain/dtrain.hpp>
#include <dtrain/tune.hpp>
// [tune includes]

namespace snippets {

// [tune config]
// The loop's own settings, defaults included; the search overrides those the space names.
struct LoopConfig {
  double lr = 0.05;
  std::int64_t hidden = 64;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(LoopConfig, lr, hidden)
// [tune config]

}  // namespace snippets

int main() try {
  using namespace snippets;
  namespace tune = dtrain::tune;
  const auto data = SmallFashionMnist::load();
  // [tune]
  using Trainer = dtrain::Trainer<Net, SmallFashionMnist, dtrain::checkpointer::directory<>, dtrain::tracker::mlflow<>>;
  Trainer trainer({.num_workers = 2}, {.storage_path = "runs", .name = "search", .start = dtrain::Start::fresh});
  const tune::Space space{{"lr", tune::loguniform(1e-3, 0.3)}, {"hidden", tune::choice({32, 64, 128})}};
  tune::Tuner tuner(trainer, space, {.metric = "val_loss", .mode = tune::Mode::min, .num_samples = 4, .seed = 1},
                    tune::asha{.max_t = 4, .grace_period = 1, .reduction_factor = 2});
  auto grid = tuner.fit([&](Trainer::context& ctx) {
    const auto cfg = tune::config<LoopConfig>(ctx);  // this trial's lr and hidden
    auto model = ctx.prepare_model(Net(NetConfig{.hidden = cfg.hidden}));
    torch::optim::SGD optimizer(ctx.parameters(model), cfg.lr);
    if (auto ck = ctx.get_checkpoint()) ctx.restore(*ck, model, optimizer);  // a resumed trial
    for (auto epoch : ctx.epochs(4)) {  // ends early where the scheduler stops the trial
      for (auto batch : ctx.shard(data.train(), 64)) {
        optimizer.zero_grad();
        ctx.backward(torch::nn::functional::cross_entropy(ctx.forward(model, batch.data), batch.target));
        ctx.step(optimizer);
      }
      const auto v = dtrain::evaluation::validate(ctx, data.test(), 256, [&](const dtrain::data::Batch& b) {
        return dtrain::evaluation::Scored{ctx.forward(model, b.data), b.target};
      });
      ctx.report({{"epoch", epoch}, {"val_loss", v.loss}, {"val_accuracy", v.accuracy}}, ctx.checkpoint(model, optimizer));
    }
  });
  const auto& best = grid.best_result();  // by val_loss, lowest
  auto predictor = dtrain::evaluation::Predictor<Net>::from_checkpoint(best.result.best_checkpoint()->path());
  // [tune]
  std::cout << "tune: " << grid.size() << " trials, " << grid.errors().size() << " failed, best " << best.id
            << " val_loss " << best.score("val_loss", tune::Mode::min) << ", predicted "
            << predictor.predict(data.test().get_batch(torch::arange(4)).data)[0].label << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "tune snippet: " << e.what() << "\n";
  return 1;
}
