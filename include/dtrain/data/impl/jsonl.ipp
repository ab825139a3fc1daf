// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of jsonl.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/jsonl.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

DTRAIN_INLINE JsonLinesSource::JsonLinesSource(const std::filesystem::path& path) : file_(std::make_shared<detail::ReadOnlyFile>(path)) {
  std::int64_t line = 1;
  bool blank = true;
  std::uint64_t start = 0;
  auto end_line = [&](std::uint64_t at) {
    if (!blank) {
      offsets_.push_back(start);
      ends_.push_back(at);
      lines_.push_back(line);
    }
    blank = true;
  };
  file_->scan([&](std::string_view chunk, std::uint64_t base) {
    for (std::size_t k = 0; k < chunk.size(); ++k) {
      const char c = chunk[k];
      if (c == '\n') {
        end_line(base + k);
        ++line;
      } else if (blank && c != ' ' && c != '\t' && c != '\r') {
        blank = false;
        start = base + k;
      }
    }
  });
  end_line(file_->size());
  --line;
  offsets_.shrink_to_fit();
  ends_.shrink_to_fit();
  lines_.shrink_to_fit();
}

DTRAIN_INLINE Row JsonLinesSource::row(std::int64_t i) const {
  if (i < 0 || i >= size())
    throw DataError(path() + ": record " + std::to_string(i) + " is outside [0, " + std::to_string(size()) + ")");
  const auto k = static_cast<std::size_t>(i);
  const auto text = file_->read(offsets_[k], ends_[k] - offsets_[k]);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw DataError(path() + ": line " + std::to_string(lines_[k]) + ", column " + std::to_string(e.byte) +
                    ": malformed JSON Lines record (" + e.what() + "); each line must be one JSON object");
  }
  if (!j.is_object())
    throw DataError(path() + ": line " + std::to_string(lines_[k]) + ", column 1: the record is a " + j.type_name() +
                    ", not a JSON object; JSON Lines sources hold one object per line");
  auto names = std::make_shared<std::vector<std::string>>();
  std::vector<Value> values;
  for (const auto& [key, v] : j.items()) {
    names->push_back(key);
    if (v.is_string()) values.emplace_back(v.get<std::string>());
    else if (v.is_number_integer()) values.emplace_back(v.get<std::int64_t>());
    else if (v.is_number()) values.emplace_back(v.get<double>());
    else if (v.is_null()) values.emplace_back(std::monostate{});
    else if (v.is_boolean()) values.emplace_back(static_cast<std::int64_t>(v.get<bool>()));
    else values.emplace_back(v.dump());
  }
  return Row(std::move(names), std::move(values), path(), lines_[k]);
}
}  // namespace data
DTRAIN_NAMESPACE_END
