// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of idx.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <algorithm>
#include <fstream>
#include <iterator>

#include <dtrain/data/idx.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {
namespace detail {

DTRAIN_INLINE std::vector<std::uint8_t> read_gzip(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw DataError(path.string() + ": is a directory where the data file should be; remove or rename it and "
                    "put the file there (or pass the directory that holds the dataset's files)");
  if (!std::filesystem::is_regular_file(path, ec))
    throw DataError(path.string() + ": file not found; install Debian's dataset-fashion-mnist "
                    "(apt-get install dataset-fashion-mnist) or pass the directory that holds it");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path.string() + ": cannot open for reading");
  const std::string packed((std::istreambuf_iterator<char>(in)), {});
  // zlib's gz* readers pass a file that is not gzip through as it is, and ignore what follows the
  // last stream: these files must be gzip and nothing else.
  if (packed.size() < 2 || static_cast<unsigned char>(packed[0]) != 0x1f || static_cast<unsigned char>(packed[1]) != 0x8b)
    throw DataError(path.string() + ": not gzip-compressed; expected a gzipped IDX file (*-ubyte.gz)");
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) throw DataError(path.string() + ": cannot start zlib's inflater");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(packed.data()));
  z.avail_in = static_cast<uInt>(packed.size());
  // The trailer's ISIZE (the size mod 2^32) sizes the buffer: one allocation for a whole file.
  const auto trailer = packed.size() >= 18 ? packed.substr(packed.size() - 4) : std::string(4, '\0');
  std::size_t expected = 0;
  for (int i = 3; i >= 0; --i) expected = (expected << 8) | static_cast<unsigned char>(trailer[static_cast<std::size_t>(i)]);
  std::vector<std::uint8_t> out(std::max<std::size_t>(expected + 1, std::size_t{1} << 16));
  std::size_t used = 0;
  for (;;) {
    if (used == out.size()) out.resize(out.size() * 2);
    z.next_out = out.data() + used;
    z.avail_out = static_cast<uInt>(std::min<std::size_t>(out.size() - used, 1u << 30));
    const auto before = z.avail_out;
    const int code = inflate(&z, Z_NO_FLUSH);
    used += before - z.avail_out;
    if (code == Z_STREAM_END) {
      if (z.avail_in == 0) break;
      if (z.avail_in >= 2 && z.next_in[0] == 0x1f && z.next_in[1] == 0x8b) {  // another gzip member
        inflateReset(&z);
        continue;
      }
      const auto extra = z.avail_in;
      inflateEnd(&z);
      throw DataError(path.string() + ": " + std::to_string(extra) + " bytes follow the end of its gzip stream; the "
                      "file is damaged or not one gzip file (download it again)");
    }
    if (code == Z_BUF_ERROR && z.avail_in == 0) {
      inflateEnd(&z);
      throw DataError(path.string() + ": truncated or corrupt gzip stream (it ends before its data does; download it again)");
    }
    if (code != Z_OK && code != Z_BUF_ERROR) {
      const std::string why = z.msg ? z.msg : "error " + std::to_string(code);
      inflateEnd(&z);
      throw DataError(path.string() + ": corrupt gzip stream (" + why + ")");
    }
  }
  inflateEnd(&z);
  out.resize(used);
  return out;
}

DTRAIN_INLINE std::vector<std::int64_t> parse_idx_ubyte(const std::uint8_t* raw, std::size_t size,
                                                        const std::filesystem::path& path, int expected_dims,
                                                        std::size_t& header) {
  if (size < 4)
    throw DataError(path.string() + ": too short for an IDX header (" + std::to_string(size) + " bytes)");
  // Magic: two zero bytes, a type code (0x08 = unsigned byte), the number of dimensions.
  if (raw[0] != 0 || raw[1] != 0 || raw[2] != 0x08 || raw[3] != expected_dims) {
    char magic[16];
    std::snprintf(magic, sizeof magic, "0x%02x%02x%02x%02x", raw[0], raw[1], raw[2], raw[3]);
    throw DataError(path.string() + ": bad magic number " + magic + ", expected 0x000008" +
                    (expected_dims < 16 ? "0" : "") + std::to_string(expected_dims) +
                    " (an IDX file of unsigned bytes with " + std::to_string(expected_dims) +
                    " dimensions); is this the right file?");
  }
  header = 4 + 4 * static_cast<std::size_t>(expected_dims);
  if (size < header)
    throw DataError(path.string() + ": truncated IDX header");
  std::vector<std::int64_t> dims;
  std::size_t payload = 1;
  for (int d = 0; d < expected_dims; ++d) {
    const std::uint8_t* p = raw + 4 + 4 * d;
    const std::int64_t n = (std::int64_t{p[0]} << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
    dims.push_back(n);
    if (n > 0 && payload > std::numeric_limits<std::size_t>::max() / static_cast<std::size_t>(n))
      throw DataError(path.string() + ": the header's dimensions overflow; the file is corrupt");
    payload *= static_cast<std::size_t>(n);
  }
  if (size - header < payload)
    throw DataError(path.string() + ": truncated payload: the header promises " +
                    std::to_string(payload) + " bytes, the file holds " +
                    std::to_string(size - header));
  if (size - header > payload)
    throw DataError(path.string() + ": " + std::to_string(size - header - payload) +
                    " trailing bytes after the " + std::to_string(payload) + " the header promises");
  return dims;
}

DTRAIN_INLINE torch::Tensor read_idx_ubyte(const std::filesystem::path& path, int expected_dims) {
  const std::vector<std::uint8_t> raw = read_gzip(path);
  std::size_t header = 0;
  const auto dims = parse_idx_ubyte(raw.data(), raw.size(), path, expected_dims, header);
  auto t = torch::empty(dims, torch::kUInt8);
  std::memcpy(t.data_ptr<std::uint8_t>(), raw.data() + header, raw.size() - header);
  return t;
}
}  // namespace detail
}  // namespace data
DTRAIN_NAMESPACE_END
