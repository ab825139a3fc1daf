// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of state_files.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <algorithm>
#include <fstream>

#include <dtrain/checkpointer/state_files.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace checkpointer {
namespace detail {

DTRAIN_INLINE Fields::Fields(std::string file, const nlohmann::json& j, std::string prefix)
    : file_(std::move(file)), j_(j), prefix_(std::move(prefix)) {
  if (!j_.is_object()) fail("", (prefix_.empty() ? "holds " : "is ") + j_.dump().substr(0, 80) + ", not a JSON object");
}

DTRAIN_INLINE nlohmann::json Fields::parse(const std::filesystem::path& dir, const std::string& file) {
  std::string text;
  try {
    text = read_text(dir / file);
  } catch (const Error&) {
    throw DamagedFile(file + " cannot be read");
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw DamagedFile(file + " is not JSON (" + e.what() + ")");
  }
}

DTRAIN_INLINE void Fields::fail(const std::string& key, const std::string& what) const {
auto name = prefix_ + key;
if (!name.empty() && name.back() == '.') name.pop_back();
throw DamagedFile(file_ + ": " + (name.empty() ? std::string() : name + " ") + what);
}

DTRAIN_INLINE std::int64_t Fields::integer(const std::string& key, std::int64_t lo, std::int64_t hi) const {
  const auto& v = at(key);
  if (!v.is_number_integer()) fail(key, "is " + v.dump() + ", not an integer");
  const bool too_big = v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi);
  if (too_big || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
    fail(key, v.dump() + " is out of range (" + std::to_string(lo) + " to " + std::to_string(hi) + ")");
  return v.get<std::int64_t>();
}

DTRAIN_INLINE std::string Fields::text(const std::string& key) const {
  const auto& v = at(key);
  if (!v.is_string()) fail(key, "is " + v.dump() + ", not text");
  return v.get<std::string>();
}

DTRAIN_INLINE std::string Fields::hex(const std::string& key, std::int64_t bytes) const {
  const auto s = text(key);
  if (s.size() % 2 != 0 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail(key, "is not a generator state in hex (" + std::to_string(s.size()) + " characters, an odd count or not 0-9a-f)");
  if (bytes >= 0 && static_cast<std::int64_t>(s.size()) != 2 * bytes)
    fail(key, "holds " + std::to_string(s.size() / 2) + " bytes; this LibTorch's generator state has " +
                  std::to_string(bytes));
  return s;
}

DTRAIN_INLINE Metrics Fields::metrics(const std::string& key) const {
  const auto& v = at(key);
  if (!v.is_object()) fail(key, "is " + v.dump() + ", not an object of metrics");
  const Fields inner(file_, v, prefix_ + key + ".");
  Metrics out;
  for (const auto& [name, value] : v.items()) {
    const bool integer_too_big = value.is_number_unsigned() &&
                                 value.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX);
    if (!(value.is_number() || value.is_string() || value.is_null()) || integer_too_big)
      inner.fail(name, "is " + value.dump() + ", not a number or text");
    out.emplace(name, value.get<Metric>());
  }
  return out;
}

DTRAIN_INLINE Manifest Manifest::read(const std::filesystem::path& dir) {
  const std::string file = files::manifest;
  const auto doc = Fields::parse(dir, file);
  const Fields f(file, doc);
  Manifest m;
  if (const auto format = f.integer("format", 0, max_count); format != manifest_format)
    f.fail("format", std::to_string(format) + " is not a format this version reads (" +
                         std::to_string(manifest_format) + "); was it written by another version of dtrain?");
  m.iteration = f.integer("iteration", 1, max_count);
  m.world_size = static_cast<int>(f.integer("world_size", 1, max_world_size));
  const auto& list = f.at("files");
  if (!list.is_array()) f.fail("files", "is " + list.dump() + ", not a list of files");
  std::set<std::string> names;
  int rank_files = 0;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const Fields e(file, list[i], "files[" + std::to_string(i) + "].");
    ManifestEntry entry;
    entry.name = e.text("name");
    const std::filesystem::path p(entry.name);
    bool plain = !entry.name.empty() && p.is_relative() && p == p.lexically_normal();
    for (const auto& part : p) plain = plain && part != ".." && part != ".";
    if (!plain) e.fail("name", "\"" + entry.name + "\" is not a file name inside the checkpoint");
    if (!names.insert(entry.name).second) e.fail("name", "\"" + entry.name + "\" is listed twice");
    entry.size = static_cast<std::uint64_t>(e.integer("size", 0, INT64_MAX));
    entry.crc32 = static_cast<std::uint32_t>(e.integer("crc32", 0, 0xffffffffLL));
    if (entry.name.rfind("rank_", 0) == 0) ++rank_files;
    m.files.push_back(std::move(entry));
  }
  for (const std::string need : {files::model, files::optimizer, files::state})
    if (!names.count(need)) f.fail("files", "lists no " + need);
  for (int r = 0; r < m.world_size; ++r)
    if (!names.count(files::rank(r)))
      f.fail("files", "lists no " + files::rank(r) + ", which world_size " + std::to_string(m.world_size) + " needs");
  if (rank_files != m.world_size)
    f.fail("world_size", std::to_string(m.world_size) + " does not match the " + std::to_string(rank_files) +
                             " rank files listed");
  return m;
}

