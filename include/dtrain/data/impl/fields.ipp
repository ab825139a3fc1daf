// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of fields.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/fields.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

DTRAIN_INLINE Fields& Fields::set(const std::string& name, torch::Tensor tensor) {
  if (name.empty()) throw DataError("Fields: a field needs a name; got an empty one");
  for (auto& [n, t] : entries_)
    if (n == name) {
      t = std::move(tensor);
      return *this;
    }
  entries_.emplace_back(name, std::move(tensor));
  return *this;
}

DTRAIN_INLINE bool Fields::erase(const std::string& name) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->first == name) {
      entries_.erase(it);
      return true;
    }
  return false;
}

DTRAIN_INLINE const torch::Tensor& Fields::at(const std::string& name) const {
  if (const auto* t = find(name)) return *t;
  throw DataError("batch has no field \"" + name + "\"; its fields are: " + names_text() +
                  ". Produce it in the dataset's get_batch or a pipeline stage (map, collate)");
}

DTRAIN_INLINE std::int64_t Fields::size() const {
  for (const auto& [n, t] : entries_)
    if (t.defined()) return t.dim() > 0 ? t.size(0) : 1;
  return 0;
}

DTRAIN_INLINE std::vector<std::string> Fields::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.first);
  return out;
}

DTRAIN_INLINE Fields Fields::to(torch::Device device, bool non_blocking) const {
  Fields out;
  for (const auto& [n, t] : entries_) out.entries_.emplace_back(n, t.defined() ? t.to(device, non_blocking) : t);
  return out;
}

DTRAIN_INLINE std::string Fields::names_text() const {
  if (entries_.empty()) return "(none)";
  std::string s;
  for (const auto& [n, t] : entries_) s += (s.empty() ? "\"" : ", \"") + n + "\"";
  return s;
}

DTRAIN_INLINE std::int64_t batch_size(const torch::data::Example<>& b) {
  return b.data.defined() && b.data.dim() > 0 ? b.data.size(0) : 0;
}
}  // namespace data
DTRAIN_NAMESPACE_END
