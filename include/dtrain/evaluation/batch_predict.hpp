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
  /// together give the same floating-point results: 1 or N workers write the same file).
  std::int64_t part_size = 4096;
  /// The class names of a dataset's predictions; when empty, the checkpoint's `labels` object (a
  /// data::LabelEncoder) names them where it holds one, else they are "0", "1", ... (Raw inputs
  /// take the names their preprocessing restores.)
  std::vector<std::string> class_names;
  std::string labels = "labels";
  /// Start::resume passes over the parts an earlier run of the same job wrote; Start::fresh
  /// removes the output directory first.
  Start start = Start::resume;

  void validate() const {
    if (output.empty()) throw ConfigError("BatchPredictConfig::output is empty; name the directory for the predictions");
    if (batch < 1) throw ConfigError("BatchPredictConfig::batch must be at least 1, got " + std::to_string(batch));
    if (part_size < 1 || part_size % batch != 0)
      throw ConfigError("BatchPredictConfig::part_size must be a positive multiple of batch (" + std::to_string(batch) +
                        "), got " + std::to_string(part_size) + "; e.g. " + std::to_string(batch * std::max<std::int64_t>(1, part_size / batch)));
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

inline std::string part_name(std::int64_t p, const BatchPredictConfig& c) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "part_%06" PRId64, p);
  return std::string("parts/") + buf + c.extension();
}

inline std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return q + "\"";
}

inline std::string header(const std::vector<std::string>& names, const BatchPredictConfig& c) {
  if (c.format != PredictionFormat::csv) return {};
  std::string h = "index,label,class_index,probability";
  for (const auto& n : names) h += "," + csv_field("p_" + n);
  return h + "\n";
}

/// The rows of samples first, first + 1, ... whose probabilities are `probs` [count, C].
inline std::string rows(const torch::Tensor& probs, std::int64_t first, const std::vector<std::string>& names,
                        const BatchPredictConfig& c) {
  const auto p = probs.to(torch::kFloat32).contiguous();
  const auto classes = p.size(1);
  std::string out;
  char num[32];
  for (std::int64_t i = 0; i < p.size(0); ++i) {
    const float* row = p.data_ptr<float>() + i * classes;
    const auto k = static_cast<std::int64_t>(std::max_element(row, row + classes) - row);
    auto prob = [&](std::int64_t j) {
      std::snprintf(num, sizeof num, "%.9g", static_cast<double>(row[j]));
      return std::string(num);
    };
    const std::string& label = names.at(static_cast<std::size_t>(k));
    if (c.format == PredictionFormat::csv) {
      out += std::to_string(first + i) + "," + csv_field(label) + "," + std::to_string(k) + "," + prob(k);
      for (std::int64_t j = 0; j < classes; ++j) out += "," + prob(j);
    } else {
      out += "{\"index\":" + std::to_string(first + i) + ",\"label\":" + nlohmann::json(label).dump() +
             ",\"class_index\":" + std::to_string(k) + ",\"probability\":" + prob(k) + ",\"probabilities\":[";
      for (std::int64_t j = 0; j < classes; ++j) out += (j ? "," : "") + prob(j);
      out += "]}";
    }
    out += "\n";
  }
  return out;
}

/// Writes `bytes` to `path` atomically: a temporary file, fsynced, renamed into place.
inline void publish(const std::filesystem::path& path, const std::string& bytes) {
  const auto tmp = path.string() + ".tmp";
  checkpointer::detail::write_file(tmp, bytes);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(path.string() + ": cannot rename the finished file into place (" + ec.message() + ")");
  checkpointer::detail::fsync_directory(path.parent_path());
}

/// The job a directory holds (job.json): the same checkpoint, sample count, part size and format
/// resume it; anything else is refused before a sample is scored.
inline void claim_output(const BatchPredictConfig& c, const std::filesystem::path& checkpoint, std::int64_t samples) {
  namespace fs = std::filesystem;
  // The model's file as the checkpoint's manifest seals it: another training into the same path
  // is another job.
  std::uint32_t model_crc = 0;
  try {
    const auto manifest = checkpointer::detail::Manifest::read(checkpoint);
    for (const auto& f : manifest.files)
      if (f.name == checkpointer::files::model) model_crc = f.crc32;
  } catch (const std::exception& e) {
    throw ConfigError("batch_predict: " + checkpoint.string() + " is not a usable checkpoint (" + e.what() +
                      "); pass a checkpoint_NNNNNN directory, such as Result::best_checkpoint()->path()");
  }
  const nlohmann::json job = {{"format", 1}, {"checkpoint", fs::absolute(checkpoint).lexically_normal().string()},
                              {"model_crc32", model_crc}, {"samples", samples}, {"part_size", c.part_size},
                              {"extension", c.extension()}};
  std::error_code ec;
  if (c.start == Start::fresh) fs::remove_all(c.output, ec);
  fs::create_directories(c.output / "parts", ec);
  if (ec) throw ConfigError(c.output.string() + ": cannot create the predictions directory (" + ec.message() + ")");
  const auto file = c.output / "job.json";
  if (fs::exists(file, ec)) {
    nlohmann::json there;
    try {
      there = nlohmann::json::parse(checkpointer::detail::read_text(file));
    } catch (const std::exception& e) {
      throw ConfigError(file.string() + " is malformed (" + e.what() + "); remove " + c.output.string() + " to start over");
    }
    if (there != job)
      throw ConfigError(c.output.string() + " holds the predictions of another job (" + there.dump() + ", this one is " +
                        job.dump() + "); choose another BatchPredictConfig::output, or remove it to start over");
  }
  for (const auto& e : fs::directory_iterator(c.output / "parts"))  // a write a kill cut short
    if (e.path().extension() == ".tmp") fs::remove(e.path(), ec);
  publish(file, job.dump(2));
}

