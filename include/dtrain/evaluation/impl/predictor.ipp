// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of predictor.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/evaluation/predictor.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace evaluation {

DTRAIN_INLINE Prediction Predictions::operator[](std::int64_t i) const {
  if (i < 0 || i >= size())
    throw ConfigError("Predictions: sample " + std::to_string(i) + " is outside [0, " + std::to_string(size()) + ")");
  const auto row = probabilities_[i].to(torch::kFloat64).contiguous();
  Prediction p;
  p.probabilities.assign(row.data_ptr<double>(), row.data_ptr<double>() + row.numel());
  p.class_index = row.argmax().item<std::int64_t>();
  p.label = names_.at(static_cast<std::size_t>(p.class_index));
  if (logits_.defined()) {
    const auto scores = logits_[i].to(torch::kFloat64).contiguous();
    p.logits.assign(scores.data_ptr<double>(), scores.data_ptr<double>() + scores.numel());
  }
  return p;
}
}  // namespace evaluation
DTRAIN_NAMESPACE_END
