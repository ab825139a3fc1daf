// SPDX-License-Identifier: Apache-2.0
#pragma once
// Batch inference on N workers, as Ray Data's map_batches over a predictor: a checkpoint and a
// dataset (or raw texts / image files) in, one prediction per sample out, with fit()'s driver,
// restarts and run directory.
//
//   auto out = dtrain::evaluation::batch_predict<Net>(best.path(), test, {.output = "predictions"},
//                                                      {.num_workers = 2});
//   // out.file: predictions/predictions.csv, every sample once, in the dataset's order
//
// The samples are cut into parts of BatchPredictConfig::part_size; part p is scored by rank
// p % world_size and written atomically (a temporary file renamed into place) as
// OUTPUT/parts/part_PPPPPP.EXT. A restarted group (FailureConfig::max_failures) and a re-run of
// the same job pass over the parts already there, so nothing is scored twice. When every part is
// written, rank 0 joins them into OUTPUT/predictions.EXT and writes OUTPUT/manifest.json (each
// part's first sample, count, size and CRC-32; the class names; the checkpoint). The parts are
// read back by rank 0: across hosts, OUTPUT must be a directory every host shares.
//
// CSV: index,label,class_index,probability,p_<class 0>,...; JSON Lines: {"index", "label",
// "class_index", "probability", "probabilities": [...]}. Probabilities are float32 values printed
// with 9 significant digits: read back as float32 they are the model's, bit for bit.

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include <dtrain/checkpointer/files.hpp>
#include <dtrain/checkpointer/state_files.hpp>
#include <dtrain/config.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/error.hpp>
#include <dtrain/evaluation/predictor.hpp>
#include <dtrain/result.hpp>
#include <dtrain/trainer.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace evaluation {

enum class PredictionFormat { csv, jsonl };

struct BatchPredictConfig {
  /// The job's directory: parts/, predictions.csv (or .jsonl), manifest.json and job.json.
  std::filesystem::path output;
  PredictionFormat format = PredictionFormat::csv;
  /// Samples per forward pass on a worker.
  std::int64_t batch = 256;
  /// Samples per part file: the unit a worker writes at once, and that a restart does not redo. A
  /// multiple of `batch`, so that every batch is the one a single process forms (the same samples
  /// together give the same floating-point results: 1 or N workers write the same file). 0 (the
  /// default): the largest multiple of `batch` up to default_part_size, at least one batch.
  std::int64_t part_size = 0;
  static constexpr std::int64_t default_part_size = 4096;
  /// The class names of a dataset's predictions; when empty, the checkpoint's `labels` object (a
  /// data::LabelEncoder) names them where it holds one, else they are "0", "1", ... (Raw inputs
  /// take the names their preprocessing restores.)
  std::vector<std::string> class_names;
  std::string labels = "labels";
  /// Start::resume passes over the parts an earlier run of the same job wrote; Start::fresh
  /// removes the output directory first.
  Start start = Start::resume;

  /// Throws ConfigError naming the option that cannot work and what to write. batch_predict calls
  /// it first; a program that trains and then scores can call it before training.
  void validate() const;
  /// part_size, or the one its default 0 stands for.
  std::int64_t part_samples() const {
    return part_size > 0 ? part_size : std::max<std::int64_t>(1, default_part_size / std::max<std::int64_t>(1, batch)) * batch;
  }
  std::string extension() const { return format == PredictionFormat::csv ? ".csv" : ".jsonl"; }
};

/// What batch_predict returns in the driver.
struct BatchPredictions {
  /// OUTPUT/predictions.csv (or .jsonl), and OUTPUT/manifest.json.
  std::filesystem::path file, manifest;
  std::int64_t samples = 0;
  std::vector<std::string> class_names;
  /// The run that scored them (status, restarts, its metrics: samples, samples_per_s).
  Result run;
};

