// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::Row: one record of a file-backed source (a CSV row, a JSON Lines object): named, typed
// values, and where the record came from, so that every error can name the file and line.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// A cell: missing (null / an empty typed CSV cell), text, a whole number or a real number.
using Value = std::variant<std::monostate, std::string, std::int64_t, double>;

/// One record: values by column name, in the source's column order.
class Row {
 public:
  Row() = default;
  Row(std::shared_ptr<const std::vector<std::string>> columns, std::vector<Value> values, std::string file,
      std::int64_t line)
      : columns_(std::move(columns)), values_(std::move(values)), file_(std::move(file)), line_(line) {}

  const std::vector<std::string>& columns() const {
    static const std::vector<std::string> none;
    return columns_ ? *columns_ : none;
  }
  std::size_t size() const { return values_.size(); }
  bool contains(const std::string& column) const { return index_of(column) >= 0; }

  /// The value of `column`; DataError naming the row's file, line and columns when it has none.
  const Value& operator[](const std::string& column) const {
    const auto i = index_of(column);
    if (i < 0) throw DataError(where() + ": no column \"" + column + "\"; the columns are: " + column_list());
    return values_[static_cast<std::size_t>(i)];
  }
  const Value& at(std::size_t i) const { return values_.at(i); }

  /// `column` as text (numbers are written out; a missing value is "").
  std::string text(const std::string& column) const {
    const auto& v = (*this)[column];
    if (const auto* s = std::get_if<std::string>(&v)) return *s;
    if (const auto* i = std::get_if<std::int64_t>(&v)) return std::to_string(*i);
    if (const auto* d = std::get_if<double>(&v)) return std::to_string(*d);
    return {};
  }
  /// `column` as a whole number; DataError when it holds text or nothing.
  std::int64_t integer(const std::string& column) const {
    const auto& v = (*this)[column];
    if (const auto* i = std::get_if<std::int64_t>(&v)) return *i;
    throw DataError(where() + ": column \"" + column + "\" is not a whole number (" + describe(v) +
                    "); declare it integer in the source's column types");
  }
  /// `column` as a real number (a whole number converts); DataError when it holds text or nothing.
  double number(const std::string& column) const {
    const auto& v = (*this)[column];
    if (const auto* d = std::get_if<double>(&v)) return *d;
    if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
    throw DataError(where() + ": column \"" + column + "\" is not a number (" + describe(v) +
                    "); declare it real in the source's column types");
  }

  /// "FILE:LINE", where the record starts.
  std::string where() const { return file_ + ":" + std::to_string(line_); }
  const std::string& file() const { return file_; }
  std::int64_t line() const { return line_; }

 private:
  std::ptrdiff_t index_of(const std::string& column) const {
    const auto& cs = columns();
    for (std::size_t i = 0; i < cs.size() && i < values_.size(); ++i)
      if (cs[i] == column) return static_cast<std::ptrdiff_t>(i);
    return -1;
  }
  std::string column_list() const {
    std::string s;
    for (const auto& c : columns()) s += (s.empty() ? "\"" : ", \"") + c + "\"";
    return s.empty() ? "(none)" : s;
  }
  static std::string describe(const Value& v) {
    if (const auto* s = std::get_if<std::string>(&v)) return "text \"" + s->substr(0, 40) + "\"";
    if (std::holds_alternative<std::monostate>(v)) return "missing";
    return "a number";
  }

  std::shared_ptr<const std::vector<std::string>> columns_;
  std::vector<Value> values_;
  std::string file_;
  std::int64_t line_ = 0;
};

}  // namespace data

DTRAIN_NAMESPACE_END
