// SPDX-License-Identifier: Apache-2.0
// docs/guide.md's C++ blocks, in the order the guide shows them. `snippets guide <block>` runs one.

#include "snippets.hpp"

#include <iostream>
#include <string>

namespace snippets {
namespace {

const SmallFashionMnist& data() {
  static const SmallFashionMnist d = SmallFashionMnist::load();
  return d;
}

int trainer_and_configuration() {
  // [trainer]
  using Trainer = dtrain::Trainer<Net,                          // Model
                                  dtrain::data::FashionMnist,   // Dataset
                                  dtrain::strategy::fsdp<>>;    // Policies...: at most one per category
  // [trainer]
  // [run configuration]
  Trainer trainer(dtrain::ScalingConfig{.num_workers = 2, .threads_per_worker = 1},
                  dtrain::RunConfig{.storage_path = "runs", .name = "fmnist",
                                    .rendezvous_timeout = std::chrono::seconds(60),
                                    .collective_timeout = std::chrono::seconds(300)});
  // [run configuration]
  std::cout << "trainer: " << trainer.scaling_config().num_workers << " workers, run directory "
            << trainer.run_config().path().string() << '\n';
  return 0;
}

int sharded() {
  const auto& data = snippets::data();
  // [fsdp]
  using Trainer = dtrain::Trainer<Net, dtrain::data::FashionMnist, dtrain::checkpointer::directory<>,
                                  dtrain::strategy::fsdp<>>;   // or strategy::ddp<>
  Trainer trainer({.num_workers = 2}, {.storage_path = "runs", .name = "fsdp"});
  auto result = trainer.fit([&](auto& ctx) {
    auto model = ctx.prepare_model(Net{});
    torch::optim::Adam opt(ctx.parameters(model), 1e-3);      // not model->parameters()
    if (auto ck = ctx.get_checkpoint()) ctx.restore(*ck, model, opt);
    for (auto epoch : ctx.epochs(10)) {
      for (const dtrain::data::Batch& batch : ctx.shard(data.train(), 128)) {
        opt.zero_grad();
        torch::Tensor loss = torch::nn::functional::cross_entropy(ctx.forward(model, batch.data), batch.target);
        ctx.backward(loss);
        ctx.step(opt);
      }
      ctx.report({{"epoch", epoch}}, ctx.checkpoint(model, opt));
    }
  });
  // [fsdp]
  std::cout << "fsdp: " << result.metrics_history.size() << " reports, latest "
            << result.latest_checkpoint()->path().filename().string() << '\n';
  return 0;
}

int checkpoints_in_the_loop() {
  const auto& data = snippets::data();
  using Trainer = dtrain::Trainer<Net, dtrain::data::FashionMnist, dtrain::checkpointer::directory<>>;
  Trainer trainer({.num_workers = 2}, {.storage_path = "runs", .name = "checkpoints"});
  auto result = trainer.fit([&](Trainer::context& ctx) {
    auto model = ctx.prepare_model(Net{});
    torch::optim::SGD opt(model->parameters(), 0.05);
    std::int64_t n = 0;
    auto train_step = [&](const dtrain::data::Batch& batch) {
      opt.zero_grad();
      ctx.backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
      ctx.step(opt);
      ++n;
    };
    auto val_loss = [&] {
      torch::NoGradGuard no_grad;
      const auto& test = data.test();
      return torch::nn::functional::cross_entropy(model->forward(test.data()), test.targets()).template item<double>();
    };
    // [checkpoints]
    if (auto ck = ctx.get_checkpoint()) ctx.restore(*ck, model, opt);  // resume: model, optimizer, RNG
    for (auto epoch : ctx.epochs(10)) {                                // from the checkpoint's epoch
      for (auto batch : ctx.shard(data.train(), 128)) train_step(batch);  // skipping consumed batches
      ctx.report({{"val_loss", val_loss()}}, ctx.checkpoint(model, opt, {{"my_counter", n}}));
    }
    // [checkpoints]
  });
  std::cout << "checkpoints: " << result.metrics_history.size() << " reports, val_loss "
            << result.metrics.at("val_loss").number() << '\n';
  return 0;
}

int evaluation() {
  const auto& data = snippets::data();
  using Trainer = dtrain::Trainer<Net, dtrain::data::FashionMnist>;
  Trainer trainer({.num_workers = 3}, {.storage_path = "runs", .name = "evaluation"});
  auto result = trainer.fit([&](Trainer::context& ctx) {
    auto model = ctx.prepare_model(Net{});
    torch::optim::Adam opt(model->parameters(), 1e-3);
    for (auto epoch : ctx.epochs(3)) {
      (void)epoch;
      for (auto batch : ctx.shard(data.train(), 96)) {
        opt.zero_grad();
        ctx.backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
        ctx.step(opt);
      }
    }
    torch::NoGradGuard no_grad;
    // [evaluation]
    dtrain::evaluation::ConfusionMatrix cm(10);
    for (auto batch : ctx.shard(data.test(), 128 * ctx.world_size(), dtrain::sampler::sequential{}))
      cm.update(model->forward(batch.data), batch.target);
    ctx.all_reduce(cm);
    ctx.report(cm.summary("test_"));
    // [evaluation]
  });
  std::cout << "evaluation: test_accuracy " << result.metrics.at("test_accuracy").number() << ", test_f1_macro "
            << result.metrics.at("test_f1_macro").number() << '\n';
  return 0;
}

}  // namespace

// The preemption block: a loop that never asks whether it is being stopped, yet stops at the next
// step when asked, and saves a checkpoint there (nothing signals this run, so it trains to the end
// and reports each epoch; tests/signals sends the signals).
int preemption() {
  const auto& train = data().train();
  using Trainer = dtrain::Trainer<Net, dtrain::data::FashionMnist, dtrain::checkpointer::directory<>>;
  Trainer trainer({.num_workers = 2}, {.storage_path = "runs", .name = "preemption"});
  const std::int64_t epochs = 2;
  auto result = trainer.fit([&](Trainer::context& ctx) {
    auto model = ctx.prepare_model(Net{});
    torch::optim::Adam optimizer(model->parameters(), 1e-3);
    double last_loss = 0;
    // [preemption]
    for (auto epoch : ctx.epochs(epochs)) {         // no epoch begins once the run is stopping
      for (auto batch : ctx.shard(train, 256)) {    // ends at the step the ranks agreed to stop at
        optimizer.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
        ctx.backward(loss);
        ctx.step(optimizer);
        last_loss = loss.item<double>();
      }
      // The epoch's end, or where a stop cut it: a re-run resumes from this checkpoint.
      ctx.report({{"loss", last_loss}, {"epoch", epoch}}, ctx.checkpoint(model, optimizer));
    }
    // [preemption]
  });
  std::cout << "preemption: " << result.metrics_history.size() << " reports\n";
  return 0;
}

// The Result block: a run that does not throw, its best checkpoints, and the Result read back.
int result_without_throw() {
  const auto& data = snippets::data();
  using Trainer = dtrain::Trainer<Net, dtrain::data::FashionMnist, dtrain::checkpointer::directory<>>;
  auto loop = [&](Trainer::context& ctx) {
    auto model = ctx.prepare_model(Net{});
    torch::optim::Adam opt(model->parameters(), 1e-3);
    for (auto epoch : ctx.epochs(2)) {
      for (auto batch : ctx.shard(data.train(), 128)) {
        opt.zero_grad();
        ctx.backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
        ctx.step(opt);
      }
      ctx.report({{"epoch", epoch}}, ctx.checkpoint(model, opt));
    }
  };
  // [result]
  dtrain::RunConfig run{.storage_path = "runs", .name = "sweep_lr_0.1"};
  run.failure.throw_on_failure = false;
  Trainer trainer({.num_workers = 2}, run);
  const dtrain::Result result = trainer.fit(loop);
  if (result.error) std::cerr << result.error->status << ": " << result.error->message << "\n";
  for (const auto& ck : result.best_checkpoints())
    std::cout << ck.path().string() << " " << dtrain::metrics_line(ck.metrics()) << "\n";
  // Later, in another program:
  const auto same = dtrain::Result::from_path("runs/sweep_lr_0.1");
  // [result]
  std::cout << "result: " << (result.error ? "error" : "no error") << ", " << same.metrics_history.size()
            << " reports read back\n";
  return 0;
}

// The curves block: rank 0's step history, with a value of the loop's own.
int curves() {
  const auto& data = snippets::data();
  using Trainer = dtrain::Trainer<Net, dtrain::data::FashionMnist>;
  // [curves]
  dtrain::RunConfig run{.storage_path = "runs", .name = "curves"};
  run.progress.record_every = 2;  // a row of steps.jsonl every 2 optimizer steps (default 10; 0: none)
  Trainer trainer({.num_workers = 2}, run);
  trainer.fit([&](Trainer::context& ctx) {
    auto model = ctx.prepare_model(Net{});
    torch::optim::SGD opt(model->parameters(), 0.1);
    dtrain::schedule::WarmupCosine schedule(opt, {.warmup_steps = 4, .total_steps = 16});  // per step
    for (auto epoch : ctx.epochs(2)) {
      for (auto batch : ctx.shard(data.train(), 128)) {
        opt.zero_grad();
        ctx.backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
        ctx.step(opt);
        ctx.log_step({{"lr", schedule.lrs().front()}});  // no collective: rank 0's value joins the next row
        schedule.step();
      }
      ctx.report({{"epoch", epoch}});
    }
  });
  // [curves]
  const auto rows = dtrain::MetricsHistory::read_jsonl(dtrain::RunDirectory(run.path()).step_history());
  std::size_t complete = 0;
  for (const auto& r : rows.rows()) complete += r.count("loss") && r.count("lr") && r.count("samples_per_s");
  std::cout << "curves: " << rows.size() << " rows, " << complete << " with loss, lr and samples_per_s\n";
  return 0;
}

// [sparse embeddings]
// A bag of words: the lookup's gradient is sparse, so backward writes only the rows a batch used
// and ddp<> averages only those rows over the workers.
struct BagOfWordsImpl : torch::nn::Module {
  BagOfWordsImpl(std::int64_t vocab, std::int64_t classes)
      : embedding(register_module(
            "embedding", torch::nn::Embedding(torch::nn::EmbeddingOptions(vocab, 64).padding_idx(0).sparse(true)))),
        head(register_module("head", torch::nn::Linear(64, classes))) {}
  torch::Tensor forward(const torch::Tensor& ids) { return head(embedding(ids).mean(1)); }
  torch::nn::Embedding embedding;
  torch::nn::Linear head;
};
TORCH_MODULE(BagOfWords);

int sparse_embeddings() {
  const dtrain::data::TensorDataset texts(torch::randint(1, 20000, {1024, 32}), torch::randint(0, 4, {1024}));
  using Trainer = dtrain::Trainer<BagOfWords, dtrain::data::TensorDataset>;
  Trainer trainer({.num_workers = 2}, {.storage_path = "runs", .name = "bag"});
  auto result = trainer.fit([&](auto& ctx) {
    auto model = ctx.prepare_model(BagOfWords(20000, 4));
    torch::optim::Adam opt(ctx.parameters(model), 1e-3);  // ctx.step lends Adam the dense gradient
    for (auto epoch : ctx.epochs(2)) {
      for (const dtrain::data::Batch& batch : ctx.shard(texts, 64)) {
        opt.zero_grad();
        ctx.backward(torch::nn::functional::cross_entropy(ctx.forward(model, batch.data), batch.target));
        ctx.step(opt);
      }
      const auto& grad = model->embedding->weight.grad();  // sparse: the rows the last batches used
      ctx.report({{"epoch", epoch}, {"rows_in_gradient", grad._nnz()}});
    }
  });
  // [sparse embeddings]
  std::cout << "sparse embeddings: " << result.metrics_history.size() << " reports, "
            << (result.metrics.at("rows_in_gradient").number() < 20000 ? "fewer rows than the vocabulary" : "every row")
            << '\n';
  return 0;
}

int guide(const std::string& block) {
  fresh_directory("guide_" + block);
  if (block == "trainer") return trainer_and_configuration();
  if (block == "fsdp") return sharded();
  if (block == "checkpoints") return checkpoints_in_the_loop();
  if (block == "evaluation") return evaluation();
  if (block == "preemption") return preemption();
  if (block == "result") return result_without_throw();
  if (block == "curves") return curves();
  if (block == "sparse") return sparse_embeddings();
  std::cerr << "snippets guide: no block " << block
            << "; the blocks are trainer, fsdp, checkpoints, evaluation, preemption, result, curves, sparse\n";
  return 2;
}

}  // namespace snippets

int main(int argc, char** argv) {
  const std::string doc = argc > 1 ? argv[1] : "", block = argc > 2 ? argv[2] : "";
  if (doc == "guide") return snippets::guide(block);
  if (doc == "checkpoints") return snippets::checkpoints(block);
  if (doc == "data") return snippets::data_page(block);
  std::cerr << "usage: snippets guide|checkpoints|data <block>\n";
  return 2;
}
