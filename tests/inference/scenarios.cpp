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
//   inference_scenarios text STORAGE OUTPUT            the library's own nn::BertForSequenceClassification
//                                                      with a WordPiece tokenizer, trained on 2 workers,
//                                                      served from its checkpoint alone: batch_predict
//                                                      over raw texts with TextInputs{} (no type named),
//                                                      one process's Predictor beside it (rows, logits),
//                                                      and a job whose preprocessing is missing

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <cstdlib>
#include <iostream>
#include <string>

#include <dtrain/dtrain.hpp>
#include <dtrain/data.hpp>
#include <dtrain/inference.hpp>
#include <dtrain/evaluation/batch_predict.hpp>
#include <dtrain/models.hpp>

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

// The text scenario: a tiny BERT and a WordPiece vocabulary of the texts' words.
const std::vector<std::string> kWords = {"disk", "proxy", "chess", "matrix", "server", "board", "tool", "daemon",
                                         "library", "game", "partition", "algebra", "network", "engine"};

std::vector<std::string> texts() {  // 103 texts of 2 to 9 words: batches pad to different lengths
  std::vector<std::string> out;
  for (std::size_t i = 0; i < 103; ++i) {
    std::string t;
    for (std::size_t w = 0; w < 2 + i % 8; ++w) t += (w ? " " : "") + kWords[(i * 7 + w * 3) % kWords.size()];
    out.push_back(t + (i % 5 == 0 ? " unknownword" : ""));
  }
  return out;
}

dtrain::data::WordPieceTokenizer tiny_tokenizer(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::string lines = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  for (const auto& w : kWords) lines += w + "\n";
  std::ofstream(dir / "vocab.txt") << lines;
  return dtrain::data::WordPieceTokenizer::from_vocab(dir / "vocab.txt").with_max_length(8);
}

dtrain::nn::BertConfig tiny_bert() {
  dtrain::nn::BertConfig c;
  c.vocab_size = 5 + static_cast<std::int64_t>(kWords.size());
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 32;
  c.max_position_embeddings = 16;
  c.id2label = {"cold", "cool", "mild", "warm"};
  return c;
}

std::filesystem::path train_text(const std::string& storage) {
  using Bert = dtrain::nn::BertForSequenceClassification;
  using Trainer = dtrain::Trainer<Bert, dtrain::data::TensorDataset, dtrain::checkpointer::directory<>>;
  auto run = quiet_run(storage, "text");
  run.start = dtrain::Start::fresh;
  Trainer trainer({.num_workers = 2}, run);
  const auto tokenizer = tiny_tokenizer(std::filesystem::path(storage) / "tokenizer");
  const auto all = texts();
  const auto labels = dtrain::data::LabelEncoder::fit(tiny_bert().id2label);
  auto result = trainer.fit([&](Trainer::context& ctx) {
    torch::manual_seed(11);
    auto model = ctx.prepare_model(Bert(tiny_bert()));
    torch::optim::AdamW opt(ctx.parameters(model), 1e-2);
    for (std::size_t step = 0; step < 3; ++step) {  // each rank its own 4 texts a step
      std::vector<dtrain::data::Fields> samples;
      std::vector<std::int64_t> targets;
      for (std::size_t i = 0; i < 4; ++i) {
        const auto k = (step * 8 + static_cast<std::size_t>(ctx.world_rank()) * 4 + i) % all.size();
        samples.push_back(dtrain::data::Fields{{"input_ids", tokenizer.transform(all[k])}});
        targets.push_back(static_cast<std::int64_t>(all[k].size() % 4));
      }
      const auto b = dtrain::data::pad_to_longest("input_ids", tokenizer.pad_id())(samples);
      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(
          ctx.forward(model, b["input_ids"], b["attention_mask"], torch::Tensor()), torch::tensor(targets));
      ctx.backward(loss);
      ctx.step(opt);
    }
    ctx.report({{"epoch", 0}}, ctx.checkpoint(model, opt).with_object("vocab", tokenizer).with_object("labels", labels));
  });
  return result.best_checkpoint()->path();
}

