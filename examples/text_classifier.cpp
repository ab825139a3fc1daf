// SPDX-License-Identifier: Apache-2.0
// Made-With-ML-style text classification on a CSV corpus (scripts/make-text-corpus), the same
// work as the Python peer benchmarks/peers/text.py: title + description tokenised by a word-level vocabulary
// fitted on the stratified training split, a transformer encoder (or a bag of embeddings) over the
// padded ids, validation every epoch, the best checkpoint by val_loss, per-class precision /
// recall / F1 on holdout.csv from that checkpoint, predictions for raw strings, and one JSON line
// with the peer's keys.
//
//   text_classifier --data DIR [--model transformer|bag] [--workers N] [--threads-per-worker N]
//       [--global-batch N] [--epochs N] [--max-steps N] [--max-len N] [--vocab N] [--seed N]
//       [--loader-threads N] [--storage-path DIR] [--name NAME] [--tokenizer word|sentencepiece]
//       [--predictions DIR]
//
// The model describes itself (TextClassifierConfig): serving builds it from the best checkpoint
// with its tokenizer and labels, no sizes written here. --predictions DIR scores the holdout set by
// batch inference on 2 workers (evaluation::batch_predict), writing DIR/predictions.csv.
//
// --tokenizer sentencepiece trains a SentencePiece unigram model of --vocab pieces on the training
// split instead of the peer's word vocabulary (libsentencepiece0, loaded at run time).

#include <dtrain/data/collate.hpp>
#include <dtrain/data/csv_table.hpp>
#include <dtrain/data/pipeline.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/data/sentencepiece.hpp>
#include <dtrain/data/splits.hpp>
#include <dtrain/dtrain.hpp>
#include <dtrain/data.hpp>
#include <dtrain/models.hpp>
#include <dtrain/inference.hpp>
#include <dtrain/evaluation/batch_predict.hpp>
#include <dtrain/memory.hpp>
#include <dtrain/nn/encoder.hpp>
#include <dtrain/evaluation/validation.hpp>

#include "text_tagger.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace data = dtrain::data;
using namespace text_tagger;  // the model, the corpus's rows and batches (text_tagger.hpp)

namespace {

struct Options {
  std::string data_dir, model = "transformer", tokenizer = "word", storage = "text_runs", name = "text_classifier",
      predictions;
  int workers = 2, threads = 1, loader_threads = 2;
  std::int64_t global_batch = 64, epochs = 1, max_steps = 0, max_len = 128, vocab = 20000, seed = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string f = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(f + " needs a value");
    const std::string v = argv[i + 1];
    if (f == "--data") o.data_dir = v;
    else if (f == "--model") o.model = v;
    else if (f == "--tokenizer") o.tokenizer = v;
    else if (f == "--workers") o.workers = std::stoi(v);
    else if (f == "--threads-per-worker") o.threads = std::stoi(v);
    else if (f == "--global-batch") o.global_batch = std::stoll(v);
    else if (f == "--epochs") o.epochs = std::stoll(v);
    else if (f == "--max-steps") o.max_steps = std::stoll(v);
    else if (f == "--max-len") o.max_len = std::stoll(v);
    else if (f == "--vocab") o.vocab = std::stoll(v);
    else if (f == "--seed") o.seed = std::stoll(v);
    else if (f == "--loader-threads") o.loader_threads = std::stoi(v);
    else if (f == "--storage-path") o.storage = v;
    else if (f == "--name") o.name = v;
    else if (f == "--predictions") o.predictions = v;
    else throw std::invalid_argument("unknown flag " + f + "; see the usage at the top of text_classifier.cpp");
  }
  if (o.data_dir.empty()) throw std::invalid_argument("--data DIR (holding dataset.csv and holdout.csv) is required");
  if (o.model != "transformer" && o.model != "bag") throw std::invalid_argument("--model is transformer or bag");
  if (o.tokenizer != "word" && o.tokenizer != "sentencepiece")
    throw std::invalid_argument("--tokenizer is word (the peer's) or sentencepiece");
  if (o.workers < 1 || o.global_batch % o.workers) throw std::invalid_argument("--global-batch must be a multiple of --workers");
  return o;
}

}  // namespace

// The tokenizer fitted on the training texts, and those texts' ids.
template <class Tokenizer>
std::pair<Tokenizer, data::TokenIds> fit_tokenizer(const std::vector<std::string_view>& texts, const Options& o) {
  if constexpr (std::is_same_v<Tokenizer, data::WordVocabulary>) {
    return data::WordVocabulary::fit_transform(texts, o.vocab, o.max_len);  // one tokenising pass
  } else {
    auto t = data::SentencePieceTokenizer::fit(texts, {.vocab_size = o.vocab, .max_len = o.max_len});
    auto ids = t.encode_all(texts);
    return {std::move(t), std::move(ids)};
  }
}