DTRAIN_INLINE Manifest read_manifest(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) throw DamagedFile("not a directory");
  if (!std::filesystem::exists(dir / files::manifest, ec))
    throw DamagedFile("no manifest.json (an incomplete write?)");
  return Manifest::read(dir);
}

DTRAIN_INLINE void verify_files(const std::filesystem::path& dir, const Manifest& manifest) {
  for (const auto& f : manifest.files) {
    const auto p = dir / f.name;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(p, ec)) throw DamagedFile(f.name + " is missing");
    const auto size = std::filesystem::file_size(p, ec);
    if (ec || size != f.size)
      throw DamagedFile(f.name + " has " + std::to_string(size) + " bytes, the manifest says " +
                                std::to_string(f.size) + " (truncated?)");
    if (crc32_of_file(p).first != f.crc32) throw DamagedFile(f.name + " fails its CRC-32 check (corrupted)");
    if (p.extension() == ".pt") verify_zip_records(p, f.name);
  }
}

DTRAIN_INLINE void verify_zip_records(const std::filesystem::path& p, const std::string& name) {
  std::ifstream in(p, std::ios::binary);
  const auto bad = [&](const std::string& why) { return DamagedFile(name + " is not a whole zip archive: " + why); };
  if (!in) throw bad("it cannot be read");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::uint64_t>(in.tellg());
  const auto read_at = [&](std::uint64_t at, std::size_t n) {
    if (at > size || n > size - at) throw bad("a record points past its end");
    std::string b(n, '\0');
    in.seekg(static_cast<std::streamoff>(at));
    in.read(b.data(), static_cast<std::streamsize>(n));
    if (!in) throw bad("it cannot be read at byte " + std::to_string(at));
    return b;
  };
  const auto u = [](const std::string& b, std::size_t at, int bytes) {
    std::uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<std::size_t>(i)]);
    return v;
  };
  // The end of central directory record: within the last 64 KiB (its comment) + 22 bytes.
  const std::size_t tail_n = static_cast<std::size_t>(std::min<std::uint64_t>(size, 65536 + 22));
  const auto tail = read_at(size - tail_n, tail_n);
  const auto eocd = tail.rfind(std::string("PK\x05\x06", 4));
  if (eocd == std::string::npos || eocd + 22 > tail.size()) throw bad("no end of central directory");
  std::uint64_t entries = u(tail, eocd + 10, 2), cd_size = u(tail, eocd + 12, 4), cd_offset = u(tail, eocd + 16, 4);
  if (entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {  // zip64
    if (eocd < 20 || tail.compare(eocd - 20, 4, std::string("PK\x06\x07", 4)) != 0) throw bad("no zip64 locator");
    const auto record = read_at(u(tail, eocd - 20 + 8, 8), 56);
    if (record.compare(0, 4, std::string("PK\x06\x06", 4)) != 0) throw bad("no zip64 end of central directory");
    entries = u(record, 32, 8), cd_size = u(record, 40, 8), cd_offset = u(record, 48, 8);
  }
  const auto cd = read_at(cd_offset, static_cast<std::size_t>(cd_size));
  std::size_t at = 0;
  std::vector<char> buf(1 << 20);
  for (std::uint64_t e = 0; e < entries; ++e) {
    if (at + 46 > cd.size() || cd.compare(at, 4, std::string("PK\x01\x02", 4)) != 0)
      throw bad("central directory entry " + std::to_string(e) + " is malformed");
    const auto method = u(cd, at + 10, 2), crc = u(cd, at + 16, 4);
    std::uint64_t csize = u(cd, at + 20, 4), usize = u(cd, at + 24, 4), local = u(cd, at + 42, 4);
    const auto nlen = u(cd, at + 28, 2), elen = u(cd, at + 30, 2), clen = u(cd, at + 32, 2);
    const std::string record_name = cd.substr(at + 46, static_cast<std::size_t>(nlen));
    // Zip64 sizes and offset, in that order, for the fields that overflowed.
    for (std::size_t x = at + 46 + nlen; x + 4 <= at + 46 + nlen + elen && x + 4 <= cd.size();) {
      const auto id = u(cd, x, 2), len = u(cd, x + 2, 2);
      if (id == 1) {
        std::size_t y = x + 4;
        if (usize == 0xFFFFFFFF) usize = u(cd, y, 8), y += 8;
        if (csize == 0xFFFFFFFF) csize = u(cd, y, 8), y += 8;
        if (local == 0xFFFFFFFF) local = u(cd, y, 8);
      }
      x += 4 + len;
    }
    at += 46 + nlen + elen + clen;
    if (method != 0) continue;  // compressed: its inflater checks it (torch writes records stored)
    const auto header = read_at(local, 30);
    if (header.compare(0, 4, std::string("PK\x03\x04", 4)) != 0) throw bad("the record " + record_name + " has no header");
    std::uint64_t data = local + 30 + u(header, 26, 2) + u(header, 28, 2), left = csize;
    if (data > size || left > size - data) throw bad("the record " + record_name + " runs past the end");
    in.seekg(static_cast<std::streamoff>(data));
    std::uint32_t c = 0;
    while (left > 0) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(left, buf.size()));
      in.read(buf.data(), static_cast<std::streamsize>(n));
      if (!in) throw bad("the record " + record_name + " cannot be read");
      c = crc32_of(buf.data(), n, c);
      left -= n;
    }
    if (c != crc)
      throw DamagedFile(name + ": its record " + record_name + " fails its own CRC-32 check (the file was changed "
                        "after it was written, its manifest entry with it)");
  }
}