/// Rank 0, every part written: predictions.EXT in the dataset's order, and manifest.json.
inline void join_parts(const BatchPredictConfig& c, std::int64_t samples, const std::vector<std::string>& names) {
  const std::int64_t parts = (samples + c.part_size - 1) / c.part_size;
  std::string all = header(names, c);
  nlohmann::json list = nlohmann::json::array();
  for (std::int64_t p = 0; p < parts; ++p) {
    const auto name = part_name(p, c);
    const std::string text = checkpointer::detail::read_text(c.output / name);
    const auto first = p * c.part_size, count = std::min(c.part_size, samples - first);
    if (std::count(text.begin(), text.end(), '\n') != count)
      throw DataError((c.output / name).string() + ": holds " + std::to_string(std::count(text.begin(), text.end(), '\n')) +
                      " rows, not the " + std::to_string(count) + " of samples " + std::to_string(first) + ".." +
                      std::to_string(first + count - 1) + "; remove it and run again to score it anew");
    const auto [crc, size] = checkpointer::detail::crc32_of_file(c.output / name);
    list.push_back({{"file", name}, {"first", first}, {"count", count}, {"size", size}, {"crc32", crc}});
    all += text;
  }
  const auto file = c.output / ("predictions" + c.extension());
  publish(file, all);
  const auto [crc, size] = checkpointer::detail::crc32_of_file(file);
  const nlohmann::json manifest = {
      {"format", 1}, {"samples", samples}, {"class_names", names}, {"parts", list},
      {"predictions", {{"file", file.filename().string()}, {"size", size}, {"crc32", crc}}},
      {"job", nlohmann::json::parse(checkpointer::detail::read_text(c.output / "job.json"))}};
  publish(c.output / "manifest.json", manifest.dump(2));
}

// Its size, for the Trainer's Dataset parameter (batch_predict reads the samples itself).
struct SampleCount {
  std::int64_t n = 0;
  std::int64_t size() const { return n; }
  data::Batch get_batch(const torch::Tensor& indices) const { return {indices, indices}; }
};

/// The job: `samples` samples, `score(predictor, first, count)` their probabilities on a worker.
template <class Model, class... Policies, class MakePredictor, class Score>
BatchPredictions run_job(const std::filesystem::path& checkpoint, std::int64_t samples, MakePredictor make_predictor,
                         Score score, const BatchPredictConfig& config, const ScalingConfig& scaling, RunConfig run) {
  config.validate();
  if (!launch::detect_worker()) claim_output(config, checkpoint, samples);  // the driver, once
  using Job = Trainer<Model, SampleCount, Policies...>;
  Job job(scaling, std::move(run));
  std::vector<std::string> names;
  auto result = job.fit([&](typename Job::context& ctx) {
    auto predictor = make_predictor();
    std::filesystem::create_directories(config.output / "parts");  // under a launcher no driver made it
    const std::int64_t parts = (samples + config.part_size - 1) / config.part_size;
    const int world = ctx.world_size();
    const std::int64_t rounds = (parts + world - 1) / world;
    std::int64_t scored = 0;
    for (std::int64_t r = 0; r < rounds; ++r) {
      const std::int64_t p = r * world + ctx.world_rank();
      std::int64_t here = 0;
      if (p < parts && !std::filesystem::exists(config.output / part_name(p, config))) {
        const auto first = p * config.part_size, count = std::min(config.part_size, samples - first);
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
/// The class names are the checkpoint's `config.labels` LabelEncoder when it holds one.
template <class Model, class... Policies, data::RandomAccess Dataset>
BatchPredictions batch_predict(const std::filesystem::path& checkpoint, const Dataset& data,
                               const BatchPredictConfig& config, const ScalingConfig& scaling = {},
                               RunConfig run = {.name = "batch_predict"}) {
  auto make = [&] {
    auto p = Predictor<Model>::from_checkpoint(checkpoint);  // verifies every file's CRC-32
    if (!config.class_names.empty()) {
      p.set_class_names(config.class_names);
    } else if (const auto ck = checkpointer::Checkpoint::open(checkpoint, nullptr, /*verify_files=*/false);
               ck && ck->has_object(config.labels)) {
      data::LabelEncoder labels;
      ck->load_object(config.labels, labels);
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
                               const ScalingConfig& scaling = {}, RunConfig run = {.name = "batch_predict"}) {
  auto make = [&] { return Predictor<Model>::from_checkpoint(checkpoint, inputs); };
  auto score = [&](Predictor<Model>& p, std::int64_t first, std::int64_t count) {
    return p.predict(std::vector<std::string>(raw.begin() + first, raw.begin() + first + count)).probabilities();
  };
  return detail::run_job<Model, Policies...>(checkpoint, static_cast<std::int64_t>(raw.size()), make, score, config,
                                             scaling, std::move(run));
}

}  // namespace evaluation

DTRAIN_NAMESPACE_END
