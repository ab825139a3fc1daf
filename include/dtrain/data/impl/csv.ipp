// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of csv.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/csv.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {
namespace detail {

DTRAIN_INLINE std::string joined_names(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "\"" : ", \"") + n + "\"";
  return s;
}

DTRAIN_INLINE Value typed_cell(std::string_view cell, column_type type, const std::string& file, std::int64_t line,
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

DTRAIN_INLINE CsvMachine::event CsvMachine::feed(char c, bool keep) {
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

DTRAIN_INLINE CsvMachine::event CsvMachine::finish(bool keep) {
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

DTRAIN_INLINE void CsvMachine::fail(const std::string& what) const {
throw DataError(file_ + ": line " + std::to_string(line_) + ", column " + std::to_string(fields_done_ + 1) +
     ": malformed CSV: " + what);
}

DTRAIN_INLINE void CsvMachine::end_field(bool keep) {
  if (keep) fields_out_.push_back(std::move(field_));
  field_.clear();
  ++fields_done_;
  closed_ = false;
  fresh_ = true;
}
}  // namespace detail

DTRAIN_INLINE CsvSource::CsvSource(const std::filesystem::path& path, CsvOptions options)
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

DTRAIN_INLINE Row CsvSource::row(std::int64_t i) const {
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

DTRAIN_INLINE void CsvSource::index() {
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

DTRAIN_INLINE std::vector<std::string> CsvSource::parse(std::string_view bytes, std::int64_t line) const {
  detail::CsvMachine m(path(), options_.delimiter, line);
  for (char c : bytes)
    if (m.feed(c, true) == detail::CsvMachine::event::row_end) return std::move(m.fields());
  m.finish(true);
  return std::move(m.fields());
}

DTRAIN_INLINE Value CsvSource::typed(std::string cell, std::size_t column, std::int64_t line) const {
  const auto& name = (*columns_)[column];
  const auto it = options_.types.find(name);
  if (it == options_.types.end() || it->second == column_type::text) return cell;
  return detail::typed_cell(cell, it->second, path(), line, column, name);
}
}  // namespace data
DTRAIN_NAMESPACE_END
