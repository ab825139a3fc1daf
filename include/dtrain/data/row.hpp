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
      std::int64_t line);

  const std::vector<std::string>& columns() const {
    static const std::vector<std::string> none;
    return columns_ ? *columns_ : none;
  }
  std::size_t size() const { return values_.size(); }
  bool contains(const std::string& column) const { return index_of(column) >= 0; }

  /// The value of `column`; DataError naming the row's file, line and columns when it has none.
  const Value& operator[](const std::string& column) const;
  const Value& at(std::size_t i) const { return values_.at(i); }

  /// `column` as text (numbers are written out; a missing value is "").
  std::string text(const std::string& column) const;
  /// `column` as a whole number; DataError when it holds text or nothing.
  std::int64_t integer(const std::string& column) const;
  /// `column` as a real number (a whole number converts); DataError when it holds text or nothing.
  double number(const std::string& column) const;

  /// "FILE:LINE", where the record starts.
  std::string where() const { return file_ + ":" + std::to_string(line_); }
  const std::string& file() const { return file_; }
  std::int64_t line() const { return line_; }

 private:
  std::ptrdiff_t index_of(const std::string& column) const;
  std::string column_list() const;
  static std::string describe(const Value& v);

  std::shared_ptr<const std::vector<std::string>> columns_;
  std::vector<Value> values_;
  std::string file_;
  std::int64_t line_ = 0;
};

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/row.ipp>
#endif
