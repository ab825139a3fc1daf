// SPDX-License-Identifier: Apache-2.0
// Data scenarios: a real driver with real workers over Gloo on loopback, training on batches of
// named fields. test_data_multirank.cpp runs this program and checks what it prints.
//
//   data_scenarios validate --workers N --strategy ddp|fsdp
//       trains 3 steps with ctx.forward(model, ids, mask) (two tensors), then validates a fixed
//       model on 97 samples (ranks get different batch counts) with evaluation::validate;
//       prints RESULT loss= accuracy= samples= trained_loss=
//   data_scenarios pipeline --workers N --loader-threads T --steps K --every E [--kill-step S] --out FILE
//       trains through a data::Pipelined with random transforms (map with the sample's generator,
//       map_batches with the batch's), checkpointing every E steps; with --kill-step, rank 1 is
//       SIGKILLed at step S on the first attempt and the group resumes (max_failures 1). Rank 0
//       saves the final parameters to FILE.
//   data_scenarios stage --workers N --loader-threads T --concurrency C --steps K --every E [--kill-step S] --out FILE
//       the same, through a pipeline whose map_batches<Embedder> stage builds a model in its
//       constructor (random initialisation, slowly, while the loop trains) and adds noise in its
//       calls, before a trained head with dropout.

#include <dtrain/data/collate.hpp>
#include <dtrain/data/fields.hpp>
#include <dtrain/data/pipeline.hpp>
#include <dtrain/dtrain.hpp>
#include <dtrain/data.hpp>
#include <dtrain/inference.hpp>
#include <dtrain/evaluation/validation.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <iomanip>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include <torch/torch.h>

namespace d = dtrain;

namespace {

struct Args {
  std::string scenario, strategy = "ddp", out, storage = "data_runs";
  int workers = 2, loader_threads = 2, steps = 12, every = 4, kill_step = -1, concurrency = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) throw std::invalid_argument("usage: data_scenarios validate|pipeline|stage [--flag value]...");
  a.scenario = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--workers") a.workers = std::stoi(v);
    else if (f == "--strategy") a.strategy = v;
    else if (f == "--loader-threads") a.loader_threads = std::stoi(v);
    else if (f == "--steps") a.steps = std::stoi(v);
    else if (f == "--every") a.every = std::stoi(v);
    else if (f == "--kill-step") a.kill_step = std::stoi(v);
    else if (f == "--concurrency") a.concurrency = std::stoi(v);
    else if (f == "--out") a.out = v;
    else if (f == "--storage") a.storage = v;
    else if (f == "--tag") {}  // marks the processes for the orphan checks
    else throw std::invalid_argument("unknown flag " + f);
  }
  return a;
}

constexpr std::int64_t kVocab = 50, kClasses = 4;

// Token sequences of varying length, padded, with a mask and a label: the same on every rank.
struct Tokens {
  std::int64_t n = 101;
  std::int64_t size() const { return n; }
  d::data::Fields get_batch(const torch::Tensor& idx) const {
    std::vector<d::data::Fields> samples;
    const auto* i = idx.data_ptr<std::int64_t>();
    for (std::int64_t k = 0; k < idx.numel(); ++k) samples.push_back(sample(i[k]));
    return d::data::pad_to_longest("ids", 0, "mask")(samples);
  }
  static d::data::Fields sample(std::int64_t i) {
    const auto len = i % 6 + 2;
    auto ids = (torch::arange(len, torch::kInt64) * 7 + i * 3) % (kVocab - 1) + 1;
    return {{"ids", ids}, {"label", torch::tensor(i % kClasses)}};
  }
};

// Mean of the unmasked embeddings, then a linear layer: forward takes two tensors.
struct BagImpl : torch::nn::Module {
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear fc{nullptr};
  BagImpl() {
    emb = register_module("emb", torch::nn::Embedding(kVocab, 16));
    fc = register_module("fc", torch::nn::Linear(16, kClasses));
  }
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& mask) {
    const auto keep = mask.unsqueeze(-1).to(torch::kFloat32);
    return fc->forward((emb->forward(ids) * keep).sum(1) / keep.sum(1).clamp_min(1));
  }
};
TORCH_MODULE(Bag);