DTRAIN_INLINE StateFile StateFile::read(const std::filesystem::path& dir) {
  const std::string file = files::state;
  const auto doc = Fields::parse(dir, file);
  const Fields f(file, doc);
  StateFile s;
  s.iteration = f.integer("iteration", 1, max_count);
  s.epoch = f.integer("epoch", 0, max_count);
  s.position = f.integer("position", 0, max_count);
  s.steps = f.integer("steps", 0, max_count);
  s.world_size = static_cast<int>(f.integer("world_size", 1, max_world_size));
  s.metrics = f.metrics("metrics");
  s.extras = f.metrics("extras");
  return s;
}

DTRAIN_INLINE RankFile RankFile::read(const std::filesystem::path& dir, int rank) {
  const std::string file = files::rank(rank);
  const auto doc = Fields::parse(dir, file);
  const Fields f(file, doc);
  RankFile r;
  r.rank = static_cast<int>(f.integer("rank", 0, max_world_size - 1));
  if (r.rank != rank) f.fail("rank", std::to_string(r.rank) + " is not the file's rank " + std::to_string(rank));
  r.epoch = f.integer("epoch", 0, max_count);
  r.position = f.integer("position", 0, max_count);
  r.offset = f.has("offset") ? f.integer("offset", -1, max_count) : -1;  // absent in older checkpoints
  r.samples = f.has("samples") ? f.integer("samples", -1, max_count) : -1;  // so is this
  r.rng = f.hex("rng", cpu_generator_state_bytes());
  if (f.has("cuda_rng")) r.cuda_rng = f.hex("cuda_rng", -1);
  return r;
}

DTRAIN_INLINE void check_agreement(const std::filesystem::path& dir, const Manifest& m, const StateFile& s,
                                   const std::vector<RankFile>& ranks) {
  const std::string state = files::state, manifest = files::manifest;
  auto fail = [](const std::string& file, const std::string& what) { throw DamagedFile(file + ": " + what); };
  if (const auto named = RunDirectory::iteration_of(dir.filename().string())) {
    if (m.iteration != *named)
      fail(manifest, "iteration " + std::to_string(m.iteration) + " does not match the directory name " +
                         dir.filename().string());
    if (s.iteration != *named)
      fail(state, "iteration " + std::to_string(s.iteration) + " does not match the directory name " +
                      dir.filename().string());
  }
  if (s.iteration != m.iteration)
    fail(state, "iteration " + std::to_string(s.iteration) + " does not match manifest.json's " + std::to_string(m.iteration));
  if (s.world_size != m.world_size)
    fail(state, "world_size " + std::to_string(s.world_size) + " does not match the " + std::to_string(m.world_size) +
                    " ranks of manifest.json");
  if (ranks.empty()) return;
  const auto& first = ranks.front();
  auto differ = [](const char* field, std::int64_t mine, std::int64_t theirs, const std::string& whose) {
    return std::string(field) + " " + std::to_string(mine) + " does not match " + whose + " " + std::to_string(theirs);
  };
  for (const auto& r : ranks) {
    const auto file = files::rank(r.rank), zero = files::rank(0) + "'s";
    if (r.epoch != first.epoch) fail(file, differ("epoch", r.epoch, first.epoch, zero));
    if (r.position != first.position) fail(file, differ("position", r.position, first.position, zero));
    if (r.offset != first.offset) fail(file, differ("offset", r.offset, first.offset, zero));
    if (r.samples != first.samples) fail(file, differ("samples", r.samples, first.samples, zero));
  }
  if (s.epoch != first.epoch) fail(state, differ("epoch", s.epoch, first.epoch, "the rank files'"));
  if (s.position != first.position) fail(state, differ("position", s.position, first.position, "the rank files'"));
}
}  // namespace detail
}  // namespace checkpointer
DTRAIN_NAMESPACE_END
