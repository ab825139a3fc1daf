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

  explicit CsvTable(const std::filesystem::path& path, CsvOptions options = {})
      : path_(path.string()), options_(std::move(options)) {
    const detail::ReadOnlyFile file(path);
    auto bytes = std::make_shared<std::string>(file.read(0, file.size()));
    auto cells = std::make_shared<std::vector<Span>>();
    auto lines = std::make_shared<std::vector<std::int64_t>>();
    parse(*bytes, *cells, *lines);
    bytes_ = std::move(bytes);
    cells_ = std::move(cells);
    lines_ = std::move(lines);
    check_types();
  }

  /// The number of records after the header.
  std::int64_t size() const { return static_cast<std::int64_t>(lines_->size()); }
  const std::vector<std::string>& columns() const { return *columns_; }
  const std::string& path() const { return path_; }

  /// The position of `name` among the columns; DataError naming the columns when absent.
  std::size_t column_index(const std::string& name) const {
    for (std::size_t c = 0; c < columns_->size(); ++c)
      if ((*columns_)[c] == name) return c;
    throw DataError(path_ + ": no column \"" + name + "\"; the columns are: " + detail::joined_names(*columns_));
  }
  TextColumn column(const std::string& name) const { return TextColumn(*this, column_index(name)); }

  /// Cell (row, column) as it is in the file, quotes undone; valid while the table lives.
  std::string_view text(std::int64_t row, std::size_t column) const {
    const auto& s = (*cells_)[static_cast<std::size_t>(row) * width_ + column];
    return std::string_view(bytes_->data() + s.begin, s.end - s.begin);
  }
  /// The line record `row` starts on.
  std::int64_t line(std::int64_t row) const { return (*lines_)[static_cast<std::size_t>(row)]; }

  /// Record `i`, typed as CsvOptions::types declares (as CsvSource::row gives it).
  Row row(std::int64_t i) const {
    if (i < 0 || i >= size())
      throw DataError(path_ + ": row " + std::to_string(i) + " is outside [0, " + std::to_string(size()) + ")");
    std::vector<Value> values;
    values.reserve(width_);
    for (std::size_t c = 0; c < width_; ++c) values.push_back(typed(i, c));
    return Row(columns_, std::move(values), path_, line(i));
  }

 private:
  struct Span {
    std::uint64_t begin, end;
  };

  [[noreturn]] void fail(std::int64_t line, std::int64_t column, const std::string& what) const {
    throw DataError(path_ + ": line " + std::to_string(line) + ", column " + std::to_string(column) +
                    ": malformed CSV: " + what);
  }

  // RFC 4180 as detail::CsvMachine reads it, a run of plain characters at a time. Cells are
  // compacted in place: `w` trails `r` once a doubled quote or a dropped CR has been removed.
  void parse(std::string& bytes, std::vector<Span>& cells, std::vector<std::int64_t>& lines) {
    char* b = bytes.data();
    const std::size_t n = bytes.size();
    const char delim = options_.delimiter;
    std::size_t r = 0;
    std::int64_t line = 1;
    std::optional<std::size_t> width;
    while (r < n) {
      if (b[r] == '\n') {  // a blank line
        ++line, ++r;
        continue;
      }
      if (b[r] == '\r') {
        ++r;
        continue;
      }
      const std::int64_t row_line = line;
      std::int64_t fields = 0;
      for (bool row_done = false; !row_done;) {
        while (r < n && b[r] == '\r') ++r;  // a CR outside quotes is dropped
        std::size_t start = r, w = r;
        if (r < n && b[r] == '"') {
          start = w = ++r;
          for (;;) {
            const auto* q = static_cast<const char*>(std::memchr(b + r, '"', n - r));
            if (!q) fail(row_line, fields + 1, "a quoted field is not closed before the end of the file; close it with \"");
            const auto len = static_cast<std::size_t>(q - (b + r));
            line += std::count(b + r, b + r + len, '\n');
            if (w != r) std::memmove(b + w, b + r, len);
            w += len;
            r += len + 1;
            if (r < n && b[r] == '"') {  // a doubled quote
              b[w++] = '"';
              ++r;
              continue;
            }
            break;
          }
          while (r < n && b[r] == '\r') ++r;
          if (r < n && b[r] != delim && b[r] != '\n')
            fail(line, fields + 1,
                 "text after the closing quote of a quoted field; a quoted field ends at the delimiter or the end of "
                 "the line (write a quote inside it as \"\")");
        } else {
          for (; r < n; ++r) {
            const char c = b[r];
            if (c == delim || c == '\n') break;
            if (c == '\r') continue;
            if (c == '"')
              fail(line, fields + 1,
                   "a quote inside an unquoted field; quote the whole field and double the quotes inside it (\"a \"\"b\"\"\")");
            b[w++] = c;
          }
        }
        cells.push_back({start, w});
        ++fields;
        if (r == n) row_done = true;
        else if (b[r++] == '\n') ++line, row_done = true;
      }
      if (!width) {
        width = static_cast<std::size_t>(fields);
      } else if (static_cast<std::size_t>(fields) != *width) {
        fail(row_line, std::min<std::int64_t>(fields, static_cast<std::int64_t>(*width)) + 1,
             "the record has " + std::to_string(fields) + " fields and the header " + std::to_string(*width) +
                 "; quote fields that hold the delimiter");
      } else {
        lines.push_back(row_line);
      }
    }
    if (!width) throw DataError(path_ + ": is empty; a CSV source needs a header row naming its columns");
    width_ = *width;
    std::vector<std::string> header;
    for (std::size_t c = 0; c < width_; ++c) header.emplace_back(b + cells[c].begin, cells[c].end - cells[c].begin);
    cells.erase(cells.begin(), cells.begin() + static_cast<std::ptrdiff_t>(width_));
    cells.shrink_to_fit();
    columns_ = std::make_shared<const std::vector<std::string>>(std::move(header));
  }

  // A typed cell that does not parse is an error now, not when its row is first read.
  void check_types() {
    for (const auto& [name, type] : options_.types) {
      const auto c = std::find(columns_->begin(), columns_->end(), name);
      if (c == columns_->end())
        throw DataError(path_ + ": CsvOptions::types names column \"" + name +
                        "\", which the header does not have; the columns are: " + detail::joined_names(*columns_));
      const auto column = static_cast<std::size_t>(c - columns_->begin());
      types_.resize(width_, column_type::text);
      types_[column] = type;
      for (std::int64_t i = 0; i < size(); ++i) (void)typed(i, column);
    }
  }

  Value typed(std::int64_t row, std::size_t column) const {
    const auto cell = text(row, column);
    if (types_.empty() || types_[column] == column_type::text) return std::string(cell);
    return detail::typed_cell(cell, types_[column], path_, line(row), column, (*columns_)[column]);
  }

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