template <class Strategy>
using TokenTrainer = d::Trainer<Bag, Tokens, d::checkpointer::directory<false>, Strategy>;

template <class Strategy>
int validate(const Args& a) {
  TokenTrainer<Strategy> trainer({.num_workers = a.workers}, {.storage_path = a.storage, .name = "validate_" + a.strategy});
  const Tokens data;
  // 97 samples, 12 a global batch: on 2 workers the ranks get 9 and 8 batches, on 3 9, 8 and 8.
  const Tokens held_out{97};
  auto result = trainer.fit([&](auto& ctx) {
    torch::manual_seed(1);
    auto trained = ctx.prepare_model(Bag());
    torch::optim::SGD sgd(ctx.parameters(trained), 0.1);
    double last = 0;
    for (const auto& b : ctx.shard(data, 6 * ctx.world_size())) {
      if (ctx.steps() == 3) break;
      sgd.zero_grad();
      const auto loss = torch::nn::functional::cross_entropy(ctx.forward(trained, b["ids"], b["mask"]), b["label"]);
      ctx.backward(loss);
      ctx.step(sgd);
      last = loss.template item<double>();
    }
    torch::manual_seed(2);  // the validated model: the same weights on every worker count
    auto fixed = ctx.prepare_model(Bag());
    fixed->eval();
    d::evaluation::ConfusionMatrix cm(kClasses);
    const auto v = d::evaluation::validate(
        ctx, held_out, 12,
        [&](const d::data::Fields& b) {
          return d::evaluation::Scored{ctx.forward(fixed, b["ids"], b["mask"]), b["label"]};
        },
        &cm);
    ctx.report({{"loss", v.loss}, {"accuracy", v.accuracy}, {"samples", v.samples}, {"cm_total", cm.total()},
                {"trained_loss", ctx.all_reduce(last, d::reduce::max)}});
  });
  std::cout << std::setprecision(17) << "RESULT loss=" << result.metrics.at("loss").number()
            << " accuracy=" << result.metrics.at("accuracy").number()
            << " samples=" << result.metrics.at("samples").number() << " cm_total=" << result.metrics.at("cm_total").number()
            << " trained_loss=" << result.metrics.at("trained_loss").number() << std::endl;
  return 0;
}

// The pipeline scenario: samples are integers; a random crop of their token ids (the sample's
// generator) and a random token dropout over the batch (the batch's generator).
struct Integers {
  std::int64_t n = 96;
  std::int64_t size() const { return n; }
  std::int64_t operator[](std::int64_t i) const { return i; }
};

auto random_pipeline(int threads) {
  namespace dd = d::data;
  auto p = dd::map([](std::int64_t i, at::Generator& g) {
             auto s = Tokens::sample(i);
             const auto len = s["ids"].size(0);
             const auto keep = 1 + torch::randint(len, {1}, g).template item<std::int64_t>();
             s.set("ids", s["ids"].narrow(0, 0, keep));
             return s;
           }) |
           dd::collate(dd::pad_to_longest("ids", 0, "mask")) | dd::map_batches([](dd::Fields b, at::Generator& g) {
             b.set("mask", b["mask"] * (torch::rand(b["mask"].sizes(), g) > 0.1).to(torch::kInt64));
             return b;
           });
  return dd::pipelined(Integers{}, std::move(p), {.loader_threads = threads, .seed = 5});
}

// The stage scenario: a bag of the token ids through a model built by the stage (its constructor
// draws the model's initialisation; instance k starts building k * 150 ms late, a layer every 10 ms,
// so that a second instance is built while the loop trains), then a head with dropout.
struct Embedder {
  torch::nn::Sequential net;
  explicit Embedder(int layers) {
    static std::atomic<int> built{0};
    std::this_thread::sleep_for(std::chrono::milliseconds(150 * built++));
    net->push_back(torch::nn::Linear(kVocab, 16));
    for (int k = 0; k < layers; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      net->push_back(torch::nn::Linear(16, 16));
      net->push_back(torch::nn::Tanh());
    }
  }
  d::data::Fields operator()(d::data::Fields b) {
    const auto ids = b["ids"], mask = b["mask"].to(torch::kFloat32);
    const auto bag = torch::zeros({ids.size(0), kVocab}).scatter_add_(1, ids, mask);
    const auto features = net->forward(bag);
    b.set("features", features + 0.01 * torch::randn(features.sizes()));
    return b;
  }
};