// One process's Predictor over the texts, 7 at a time as the job's batches: the rows the job writes.
void text_reference(const std::filesystem::path& checkpoint) {
  using Bert = dtrain::nn::BertForSequenceClassification;
  auto predictor = dtrain::evaluation::Predictor<Bert>::from_checkpoint(checkpoint, dtrain::evaluation::TextInputs{});
  const auto all = texts();
  const auto c = job("-", false);
  std::cout << dtrain::evaluation::detail::header(predictor.class_names(), c);
  // The logits are the model's own: a model built and loaded by hand, on the same padded batch.
  const auto ck = dtrain::checkpointer::Checkpoint::open(checkpoint);
  auto bert = dtrain::checkpointer::build_model<Bert>(*ck);
  ck->load_model(bert);
  bert->eval();
  dtrain::data::WordPieceTokenizer tokenizer;
  ck->load_object("vocab", tokenizer);
  bool logits_equal = true, softmax_equal = true;
  for (std::size_t first = 0; first < all.size(); first += 7) {
    const std::vector<std::string> chunk(all.begin() + first, all.begin() + std::min(all.size(), first + 7));
    const auto p = predictor.predict(chunk);
    std::cout << dtrain::evaluation::detail::rows(p.probabilities(), static_cast<std::int64_t>(first), p.class_names(), c);
    std::vector<dtrain::data::Fields> samples;
    for (const auto& t : chunk) samples.push_back(dtrain::data::Fields{{"input_ids", tokenizer.transform(t)}});
    const auto b = dtrain::data::pad_to_longest("input_ids", tokenizer.pad_id())(samples);
    torch::NoGradGuard no_grad;
    logits_equal = logits_equal && torch::equal(p.logits(), bert->forward(b["input_ids"], b["attention_mask"]));
    softmax_equal = softmax_equal && torch::equal(p.probabilities(), torch::softmax(p.logits(), 1)) &&
                    p[0].logits.size() == 4;
  }
  std::cerr << "LOGITS " << (logits_equal ? "equal" : "differ") << " SOFTMAX " << (softmax_equal ? "equal" : "differ")
            << std::endl;
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
    std::int64_t batch = 0;  // --batch N: N a forward pass and every other option its default
    for (int i = 5; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "--kill-at" && i + 1 < argc) data.kill_at = std::stoll(argv[++i]);
      else if (flag == "--log" && i + 1 < argc) data.log = argv[++i];
      else if (flag == "--jsonl") jsonl = true;
      else if (flag == "--batch" && i + 1 < argc) batch = std::stoll(argv[++i]);
      else throw std::invalid_argument("unknown argument " + flag);
    }
    const std::string output = argv[3];
    const auto config = batch > 0 ? dtrain::evaluation::BatchPredictConfig{.output = output, .batch = batch} : job(output, jsonl);
    auto out = dtrain::evaluation::batch_predict<Net>(argv[2], data, config, {.num_workers = std::stoi(argv[4])},
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
  if (mode == "text" && argc == 4) {
    const auto checkpoint = train_text(argv[2]);
    std::cout << "CHECKPOINT " << checkpoint.string() << std::endl;
    const std::string output = argv[3];
    auto out = dtrain::evaluation::batch_predict<dtrain::nn::BertForSequenceClassification>(
        checkpoint, texts(), dtrain::evaluation::TextInputs{}, job(output, false), {.num_workers = 2},
        quiet_run(output + "_runs", "predict"));
    std::cout << "PREDICTIONS " << out.file.string() << " samples " << out.samples << " restarts " << out.run.restarts
              << " status " << out.run.status << std::endl;
    // A job whose tokenizer object is not there fails at once (not restarted), in the job's words.
    dtrain::evaluation::TextInputs missing;
    missing.vocabulary = "tokenizer";
    auto run = quiet_run(output + "_bad_runs", "predict");
    run.failure.throw_on_failure = false;
    auto bad = dtrain::evaluation::batch_predict<dtrain::nn::BertForSequenceClassification>(
        checkpoint, texts(), missing, job(output + "_bad", false), {.num_workers = 2}, run);
    std::cout << "BAD status " << bad.run.status << " restarts " << bad.run.restarts << std::endl;
    std::cout << "BAD message " << (bad.run.error ? bad.run.error->message : std::string("none")) << std::endl;
    return 0;
  }
  if (mode == "text-reference" && argc == 3) {
    torch::set_num_threads(1);  // as each worker (ScalingConfig::threads_per_worker): the same sums
    text_reference(argv[2]);
    return 0;
  }
  std::cerr << "usage: see the head of tests/inference/scenarios.cpp\n";
  return 2;
} catch (const std::exception& e) {
  std::cerr << "inference_scenarios: " << e.what() << std::endl;
  return 1;
}
