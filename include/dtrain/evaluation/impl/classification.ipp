// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of classification.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/evaluation/classification.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace evaluation {

DTRAIN_INLINE ConfusionMatrix::ConfusionMatrix(std::int64_t num_classes) : counts_(torch::zeros({num_classes, num_classes}, torch::kFloat64)) {
  if (num_classes < 2)
    throw ConfigError("ConfusionMatrix needs at least 2 classes, got " + std::to_string(num_classes));
}

DTRAIN_INLINE void ConfusionMatrix::update(const torch::Tensor& predictions, const torch::Tensor& targets) {
  torch::NoGradGuard no_grad;
  const auto pred = (predictions.dim() == 2 ? predictions.argmax(1) : predictions).to(torch::kCPU, torch::kInt64);
  const auto truth = targets.to(torch::kCPU, torch::kInt64);
  if (pred.dim() != 1 || truth.dim() != 1 || pred.size(0) != truth.size(0))
    throw ConfigError("ConfusionMatrix::update: " + std::to_string(pred.numel()) + " predictions for " +
                      std::to_string(truth.numel()) + " targets; give one prediction per target");
  const auto c = num_classes();
  if (pred.numel() > 0 && (truth.min().item<std::int64_t>() < 0 || truth.max().item<std::int64_t>() >= c ||
                           pred.min().item<std::int64_t>() < 0 || pred.max().item<std::int64_t>() >= c))
    throw ConfigError("ConfusionMatrix::update: a class index is outside [0, " + std::to_string(c) + ")");
  counts_ += torch::bincount(truth * c + pred, {}, c * c).view({c, c}).to(torch::kFloat64);
}

DTRAIN_INLINE void ConfusionMatrix::merge(const ConfusionMatrix& other) {
  if (other.num_classes() != num_classes())
    throw ConfigError("ConfusionMatrix::merge: " + std::to_string(other.num_classes()) + " classes into " +
                      std::to_string(num_classes()));
  counts_ += other.counts_;
}

DTRAIN_INLINE std::vector<std::vector<std::int64_t>> ConfusionMatrix::counts_table() const {
  const auto c = num_classes();
  const auto cpu = counts_.to(torch::kCPU).contiguous();
  const double* v = cpu.data_ptr<double>();
  std::vector<std::vector<std::int64_t>> rows(static_cast<std::size_t>(c));
  for (std::int64_t t = 0; t < c; ++t)
    for (std::int64_t p = 0; p < c; ++p) rows[t].push_back(static_cast<std::int64_t>(v[t * c + p]));
  return rows;
}

DTRAIN_INLINE double ConfusionMatrix::accuracy() const {
  const double n = counts_.sum().item<double>();
  return n > 0 ? counts_.diagonal().sum().item<double>() / n : 0.0;
}

DTRAIN_INLINE ConfusionMatrix::PerClass ConfusionMatrix::per_class() const {
  const auto c = num_classes();
  const auto tp = counts_.diagonal(), predicted = counts_.sum(0), actual = counts_.sum(1);
  PerClass out;
  for (std::int64_t k = 0; k < c; ++k) {
    const double t = tp[k].item<double>(), p = predicted[k].item<double>(), a = actual[k].item<double>();
    const double prec = p > 0 ? t / p : 0.0, rec = a > 0 ? t / a : 0.0;
    out.precision.push_back(prec);
    out.recall.push_back(rec);
    out.f1.push_back(prec + rec > 0 ? 2 * prec * rec / (prec + rec) : 0.0);
    out.support.push_back(a);
  }
  return out;
}

DTRAIN_INLINE Metrics ConfusionMatrix::summary(const std::string& prefix) const {
  const auto pc = per_class();
  double total_support = 0;
  for (double s : pc.support) total_support += s;
  auto mean = [&](const std::vector<double>& v, bool weighted) {
    double sum = 0;
    for (std::size_t k = 0; k < v.size(); ++k) sum += weighted ? v[k] * pc.support[k] : v[k];
    const double denominator = weighted ? total_support : static_cast<double>(v.size());
    return denominator > 0 ? sum / denominator : 0.0;
  };
  return {{prefix + "accuracy", accuracy()},
          {prefix + "precision_macro", mean(pc.precision, false)},
          {prefix + "recall_macro", mean(pc.recall, false)},
          {prefix + "f1_macro", mean(pc.f1, false)},
          {prefix + "precision_weighted", mean(pc.precision, true)},
          {prefix + "recall_weighted", mean(pc.recall, true)},
          {prefix + "f1_weighted", mean(pc.f1, true)}};
}
}  // namespace evaluation
DTRAIN_NAMESPACE_END