auto stage_pipeline(int threads, int concurrency) {
  namespace dd = d::data;
  auto p = dd::map([](std::int64_t i) { return Tokens::sample(i); }) | dd::collate(dd::pad_to_longest("ids", 0, "mask")) |
           dd::map_batches<Embedder>({.concurrency = concurrency, .name = "embedder"}, 12);
  return dd::pipelined(Integers{}, std::move(p), {.loader_threads = threads, .seed = 5});
}
using StageData = decltype(stage_pipeline(0, 1));

struct HeadImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
  HeadImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    drop = register_module("drop", torch::nn::Dropout(0.3));
    fc2 = register_module("fc2", torch::nn::Linear(32, kClasses));
  }
  torch::Tensor forward(const torch::Tensor& features) { return fc2->forward(drop->forward(torch::relu(fc1->forward(features)))); }
};
TORCH_MODULE(Head);

// Trains through `data` (kill-and-resume as the header says); Rank 0 saves the final parameters.
template <class Model, class Data, class Forward>
int train_through(const Args& a, const std::string& name, Data& data, Forward forward) {
  d::Trainer<Model, Data, d::checkpointer::directory<false>> trainer(
      {.num_workers = a.workers},
      {.storage_path = a.storage, .name = name, .failure = {.max_failures = a.kill_step >= 0 ? 1 : 0}, .seed = 3});
  auto result = trainer.fit([&](auto& ctx) {
    torch::manual_seed(1);
    auto model = ctx.prepare_model(Model());
    torch::optim::SGD sgd(ctx.parameters(model), 0.1);
    if (auto ck = ctx.get_checkpoint()) {
      ctx.restore(*ck, model, sgd);
      ck->load_object("pipeline", data.random_state());
      if (ctx.world_rank() == 0) std::cerr << "RESUMED " << ck->path().string() << std::endl;
    }
    for (auto epoch : ctx.epochs(100)) {
      (void)epoch;
      for (const auto& b : ctx.shard(data, 8 * ctx.world_size())) {
        if (ctx.steps() == a.steps) break;
        if (ctx.world_rank() == 1 && ctx.steps() == a.kill_step && ctx.attempt() == 0) std::raise(SIGKILL);
        sgd.zero_grad();
        const auto loss = torch::nn::functional::cross_entropy(forward(ctx, model, b), b["label"]);
        ctx.backward(loss);
        ctx.step(sgd);
        if (ctx.steps() % a.every == 0)
          ctx.report({{"loss", loss.template item<double>()}},
                     ctx.checkpoint(model, sgd).with_object("pipeline", data.random_state()));
      }
      if (ctx.steps() == a.steps) break;
    }
    if (ctx.world_rank() == 0 && !a.out.empty()) {
      std::vector<torch::Tensor> params;
      for (const auto& p : model->parameters()) params.push_back(p.detach().clone());
      torch::save(params, a.out);
    }
  });
  std::cout << "RESULT restarts=" << result.restarts << " rows=" << result.metrics_history.size() << std::endl;
  return 0;
}

int pipeline(const Args& a) {
  auto data = random_pipeline(a.loader_threads);
  return train_through<Bag>(a, "pipeline", data,
                            [](auto& ctx, auto& model, const auto& b) { return ctx.forward(model, b["ids"], b["mask"]); });
}

int stage(const Args& a) {
  auto data = stage_pipeline(a.loader_threads, a.concurrency);
  return train_through<Head>(a, "stage", data, [](auto& ctx, auto& model, const auto& b) { return ctx.forward(model, b["features"]); });
}

}  // namespace

int main(int argc, char** argv) try {
  const auto a = parse(argc, argv);
  if (a.scenario == "validate")
    return a.strategy == "fsdp" ? validate<d::strategy::fsdp<>>(a) : validate<d::strategy::ddp<>>(a);
  if (a.scenario == "pipeline") return pipeline(a);
  if (a.scenario == "stage") return stage(a);
  throw std::invalid_argument("unknown scenario " + a.scenario);
} catch (const std::exception& e) {
  std::cerr << "data_scenarios: " << e.what() << std::endl;
  return 1;
}
