// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::read_csv: a CSV file read once into memory, as a table of cells. CsvSource keeps memory
// bounded (an index scan, then one pread and parse per row); a table that fits in memory is read
// with one read() and parsed in place (each cell a span of the file's bytes, quotes undone in
// place), so splitting and fitting on a column cost no second pass and no string per cell.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <dtrain/data/csv.hpp>
#include <dtrain/data/row.hpp>
#include <dtrain/data/text_file.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// A CSV file in memory, with CsvSource's grammar, errors and column types. `column(name)[i]` is
/// a std::string_view into the table; `row(i)` gives a data::Row, so a table is a row source for
/// Subset and pipelined() too. Copies share the bytes. Thread-safe reads.
///
///   const auto t = data::read_csv("dataset.csv");
///   for (std::string_view tag : t.column("tag")) ...
class CsvTable {
 public:
  /// One column's cells, by row index.
  class TextColumn {
   public:
    TextColumn(const CsvTable& t, std::size_t column) : table_(&t), column_(column) {}
    std::int64_t size() const { return table_->size(); }
    std::string_view operator[](std::int64_t row) const { return table_->text(row, column_); }
    struct iterator {
      using iterator_category = std::forward_iterator_tag;
      using value_type = std::string_view;
      using difference_type = std::ptrdiff_t;
      using pointer = void;
      using reference = std::string_view;
      const TextColumn* c = nullptr;
      std::int64_t i = 0;
      std::string_view operator*() const { return (*c)[i]; }
      iterator& operator++() { return ++i, *this; }
      iterator operator++(int) { return {c, i++}; }
      bool operator==(const iterator& o) const { return i == o.i; }
    };
    iterator begin() const { return {this, 0}; }
    iterator end() const { return {this, size()}; }

   private:
    const CsvTable* table_;
    std::size_t column_;
  };

  explicit CsvTable(const std::filesystem::path& path, CsvOptions options = {});

  /// The number of records after the header.
  std::int64_t size() const { return static_cast<std::int64_t>(lines_->size()); }
  const std::vector<std::string>& columns() const { return *columns_; }
  const std::string& path() const { return path_; }

  /// The position of `name` among the columns; DataError naming the columns when absent.
  std::size_t column_index(const std::string& name) const;
  TextColumn column(const std::string& name) const { return TextColumn(*this, column_index(name)); }

  /// Cell (row, column) as it is in the file, quotes undone; valid while the table lives.
  std::string_view text(std::int64_t row, std::size_t column) const;
  /// The line record `row` starts on.
  std::int64_t line(std::int64_t row) const { return (*lines_)[static_cast<std::size_t>(row)]; }

  /// Record `i`, typed as CsvOptions::types declares (as CsvSource::row gives it).
  Row row(std::int64_t i) const;

 private:
  struct Span {
    std::uint64_t begin, end;
  };

  [[noreturn]] void fail(std::int64_t line, std::int64_t column, const std::string& what) const;

  // RFC 4180 as detail::CsvMachine reads it, a run of plain characters at a time. Cells are
  // compacted in place: `w` trails `r` once a doubled quote or a dropped CR has been removed.
  void parse(std::string& bytes, std::vector<Span>& cells, std::vector<std::int64_t>& lines);

  // A typed cell that does not parse is an error now, not when its row is first read.
  void check_types();

  Value typed(std::int64_t row, std::size_t column) const;

  std::string path_;
  CsvOptions options_;
  // Shared and immutable once read: a copy of the table (into a Subset, a pipeline) costs nothing.
  std::shared_ptr<const std::string> bytes_;  // the file, each cell's quotes undone in place
  std::shared_ptr<const std::vector<std::string>> columns_;
  std::size_t width_ = 0;
  std::shared_ptr<const std::vector<Span>> cells_;  // row-major, width_ per record
  std::shared_ptr<const std::vector<std::int64_t>> lines_;
  std::vector<column_type> types_;  // by column; empty: all text
};

/// `path` read into memory at once (see CsvTable); CsvSource when it may not fit.
inline CsvTable read_csv(const std::filesystem::path& path, CsvOptions options = {}) {
  return CsvTable(path, std::move(options));
}

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/csv_table.ipp>
#endif