namespace detail {

std::string part_name(std::int64_t p, const BatchPredictConfig& c);

std::string csv_field(const std::string& s);

std::string header(const std::vector<std::string>& names, const BatchPredictConfig& c);

/// The rows of samples first, first + 1, ... whose probabilities are `probs` [count, C].
std::string rows(const torch::Tensor& probs, std::int64_t first, const std::vector<std::string>& names,
                 const BatchPredictConfig& c);

/// Writes `bytes` to `path` atomically: a temporary file, fsynced, renamed into place.
void publish(const std::filesystem::path& path, const std::string& bytes);

/// The job a directory holds (job.json): the same checkpoint, sample count, part size and format
/// resume it; anything else is refused before a sample is scored.
void claim_output(const BatchPredictConfig& c, const std::filesystem::path& checkpoint, std::int64_t samples);

/// Rank 0, every part written: predictions.EXT in the dataset's order, and manifest.json.
void join_parts(const BatchPredictConfig& c, std::int64_t samples, const std::vector<std::string>& names);

// Its size, for the Trainer's Dataset parameter (batch_predict reads the samples itself).
struct SampleCount {
  std::int64_t n = 0;
  std::int64_t size() const { return n; }
  data::Batch get_batch(const torch::Tensor& indices) const { return {indices, indices}; }
};

/// A failure message of the Trainer that runs the job, in the job's words.
std::string as_job_message(std::string message);

/// The job: `samples` samples, `score(predictor, first, count)` their probabilities on a worker.
template <class Model, class... Policies, class MakePredictor, class Score>
BatchPredictions run_job(const std::filesystem::path& checkpoint, std::int64_t samples, MakePredictor make_predictor,
                         Score score, const BatchPredictConfig& config, const ScalingConfig& scaling, RunConfig run) {
  config.validate();
  if (run.storage_path == RunConfig{}.storage_path && run.name == RunConfig{}.name) {
    run.storage_path = config.output;  // the job's own run record, beside its predictions
    run.name = "run";
  }
  if (!launch::detect_worker()) claim_output(config, checkpoint, samples);  // the driver, once
  using Job = Trainer<Model, SampleCount, Policies...>;
  Job job(scaling, std::move(run));
  Result result;
  try {
    result = job.fit([&](typename Job::context& ctx) {
      auto predictor = make_predictor();
      std::filesystem::create_directories(config.output / "parts");  // under a launcher no driver made it
      const std::int64_t part = config.part_samples(), parts = (samples + part - 1) / part;
      const int world = ctx.world_size();
      const std::int64_t rounds = (parts + world - 1) / world;
      std::int64_t scored = 0;
      for (std::int64_t r = 0; r < rounds; ++r) {
        const std::int64_t p = r * world + ctx.world_rank();
        std::int64_t here = 0;
        if (p < parts && !std::filesystem::exists(config.output / part_name(p, config))) {
          const auto first = p * part, count = std::min(part, samples - first);
          std::vector<torch::Tensor> probs;
          for (std::int64_t b = first; b < first + count; b += config.batch)
            probs.push_back(score(predictor, b, std::min(config.batch, first + count - b)));
          publish(config.output / part_name(p, config), rows(torch::cat(probs), first, predictor.class_names(), config));
          here = count;
        }
        scored += static_cast<std::int64_t>(ctx.all_reduce(static_cast<double>(here), reduce::sum));
        ctx.report({{"parts", std::min(parts, (r + 1) * world)}, {"of_parts", parts}, {"samples_scored", scored}});
      }
      if (ctx.world_rank() != 0) return;
      if (predictor.class_names().empty() && samples > 0) (void)score(predictor, 0, 1);  // the class count
      join_parts(config, samples, predictor.class_names());
    });
  } catch (const WorkerError& e) {  // the Trainer's words are of training
    throw WorkerError(as_job_message(e.what()));
  }
  if (result.error) result.error->message = as_job_message(result.error->message);
  BatchPredictions out;
  out.file = config.output / ("predictions" + config.extension());
  out.manifest = config.output / "manifest.json";
  if (result.status == "finished") {
    const auto m = nlohmann::json::parse(checkpointer::detail::read_text(out.manifest));
    out.samples = m.at("samples").get<std::int64_t>();
    out.class_names = m.at("class_names").get<std::vector<std::string>>();
  }
  out.run = std::move(result);
  return out;
}

}  // namespace detail

/// Scores every sample of `data` (a data::RandomAccess dataset, such as a test split) with the model
/// of `checkpoint`, built from its model_config.json, on ScalingConfig::num_workers workers.
/// The class names are the checkpoint's `config.labels` LabelEncoder when it holds one. The job's
/// run record (its progress, outcome and failures) goes to `run`'s directory; left at RunConfig's
/// defaults, to `config.output / "run"`.
template <class Model, class... Policies, data::RandomAccess Dataset>
BatchPredictions batch_predict(const std::filesystem::path& checkpoint, const Dataset& data,
                               const BatchPredictConfig& config, const ScalingConfig& scaling = {},
                               RunConfig run = {}) {
  auto make = [&] {
    auto p = Predictor<Model>::from_checkpoint(checkpoint);  // verifies every file's CRC-32
    if (!config.class_names.empty()) {
      p.set_class_names(config.class_names);
    } else if (const auto ck = checkpointer::Checkpoint::open(checkpoint, nullptr, /*verify_files=*/false);
               ck && ck->has_object(config.labels)) {
      data::LabelEncoder labels;
      try {
        ck->load_object(config.labels, labels);
      } catch (const std::exception& e) {  // fails alike on every restart: not restarted
        throw ConfigError(std::string("batch_predict: the class names (BatchPredictConfig::labels): ") + e.what());
      }
      p.set_class_names(labels.classes());
    }
    return p;
  };
  auto score = [&](Predictor<Model>& p, std::int64_t first, std::int64_t count) {
    return p.predict(data.get_batch(torch::arange(first, first + count, torch::kInt64))).probabilities();
  };
  return detail::run_job<Model, Policies...>(checkpoint, static_cast<std::int64_t>(data.size()), make, score, config,
                                             scaling, std::move(run));
}

/// Scores raw inputs (texts, or image files' paths) through the preprocessing `inputs` restores
/// from the checkpoint (TextInputs, ImageInputs), the model built from its model_config.json.
template <class Model, class... Policies, InputsFromCheckpoint Inputs>
BatchPredictions batch_predict(const std::filesystem::path& checkpoint, const std::vector<std::string>& raw,
                               const Inputs& inputs, const BatchPredictConfig& config,
                               const ScalingConfig& scaling = {}, RunConfig run = {}) {
  auto make = [&] { return Predictor<Model>::from_checkpoint(checkpoint, inputs); };
  auto score = [&](Predictor<Model>& p, std::int64_t first, std::int64_t count) {
    return p.predict(std::vector<std::string>(raw.begin() + first, raw.begin() + first + count)).probabilities();
  };
  return detail::run_job<Model, Policies...>(checkpoint, static_cast<std::int64_t>(raw.size()), make, score, config,
                                             scaling, std::move(run));
}

}  // namespace evaluation

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/evaluation/impl/batch_predict.ipp>
#endif
