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
inline std::string joined_names(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "\"" : ", \"") + n + "\"";
  return s;
}

// A typed cell's value: empty is missing; otherwise the whole cell must parse (std::from_chars:
// the same on every locale, where std::stod reads "0,5" under a German one). Leading blanks and
// one '+' are accepted, as std::stoll and Python's int() accept them.
inline Value typed_cell(std::string_view cell, column_type type, const std::string& file, std::int64_t line,
                        std::size_t column, const std::string& name) {
  if (cell.empty()) return std::monostate{};
  auto s = cell;
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  if (s.size() > 1 && s.front() == '+' && s[1] != '-') s.remove_prefix(1);
  const char* end = s.data() + s.size();
  if (type == column_type::integer) {
    std::int64_t v = 0;
    const auto [at, ec] = std::from_chars(s.data(), end, v);
    if (ec == std::errc() && at == end) return v;
  } else {
    double v = 0;
    const auto [at, ec] = std::from_chars(s.data(), end, v);
    if (ec == std::errc() && at == end) return v;
  }
  throw DataError(file + ": line " + std::to_string(line) + ", column " + std::to_string(column + 1) + " (\"" + name +
                  "\"): \"" + std::string(cell.substr(0, 40)) + "\" is not " +
                  (type == column_type::integer ? "a whole number" : "a real number") +
                  ", as CsvOptions::types declares; fix the file or declare the column text");
}

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
  event feed(char c, bool keep) {
    if (quoted_) {
      if (quote_pending_) {
        quote_pending_ = false;
        if (c == '"') {
          if (keep) field_ += '"';
          return event::none;
        }
        quoted_ = false;
        closed_ = true;  // the quoted field ended; only a delimiter or the record's end may follow
      } else {
        if (c == '"') quote_pending_ = true;
        else {
          if (c == '\n') ++line_;
          if (keep) field_ += c;
        }
        return event::none;
      }
    }
    if (c == '\n') {
      ++line_;
      if (!in_row_) return event::none;  // a blank line
      end_field(keep);
      in_row_ = false;
      return event::row_end;
    }
    event e = event::none;
    if (!in_row_) {
      if (c == '\r') return event::none;
      in_row_ = true;
      row_line_ = line_;
      fields_done_ = 0;
      fresh_ = true;
      e = event::row_start;
    }
    if (c == '\r') return e;  // CRLF's CR (a CR elsewhere outside quotes is dropped too)
    if (c == delim_) {
      end_field(keep);
      return e;
    }
    if (closed_)
      fail("text after the closing quote of a quoted field; a quoted field ends at the delimiter or the end of "
           "the line (write a quote inside it as \"\")");
    if (c == '"') {
      if (!fresh_)
        fail("a quote inside an unquoted field; quote the whole field and double the quotes inside it (\"a \"\"b\"\"\")");
      quoted_ = true;
      fresh_ = false;
      return e;
    }
    fresh_ = false;
    if (keep) field_ += c;
    return e;
  }

  /// The end of the input: closes a record without a final newline; an open quote is an error.
  event finish(bool keep) {
    if (quoted_ && !quote_pending_) {
      line_ = row_line_;
      fail("a quoted field is not closed before the end of the file; close it with \"");
    }
    quoted_ = false;
    quote_pending_ = false;
    if (!in_row_) return event::none;
    end_field(keep);
    in_row_ = false;
    return event::row_end;
  }

  std::int64_t fields_in_row() const { return fields_done_; }
  std::int64_t row_line() const { return row_line_; }
  std::vector<std::string>& fields() { return fields_out_; }

  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(file_ + ": line " + std::to_string(line_) + ", column " + std::to_string(fields_done_ + 1) +
                    ": malformed CSV: " + what);
  }

 private:
  void end_field(bool keep) {
    if (keep) fields_out_.push_back(std::move(field_));
    field_.clear();
    ++fields_done_;
    closed_ = false;
    fresh_ = true;
  }

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
  explicit CsvSource(const std::filesystem::path& path, CsvOptions options = {})
      : file_(std::make_shared<detail::ReadOnlyFile>(path)), options_(std::move(options)) {
    index();
    for (const auto& [name, type] : options_.types) {
      bool found = false;
      for (const auto& c : *columns_) found = found || c == name;
      if (!found)
        throw DataError(file_->path() + ": CsvOptions::types names column \"" + name +
                        "\", which the header does not have; the columns are: " + detail::joined_names(*columns_));
    }
  }

  /// The number of records after the header.
  std::int64_t size() const { return static_cast<std::int64_t>(lines_.size()); }
  const std::vector<std::string>& columns() const { return *columns_; }
  const std::string& path() const { return file_->path(); }

  /// Record `i` (0-based, after the header), parsed and typed. Throws DataError naming the file,
  /// line and column when a typed cell does not parse.
  Row row(std::int64_t i) const {
    if (i < 0 || i >= size())
      throw DataError(path() + ": row " + std::to_string(i) + " is outside [0, " + std::to_string(size()) + ")");
    const auto at = offsets_[static_cast<std::size_t>(i)];
    const auto bytes = file_->read(at, offsets_[static_cast<std::size_t>(i) + 1] - at);
    auto fields = parse(bytes, lines_[static_cast<std::size_t>(i)]);
    std::vector<Value> values;
    values.reserve(fields.size());
    for (std::size_t c = 0; c < fields.size(); ++c) values.push_back(typed(std::move(fields[c]), c, lines_[static_cast<std::size_t>(i)]));
    return Row(columns_, std::move(values), path(), lines_[static_cast<std::size_t>(i)]);
  }

 private:
  void index() {
    detail::CsvMachine m(path(), options_.delimiter);
    std::int64_t rows = 0;
    std::optional<std::int64_t> width;
    std::uint64_t header_end = 0;
    auto on = [&](detail::CsvMachine::event e, std::uint64_t at) {
      if (e == detail::CsvMachine::event::row_start) {
        if (width) {
          offsets_.push_back(at);
          lines_.push_back(m.row_line());
        }
      } else if (e == detail::CsvMachine::event::row_end) {
        if (!width) {
          width = m.fields_in_row();
          header_end = at;
        } else if (m.fields_in_row() != *width) {
          throw DataError(path() + ": line " + std::to_string(m.row_line()) + ", column " +
                          std::to_string(std::min(m.fields_in_row(), *width) + 1) + ": malformed CSV: the record has " +
                          std::to_string(m.fields_in_row()) + " fields and the header " + std::to_string(*width) +
                          "; quote fields that hold the delimiter");
        }
        ++rows;
      }
    };
    file_->scan([&](std::string_view chunk, std::uint64_t base) {
      for (std::size_t k = 0; k < chunk.size(); ++k) on(m.feed(chunk[k], false), base + k);
    });
    on(m.finish(false), file_->size());
    if (!width) throw DataError(path() + ": is empty; a CSV source needs a header row naming its columns");
    offsets_.push_back(file_->size());  // the end of the last record
    offsets_.shrink_to_fit();
    lines_.shrink_to_fit();
    auto header = parse(file_->read(0, header_end + 1), 1);
    columns_ = std::make_shared<const std::vector<std::string>>(std::move(header));
  }

  std::vector<std::string> parse(std::string_view bytes, std::int64_t line) const {
    detail::CsvMachine m(path(), options_.delimiter, line);
    for (char c : bytes)
      if (m.feed(c, true) == detail::CsvMachine::event::row_end) return std::move(m.fields());
    m.finish(true);
    return std::move(m.fields());
  }

  Value typed(std::string cell, std::size_t column, std::int64_t line) const {
    const auto& name = (*columns_)[column];
    const auto it = options_.types.find(name);
    if (it == options_.types.end() || it->second == column_type::text) return cell;
    return detail::typed_cell(cell, it->second, path(), line, column, name);
  }

  std::shared_ptr<detail::ReadOnlyFile> file_;
  CsvOptions options_;
  std::shared_ptr<const std::vector<std::string>> columns_;
  std::vector<std::uint64_t> offsets_;  // record i spans [offsets_[i], offsets_[i + 1])
  std::vector<std::int64_t> lines_;     // the line record i starts on
};

}  // namespace data

DTRAIN_NAMESPACE_END
