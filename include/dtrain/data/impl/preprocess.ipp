// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of preprocess.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/preprocess.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {
namespace detail {

DTRAIN_INLINE void write_json(torch::serialize::OutputArchive& a, const char* kind, const nlohmann::json& j) {
  a.write("kind", c10::IValue(std::string(kind)));
  a.write("state", c10::IValue(j.dump()));
}

DTRAIN_INLINE nlohmann::json read_json(torch::serialize::InputArchive& a, const char* kind) {
  c10::IValue k, s;
  a.read("kind", k);
  if (!k.isString() || k.toStringRef() != kind)
    throw DataError(std::string("this object holds a ") + (k.isString() ? k.toStringRef() : "non-preprocessor") +
                    ", not a " + kind + "; load it into the type it was saved from");
  a.read("state", s);
  return nlohmann::json::parse(s.toStringRef());
}
}  // namespace detail

DTRAIN_INLINE std::int64_t LabelEncoder::transform(const std::string& name) const {
  const auto it = ids_.find(name);
  if (it == ids_.end()) {
    std::string known;
    for (std::size_t i = 0; i < classes_.size() && i < 20; ++i) known += (i ? ", " : "") + classes_[i];
    throw DataError("LabelEncoder: class \"" + name + "\" was not in the training split (known: " + known +
                    (classes_.size() > 20 ? ", ..." : "") + "); drop such rows with data::filter or refit");
  }
  return it->second;
}

DTRAIN_INLINE const std::string& LabelEncoder::inverse(std::int64_t id) const {
  if (id < 0 || id >= size())
    throw DataError("LabelEncoder: id " + std::to_string(id) + " is outside [0, " + std::to_string(size()) + ")");
  return classes_[static_cast<std::size_t>(id)];
}

DTRAIN_INLINE void LabelEncoder::load(torch::serialize::InputArchive& a) {
  classes_ = detail::read_json(a, "LabelEncoder").get<std::vector<std::string>>();
  reindex();
}

DTRAIN_INLINE void LabelEncoder::reindex() {
  ids_.clear();
  for (std::size_t i = 0; i < classes_.size(); ++i) ids_.emplace(classes_[i], static_cast<std::int64_t>(i));
}

DTRAIN_INLINE StandardScaler StandardScaler::fit(const torch::Tensor& x) {
  if (x.dim() != 2 || x.size(0) == 0)
    throw DataError("StandardScaler::fit: expects [samples, features] with at least one sample, got shape " +
                    c10::str(x.sizes()));
  StandardScaler s;
  const auto d = x.to(torch::kFloat64);
  s.mean_ = d.mean(0);
  auto sd = d.std(0, /*unbiased=*/false);
  s.std_ = torch::where(sd > 0, sd, torch::ones_like(sd));
  return s;
}

DTRAIN_INLINE torch::Tensor StandardScaler::transform(const torch::Tensor& x) const {
  if (!mean_.defined()) throw DataError("StandardScaler: transform before fit (or load)");
  if (x.size(-1) != mean_.size(0))
    throw DataError("StandardScaler: fitted on " + std::to_string(mean_.size(0)) + " features, given " +
                    std::to_string(x.size(-1)));
  return ((x.to(torch::kFloat64) - mean_) / std_).to(x.scalar_type());
}

DTRAIN_INLINE void StandardScaler::save(torch::serialize::OutputArchive& a) const {
  a.write("kind", c10::IValue(std::string("StandardScaler")));
  a.write("mean", mean_);
  a.write("std", std_);
}

DTRAIN_INLINE void StandardScaler::load(torch::serialize::InputArchive& a) {
  c10::IValue k;
  a.read("kind", k);
  if (!k.isString() || k.toStringRef() != "StandardScaler")
    throw DataError("this object is not a StandardScaler; load it into the type it was saved from");
  a.read("mean", mean_);
  a.read("std", std_);
}

DTRAIN_INLINE std::vector<std::string> WordVocabulary::tokens(std::string_view text, std::int64_t max_len) {
  std::vector<std::string> out;
  for_each_token(text, max_len, [&](std::string_view t) { out.emplace_back(t); });
  return out;
}

DTRAIN_INLINE void WordVocabulary::load(torch::serialize::InputArchive& a) {
  const auto j = detail::read_json(a, "WordVocabulary");
  max_len_ = j.at("max_len").get<std::int64_t>();
  words_ = j.at("words").get<std::vector<std::string>>();
  reindex();
}
}  // namespace data
DTRAIN_NAMESPACE_END