template <class Tokenizer>
void train_and_report(const Options& o, double script_start, double started) {
  // The pipeline: read, split, vocabulary, labels, tokenise (every worker does it, as the peer's
  // driver does once). Each file is read once; the training texts are tokenised once, by the
  // vocabulary's fit_transform.
  const double t0 = now_s();
  const Rows rows(o.data_dir + "/dataset.csv");
  const Rows holdout(o.data_dir + "/holdout.csv");
  const auto split = data::stratified_split(rows.tags, 0.2, 0.0, static_cast<std::uint64_t>(o.seed));
  // References, not a structured binding: the training loop's lambda captures vocab, and Clang
  // before 16 refuses a captured binding (C++20 allows it).
  auto fitted = fit_tokenizer<Tokenizer>(rows.texts_at(split.train), o);
  auto& vocab = fitted.first;
  auto& train_ids = fitted.second;
  const auto labels = data::LabelEncoder::fit(rows.tags);  // the peer's: every tag of dataset.csv
  std::vector<std::int64_t> all_holdout;  // the peer drops holdout rows whose tag is not a training one
  for (std::int64_t i = 0; i < holdout.table.size(); ++i)
    if (labels.contains(std::string(holdout.tags[static_cast<std::size_t>(i)]))) all_holdout.push_back(i);
  const auto train = batches_of({std::move(train_ids), rows.labels_at(split.train, labels)}, o.loader_threads);
  const auto val = batches_of({vocab.encode_all(rows.texts_at(split.validation)), rows.labels_at(split.validation, labels)},
                              o.loader_threads);
  const auto test = batches_of({vocab.encode_all(holdout.texts_at(all_holdout)), holdout.labels_at(all_holdout, labels)}, 0);
  const double pipeline_s = now_s() - t0;

  using Trainer = dtrain::Trainer<TextClassifier, Batches, dtrain::checkpointer::directory<>>;
  dtrain::RunConfig run{.storage_path = o.storage, .name = o.name};
  run.checkpoint = {.num_to_keep = 1, .score_attribute = "val_loss", .score_order = dtrain::ScoreOrder::min};
  run.start = dtrain::Start::fresh;
  Trainer trainer({.num_workers = o.workers}, run);
  const bool transformer = o.model == "transformer";
  auto result = trainer.fit([&](Trainer::context& ctx) {
    torch::manual_seed(static_cast<std::uint64_t>(o.seed));
    auto model = ctx.prepare_model(TextClassifier(TextClassifierConfig{vocab.size(), labels.size(), transformer}));
    torch::optim::Adam opt(ctx.parameters(model), 1e-3);
    std::int64_t steps = 0, samples = 0;
    double first_step = 0, last_loss = 0, loop_s = 0;
    for (auto epoch : ctx.epochs(o.epochs)) {
      model->train();
      (void)ctx.all_reduce(0.0);  // a barrier: the loop's time starts together
      const double e0 = now_s();
      for (const auto& b : ctx.shard(train, o.global_batch)) {
        opt.zero_grad();
        const auto loss = torch::nn::functional::cross_entropy(
            ctx.forward(model, b["input_ids"], b["attention_mask"]), b["label"]);
        ctx.backward(loss);
        ctx.step(opt);
        if (!first_step) first_step = now_s();
        samples += b.size();
        last_loss = loss.template item<double>();
        if (o.max_steps && ++steps >= o.max_steps) break;
      }
      (void)ctx.all_reduce(0.0);
      loop_s += now_s() - e0;
      if (o.max_steps && steps >= o.max_steps) ctx.end_epoch();
      model->eval();
      const auto v = dtrain::evaluation::validate(ctx, val, 256 * ctx.world_size(), [&](const data::Fields& b) {
        return dtrain::evaluation::Scored{ctx.forward(model, b["input_ids"], b["attention_mask"]), b["label"]};
      });
      const double total = ctx.all_reduce(static_cast<double>(samples), dtrain::reduce::sum);
      ctx.report({{"epoch", epoch}, {"steps", ctx.steps()}, {"val_loss", v.loss}, {"val_accuracy", v.accuracy},
                  {"final_train_loss", last_loss}, {"train_samples", total}, {"train_loop_s", loop_s},
                  {"train_samples_per_s", total / loop_s}, {"startup_s", first_step - started}},
                 ctx.checkpoint(model, opt).with_object("vocab", vocab).with_object("labels", labels));
      if (o.max_steps && steps >= o.max_steps) break;
    }
  });
  if (!result.best_checkpoint()) throw std::runtime_error("the run saved no checkpoint");

  // The best checkpoint by val_loss, alone: the model from its config, its vocabulary and label
  // names. The holdout and raw strings.
  using Predictor = dtrain::evaluation::Predictor<TextClassifier>;
  const auto best = result.best_checkpoint()->path();
  auto predictor = Predictor::from_checkpoint(best, dtrain::evaluation::TextInputs{});  // the tokenizer it saved
  dtrain::evaluation::ConfusionMatrix cm(labels.size());
  const auto holdout_predictions = predictor.predict(test, 256, &cm);
  const auto per_class = cm.per_class();
  std::map<std::string, std::int64_t> counts;
  for (const auto& t : holdout.tags) ++counts[std::string(t)];
  std::int64_t most = 0;
  for (const auto& [t, n] : counts) most = std::max(most, n);
  const std::vector<std::string> raw = {"command-line tool to manage disk partitions", "HTTP proxy server daemon",
                                        "documentation for the Python library", "library for numerical linear algebra"};
  const auto raw_predictions = predictor.predict(raw);
  for (std::size_t i = 0; i < raw.size(); ++i)
    std::cerr << "predict \"" << raw[i] << "\": " << raw_predictions[static_cast<std::int64_t>(i)].label << "\n";
  for (std::size_t k = 0; k < labels.classes().size(); ++k)
    std::cerr << "holdout " << labels.classes()[k] << ": precision " << per_class.precision[k] << " recall "
              << per_class.recall[k] << " f1 " << per_class.f1[k] << " support " << per_class.support[k] << "\n";
  double f1_sum = 0;
  for (double f : per_class.f1) f1_sum += f;
  const auto& m = result.metrics;
  nlohmann::json line = {
      {"model", o.model}, {"workers", o.workers}, {"global_batch", o.global_batch}, {"epochs", o.epochs},
      {"steps", static_cast<std::int64_t>(m.at("steps").number())},
      {"train_samples", static_cast<std::int64_t>(m.at("train_samples").number())},
      {"train_loop_s", m.at("train_loop_s").number()}, {"train_samples_per_s", m.at("train_samples_per_s").number()},
      {"startup_s", m.at("startup_s").number()}, {"pipeline_s", pipeline_s},
      {"final_train_loss", m.at("final_train_loss").number()}, {"val_loss", m.at("val_loss").number()},
      {"val_accuracy", m.at("val_accuracy").number()}, {"test_accuracy", cm.accuracy()},
      {"test_f1_macro", f1_sum / static_cast<double>(std::max<std::size_t>(1, per_class.f1.size()))},
      {"majority_baseline", holdout.tags.empty() ? 0.0 : static_cast<double>(most) / static_cast<double>(holdout.tags.size())},
      {"vocab_size", vocab.size()}, {"tokenizer", o.tokenizer}, {"classes", labels.size()}, {"train_rows", split.train.size()},
      {"threads_per_worker", o.threads}, {"loader_threads", o.loader_threads},
      {"best_checkpoint", best.string()}, {"wall_s", now_s() - script_start}};
  if (!o.predictions.empty()) {  // the holdout set, by batch inference on 2 workers
    dtrain::RunConfig scoring{.storage_path = o.storage, .name = o.name + "_predictions"};
    const auto out = dtrain::evaluation::batch_predict<TextClassifier>(
        best, test, {.output = o.predictions, .batch = 256, .start = dtrain::Start::fresh}, {.num_workers = 2}, scoring);
    line["predictions"] = out.file.string();
    line["predictions_samples"] = out.samples;
    // The file's classes (CSV: index,label,class_index,...) against this process's Predictor.
    std::ifstream csv(out.file);
    std::string row;
    std::getline(csv, row);  // the header
    const auto classes = holdout_predictions.classes();
    std::int64_t agree = 0, rows_read = 0;
    for (; std::getline(csv, row) && rows_read < classes.size(0); ++rows_read) {
      const auto second = row.find(',', row.find(',') + 1);
      agree += std::stoll(row.substr(second + 1)) == classes[rows_read].template item<std::int64_t>();
    }
    line["predictions_agree"] = rows_read ? static_cast<double>(agree) / static_cast<double>(classes.size(0)) : 0.0;
  }
  std::cout << line.dump() << std::endl;
}

int main(int argc, char** argv) try {
  // A step frees and re-allocates the same large tensors; glibc would return them to the kernel.
  dtrain::retain_freed_memory();
  const double script_start = now_s();
  if (!std::getenv("TEXT_CLASSIFIER_START")) setenv("TEXT_CLASSIFIER_START", std::to_string(script_start).c_str(), 1);
  const double started = std::stod(std::getenv("TEXT_CLASSIFIER_START"));
  const auto o = parse(argc, argv);
  torch::set_num_threads(o.threads);

  if (o.tokenizer == "sentencepiece") train_and_report<data::SentencePieceTokenizer>(o, script_start, started);
  else train_and_report<data::WordVocabulary>(o, script_start, started);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "text_classifier: " << e.what() << std::endl;
  return 1;
}
