// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of tensorboard.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tracker/tensorboard.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tracker {
namespace tensorboard_detail {

DTRAIN_INLINE std::uint32_t crc32c(const std::string& data) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : data) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

DTRAIN_INLINE std::uint32_t masked_crc(const std::string& data) {
  const std::uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

DTRAIN_INLINE std::string little_endian(std::uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s += static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

DTRAIN_INLINE std::string record(const std::string& data) {
  const std::string length = little_endian(data.size(), 8);
  return length + little_endian(masked_crc(length), 4) + data + little_endian(masked_crc(data), 4);
}

DTRAIN_INLINE std::string varint(std::uint64_t v) {
  std::string s;
  for (; v >= 0x80; v >>= 7) s += static_cast<char>((v & 0x7F) | 0x80);
  return s + static_cast<char>(v);
}

DTRAIN_INLINE std::string double_field(int field, double v) {  // wire type 1
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return key(field, 1) + little_endian(bits, 8);
}

DTRAIN_INLINE std::string float_field(int field, float v) {  // wire type 5
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return key(field, 5) + little_endian(bits, 4);
}

DTRAIN_INLINE std::string text_value(const std::string& tag, const std::string& text) {
  const std::string metadata = bytes_field(1, bytes_field(1, "text"));
  const std::string tensor = int_field(1, 7) + bytes_field(2, "") + bytes_field(8, text);
  return bytes_field(1, tag) + bytes_field(9, metadata) + bytes_field(8, tensor);
}

DTRAIN_INLINE std::string summary_event(double wall_time, std::int64_t step, const std::vector<std::string>& values) {
  std::string summary;
  for (const auto& v : values) summary += bytes_field(1, v);
  return record(event(wall_time, step, bytes_field(5, summary)));
}

DTRAIN_INLINE bool is_series(const std::string& k, const Metric& v) {
  return v.is_number() && k != "timestamp" && k != "step" && k != "iteration" &&
         !(k.size() > 5 && k.compare(k.size() - 5, 5, "_unix") == 0);
}

DTRAIN_INLINE std::string row_event(const Metrics& row) {
  std::vector<std::string> values;
  for (const auto& [k, v] : row)
    if (is_series(k, v)) values.push_back(scalar_value(k, v.number()));
  if (values.empty()) return {};
  const double t = row.count("timestamp") ? row.at("timestamp").number() : 0.0;
  const auto step = row.count("step") ? static_cast<std::int64_t>(row.at("step").number()) : std::int64_t{0};
  return summary_event(t, step, values);
}

DTRAIN_INLINE std::string params_table(const nlohmann::json& params) {
  std::vector<std::pair<std::string, std::string>> flat;
  tracking::flatten(params, "", flat);
  std::string md = "| param | value |\n|---|---|\n";
  auto cell = [](const std::string& s) {
    std::string c;
    for (char ch : s) c += ch == '|' ? std::string("\\|") : ch == '\n' ? std::string(" ") : std::string(1, ch);
    return c;
  };
  for (const auto& [k, v] : flat) md += "| " + cell(k) + " | " + cell(v) + " |\n";
  return md;
}

DTRAIN_INLINE std::string host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !*buf) return "localhost";
  std::string h = buf;
  for (char& c : h)
    if (c == '/') c = '_';
  return h;
}

DTRAIN_INLINE std::pair<std::string, std::string> name_parts(const tracking::RunRecord& run) {
  const auto ms = static_cast<std::int64_t>(std::llround(run.outcome.value("start_time", 0.0) * 1000.0));
  char frac[8];
  std::snprintf(frac, sizeof frac, ".%03d", static_cast<int>(ms % 1000));
  return {"events.out.tfevents." + std::to_string(ms / 1000) + ".", frac};
}

DTRAIN_INLINE fs::path find_file(const fs::path& dir, const std::pair<std::string, std::string>& parts) {
  const auto& [prefix, suffix] = parts;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (name.size() > prefix.size() + suffix.size() && name.rfind(prefix, 0) == 0 &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return it->path();
  }
  return {};
}
}  // namespace tensorboard_detail
}  // namespace tracker
DTRAIN_NAMESPACE_END
