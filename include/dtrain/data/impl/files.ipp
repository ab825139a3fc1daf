// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of files.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/files.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

DTRAIN_INLINE std::vector<std::filesystem::path> glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::filesystem::path> out;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  std::sort(out.begin(), out.end());
  if (out.empty())
    throw DataError("no file matches \"" + pattern + "\"; check the directory and the wildcard (e.g. data/*.csv)");
  return out;
}

DTRAIN_INLINE Concatenated<CsvSource> csv_files(const std::vector<std::filesystem::path>& paths, const CsvOptions& options) {
  std::vector<CsvSource> parts;
  for (const auto& p : paths) {
    parts.emplace_back(p, options);
    if (parts.back().columns() != parts.front().columns())
      throw DataError(p.string() + ": its columns differ from " + parts.front().path() +
                      "'s; files read as one source need the same header");
  }
  return Concatenated<CsvSource>(std::move(parts));
}

DTRAIN_INLINE Concatenated<JsonLinesSource> jsonl_files(const std::vector<std::filesystem::path>& paths) {
  std::vector<JsonLinesSource> parts;
  for (const auto& p : paths) parts.emplace_back(p);
  return Concatenated<JsonLinesSource>(std::move(parts));
}
}  // namespace data
DTRAIN_NAMESPACE_END
