// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::JsonLinesSource: a JSON Lines file (one JSON object per line) read by record index. Opening
// it scans the file once, in chunks, recording where each non-blank line starts; row(i) reads and
// parses that line alone.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/data/row.hpp>
#include <dtrain/data/text_file.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// JSON Lines read by record index; each object's keys are the row's columns (strings are text,
/// integers whole numbers, other numbers real, null missing; arrays and objects are kept as their
/// JSON text). Thread-safe reads.
class JsonLinesSource {
 public:
  explicit JsonLinesSource(const std::filesystem::path& path);

  std::int64_t size() const { return static_cast<std::int64_t>(offsets_.size()); }
  const std::string& path() const { return file_->path(); }

  /// Record `i`: DataError naming the file, line and column when the line is not a JSON object.
  Row row(std::int64_t i) const;

 private:
  std::shared_ptr<detail::ReadOnlyFile> file_;
  std::vector<std::uint64_t> offsets_, ends_;
  std::vector<std::int64_t> lines_;
};

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/jsonl.ipp>
#endif
