// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::CsvSource: an RFC 4180 CSV file read by row index. Opening it scans the file once, in
// chunks, checking every row and recording where each starts (8 bytes and a line number per row);
// row(i) then reads and parses that row alone, so memory does not grow with the file.

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <dtrain/data/row.hpp>
#include <dtrain/data/text_file.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// How a CSV column's text becomes a Value.
enum class column_type { text, integer, real };

struct CsvOptions {
  char delimiter = ',';
  /// Column types by name; columns not named are text. An empty integer or real cell is missing.
  std::map<std::string, column_type> types;
};

namespace detail {

// "a", "b", ...: column names in an error message.
std::string joined_names(const std::vector<std::string>& names);

// A typed cell's value: empty is missing; otherwise the whole cell must parse (std::from_chars:
// the same on every locale, where std::stod reads "0,5" under a German one). Leading blanks and
// one '+' are accepted, as std::stoll and Python's int() accept them.
Value typed_cell(std::string_view cell, column_type type, const std::string& file, std::int64_t line,
                 std::size_t column, const std::string& name);

// RFC 4180's grammar, one character at a time, so that the index scan (chunk by chunk) and the
// row parser (one row's bytes) share it. Fields may be quoted; a quoted field holds delimiters,
// newlines and doubled quotes. Records end at LF or CRLF outside quotes; blank lines are skipped.
class CsvMachine {
 public:
  CsvMachine(std::string file, char delimiter, std::int64_t first_line = 1)
      : file_(std::move(file)), delim_(delimiter), line_(first_line) {}

  /// What feed() saw: nothing special, the start of a record, or the end of one.
  enum class event { none, row_start, row_end };

  // `keep`: whether to build the fields' text (the index scan only checks and counts).
  event feed(char c, bool keep);

  /// The end of the input: closes a record without a final newline; an open quote is an error.
  event finish(bool keep);

  std::int64_t fields_in_row() const { return fields_done_; }
  std::int64_t row_line() const { return row_line_; }
  std::vector<std::string>& fields() { return fields_out_; }

  [[noreturn]] void fail(const std::string& what) const;

 private:
  void end_field(bool keep);

  std::string file_;
  char delim_;
  std::int64_t line_, row_line_ = 0, fields_done_ = 0;
  bool quoted_ = false, quote_pending_ = false, closed_ = false, in_row_ = false, fresh_ = true;
  std::string field_;
  std::vector<std::string> fields_out_;
};

}  // namespace detail

/// A CSV file with a header row, read by row index. Thread-safe reads (loader threads share it).
///
///   auto src = data::CsvSource("dataset.csv", {.types = {{"id", data::column_type::integer}}});
///   data::Row r = src.row(0);   // r.text("title"), r.integer("id")
class CsvSource {
 public:
  explicit CsvSource(const std::filesystem::path& path, CsvOptions options = {});

  /// The number of records after the header.
  std::int64_t size() const { return static_cast<std::int64_t>(lines_.size()); }
  const std::vector<std::string>& columns() const { return *columns_; }
  const std::string& path() const { return file_->path(); }

  /// Record `i` (0-based, after the header), parsed and typed. Throws DataError naming the file,
  /// line and column when a typed cell does not parse.
  Row row(std::int64_t i) const;

 private:
  void index();

  std::vector<std::string> parse(std::string_view bytes, std::int64_t line) const;

  Value typed(std::string cell, std::size_t column, std::int64_t line) const;

  std::shared_ptr<detail::ReadOnlyFile> file_;
  CsvOptions options_;
  std::shared_ptr<const std::vector<std::string>> columns_;
  std::vector<std::uint64_t> offsets_;  // record i spans [offsets_[i], offsets_[i + 1])
  std::vector<std::int64_t> lines_;     // the line record i starts on
};

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/csv.ipp>
#endif
