// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of batch_predict.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/evaluation/batch_predict.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace evaluation {

DTRAIN_INLINE void BatchPredictConfig::validate() const {
  if (output.empty()) throw ConfigError("BatchPredictConfig::output is empty; name the directory for the predictions");
  if (batch < 1) throw ConfigError("BatchPredictConfig::batch must be at least 1, got " + std::to_string(batch));
  if (part_size < 0 || part_size % batch != 0)
    throw ConfigError("BatchPredictConfig::part_size must be a positive multiple of batch (" + std::to_string(batch) +
                      "), got " + std::to_string(part_size) + "; e.g. " +
                      std::to_string(batch * std::max<std::int64_t>(1, part_size / batch)) +
                      ", or leave it 0 (the default) for the largest multiple of batch up to " +
                      std::to_string(default_part_size));
}

namespace detail {

DTRAIN_INLINE std::string as_job_message(std::string message) {
  static const std::string training = "training failed", job = "batch prediction failed";
  for (auto at = message.find(training); at != std::string::npos; at = message.find(training, at + job.size()))
    message.replace(at, training.size(), job);
  return message;
}

DTRAIN_INLINE std::string part_name(std::int64_t p, const BatchPredictConfig& c) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "part_%06" PRId64, p);
  return std::string("parts/") + buf + c.extension();
}

DTRAIN_INLINE std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return q + "\"";
}

DTRAIN_INLINE std::string header(const std::vector<std::string>& names, const BatchPredictConfig& c) {
  if (c.format != PredictionFormat::csv) return {};
  std::string h = "index,label,class_index,probability";
  for (const auto& n : names) h += "," + csv_field("p_" + n);
  return h + "\n";
}

DTRAIN_INLINE std::string rows(const torch::Tensor& probs, std::int64_t first, const std::vector<std::string>& names,
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

DTRAIN_INLINE void publish(const std::filesystem::path& path, const std::string& bytes) {
  const auto tmp = path.string() + ".tmp";
  checkpointer::detail::write_file(tmp, bytes);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(path.string() + ": cannot rename the finished file into place (" + ec.message() + ")");
  checkpointer::detail::fsync_directory(path.parent_path());
}

DTRAIN_INLINE void claim_output(const BatchPredictConfig& c, const std::filesystem::path& checkpoint, std::int64_t samples) {
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
                              {"model_crc32", model_crc}, {"samples", samples}, {"part_size", c.part_samples()},
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

DTRAIN_INLINE void join_parts(const BatchPredictConfig& c, std::int64_t samples, const std::vector<std::string>& names) {
  const std::int64_t part = c.part_samples(), parts = (samples + part - 1) / part;
  std::string all = header(names, c);
  nlohmann::json list = nlohmann::json::array();
  for (std::int64_t p = 0; p < parts; ++p) {
    const auto name = part_name(p, c);
    const std::string text = checkpointer::detail::read_text(c.output / name);
    const auto first = p * part, count = std::min(part, samples - first);
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
}  // namespace detail
}  // namespace evaluation
DTRAIN_NAMESPACE_END
