// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of csv_table.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/csv_table.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

DTRAIN_INLINE CsvTable::CsvTable(const std::filesystem::path& path, CsvOptions options)
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

DTRAIN_INLINE std::size_t CsvTable::column_index(const std::string& name) const {
  for (std::size_t c = 0; c < columns_->size(); ++c)
    if ((*columns_)[c] == name) return c;
  throw DataError(path_ + ": no column \"" + name + "\"; the columns are: " + detail::joined_names(*columns_));
}

DTRAIN_INLINE std::string_view CsvTable::text(std::int64_t row, std::size_t column) const {
  const auto& s = (*cells_)[static_cast<std::size_t>(row) * width_ + column];
  return std::string_view(bytes_->data() + s.begin, s.end - s.begin);
}

DTRAIN_INLINE Row CsvTable::row(std::int64_t i) const {
  if (i < 0 || i >= size())
    throw DataError(path_ + ": row " + std::to_string(i) + " is outside [0, " + std::to_string(size()) + ")");
  std::vector<Value> values;
  values.reserve(width_);
  for (std::size_t c = 0; c < width_; ++c) values.push_back(typed(i, c));
  return Row(columns_, std::move(values), path_, line(i));
}

DTRAIN_INLINE void CsvTable::fail(std::int64_t line, std::int64_t column, const std::string& what) const {
throw DataError(path_ + ": line " + std::to_string(line) + ", column " + std::to_string(column) +
     ": malformed CSV: " + what);
}

DTRAIN_INLINE void CsvTable::parse(std::string& bytes, std::vector<Span>& cells, std::vector<std::int64_t>& lines) {
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

DTRAIN_INLINE void CsvTable::check_types() {
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

DTRAIN_INLINE Value CsvTable::typed(std::int64_t row, std::size_t column) const {
  const auto cell = text(row, column);
  if (types_.empty() || types_[column] == column_type::text) return std::string(cell);
  return detail::typed_cell(cell, types_[column], path_, line(row), column, (*columns_)[column]);
}
}  // namespace data
DTRAIN_NAMESPACE_END
