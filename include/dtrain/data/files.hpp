// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::Concatenated: several file-backed sources read as one, by a global record index; and
// data::glob, the files a pattern matches, in name order.

#include <glob.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/data/csv.hpp>
#include <dtrain/data/jsonl.hpp>
#include <dtrain/data/row.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// A source of records by index: `size()` and `row(i)` giving a data::Row.
/// Models: CsvSource, JsonLinesSource, Concatenated<...>.
template <class S>
concept RowSource = requires(const S& s, std::int64_t i) {
  { s.size() } -> std::convertible_to<std::int64_t>;
  { s.row(i) } -> std::convertible_to<Row>;
};

/// The regular files `pattern` matches (shell wildcards: *, ?, [...]), sorted by name; DataError
/// when it matches none.
std::vector<std::filesystem::path> glob(const std::string& pattern);

/// Sources one after another: record i of the whole is record i - (records before it) of the
/// source it falls in.
template <RowSource S>
class Concatenated {
 public:
  explicit Concatenated(std::vector<S> parts) : parts_(std::move(parts)) {
    if (parts_.empty()) throw DataError("Concatenated: no source given; pass at least one file");
    std::int64_t total = 0;
    for (const auto& p : parts_) {
      starts_.push_back(total);
      total += p.size();
    }
    size_ = total;
  }
  std::int64_t size() const { return size_; }
  const std::vector<S>& parts() const { return parts_; }
  Row row(std::int64_t i) const {
    if (i < 0 || i >= size_)
      throw DataError("record " + std::to_string(i) + " is outside [0, " + std::to_string(size_) + ") of " +
                      std::to_string(parts_.size()) + " files");
    const auto k = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), i) - starts_.begin()) - 1;
    return parts_[k].row(i - starts_[k]);
  }

 private:
  std::vector<S> parts_;
  std::vector<std::int64_t> starts_;
  std::int64_t size_ = 0;
};

/// The CSV files at `paths` as one source; every file must have the first one's columns.
Concatenated<CsvSource> csv_files(const std::vector<std::filesystem::path>& paths, const CsvOptions& options = {});
/// The CSV files `pattern` matches, as one source.
inline Concatenated<CsvSource> csv_files(const std::string& pattern, const CsvOptions& options = {}) {
  return csv_files(glob(pattern), options);
}
/// The JSON Lines files at `paths` (or matching `pattern`) as one source.
Concatenated<JsonLinesSource> jsonl_files(const std::vector<std::filesystem::path>& paths);
inline Concatenated<JsonLinesSource> jsonl_files(const std::string& pattern) { return jsonl_files(glob(pattern)); }

static_assert(RowSource<CsvSource> && RowSource<JsonLinesSource> && RowSource<Concatenated<CsvSource>>);

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/files.ipp>
#endif
