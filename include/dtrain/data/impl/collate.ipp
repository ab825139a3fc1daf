// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of collate.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/collate.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {
namespace detail {

DTRAIN_INLINE void check_same_fields(const std::vector<Fields>& samples) {
  const auto names = samples.front().names();
  for (const auto& s : samples)
    if (s.names() != names)
      throw DataError("collate: the samples of a batch have different fields; every sample needs the same names "
                      "(the first has " + std::to_string(names.size()) + ", another " + std::to_string(s.names().size()) + ")");
}

DTRAIN_INLINE Fields stack_fields(const std::vector<Fields>& samples, const std::string& skip) {
  Fields out;
  if (samples.empty()) return out;
  check_same_fields(samples);
  for (const auto& name : samples.front().names()) {
    if (name == skip) continue;
    std::vector<torch::Tensor> parts;
    parts.reserve(samples.size());
    for (const auto& s : samples) parts.push_back(s[name]);
    try {
      out.set(name, torch::stack(parts));
    } catch (const c10::Error& e) {
      throw DataError("collate: field \"" + name + "\" has different shapes across the batch's samples (" +
                      e.what_without_backtrace() + "); pad it with data::pad_to_longest(\"" + name + "\")");
    }
  }
  return out;
}
}  // namespace detail

DTRAIN_INLINE pad_to_longest::pad_to_longest(std::string field_name, std::int64_t pad_value, std::string mask_name,
                                             std::int64_t max_len)
    : field(std::move(field_name)), pad(pad_value), mask(std::move(mask_name)), max_length(max_len) {}

DTRAIN_INLINE Fields pad_to_longest::operator()(const std::vector<Fields>& samples) const {
  Fields out;
  if (samples.empty()) return out;
  std::int64_t longest = 0;
  for (const auto& s : samples) {
    const auto& t = s.at(field);
    if (t.dim() != 1)
      throw DataError("pad_to_longest(\"" + field + "\"): each sample's field must be 1-D, got shape " +
                      c10::str(t.sizes()));
    longest = std::max(longest, t.size(0));
  }
  if (max_length > 0) longest = std::min(longest, max_length);
  const auto& proto = samples.front().at(field);
  auto padded = torch::full({static_cast<std::int64_t>(samples.size()), longest}, pad, proto.options());
  auto m = torch::zeros({static_cast<std::int64_t>(samples.size()), longest}, torch::kInt64);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const auto& t = samples[i].at(field);
    const auto len = std::min(t.size(0), longest);
    padded[static_cast<std::int64_t>(i)].narrow(0, 0, len).copy_(t.narrow(0, 0, len));
    m[static_cast<std::int64_t>(i)].narrow(0, 0, len).fill_(1);
  }
  // The padded field and its mask first, then the other fields stacked, in their order.
  for (const auto& name : samples.front().names()) {
    if (name == field) {
      out.set(field, padded);
      out.set(mask, m);
    }
  }
  for (auto& [name, t] : detail::stack_fields(samples, field)) out.set(name, t);
  return out;
}
}  // namespace data
DTRAIN_NAMESPACE_END
