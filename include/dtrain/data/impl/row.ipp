// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of row.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/row.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

DTRAIN_INLINE Row::Row(std::shared_ptr<const std::vector<std::string>> columns, std::vector<Value> values, std::string file,
                       std::int64_t line)
    : columns_(std::move(columns)), values_(std::move(values)), file_(std::move(file)), line_(line) {}

DTRAIN_INLINE const Value& Row::operator[](const std::string& column) const {
  const auto i = index_of(column);
  if (i < 0) throw DataError(where() + ": no column \"" + column + "\"; the columns are: " + column_list());
  return values_[static_cast<std::size_t>(i)];
}

DTRAIN_INLINE std::string Row::text(const std::string& column) const {
  const auto& v = (*this)[column];
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* i = std::get_if<std::int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return std::to_string(*d);
  return {};
}

DTRAIN_INLINE std::int64_t Row::integer(const std::string& column) const {
  const auto& v = (*this)[column];
  if (const auto* i = std::get_if<std::int64_t>(&v)) return *i;
  throw DataError(where() + ": column \"" + column + "\" is not a whole number (" + describe(v) +
                  "); declare it integer in the source's column types");
}

DTRAIN_INLINE double Row::number(const std::string& column) const {
  const auto& v = (*this)[column];
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
  throw DataError(where() + ": column \"" + column + "\" is not a number (" + describe(v) +
                  "); declare it real in the source's column types");
}

DTRAIN_INLINE std::ptrdiff_t Row::index_of(const std::string& column) const {
  const auto& cs = columns();
  for (std::size_t i = 0; i < cs.size() && i < values_.size(); ++i)
    if (cs[i] == column) return static_cast<std::ptrdiff_t>(i);
  return -1;
}

DTRAIN_INLINE std::string Row::column_list() const {
  std::string s;
  for (const auto& c : columns()) s += (s.empty() ? "\"" : ", \"") + c + "\"";
  return s.empty() ? "(none)" : s;
}

DTRAIN_INLINE std::string Row::describe(const Value& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return "text \"" + s->substr(0, 40) + "\"";
  if (std::holds_alternative<std::monostate>(v)) return "missing";
  return "a number";
}
}  // namespace data
DTRAIN_NAMESPACE_END
