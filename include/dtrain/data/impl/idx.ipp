// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of idx.hpp's functions (docs/packaging.md: header-only or compiled once).

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
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw DataError(path.string() + ": cannot open for reading");
  gzbuffer(file, 1 << 20);
  std::vector<std::uint8_t> out;
  // The uncompressed size is not in a gzip header we can trust; grow in large steps.
  std::size_t used = 0;
  out.resize(std::size_t{1} << 23);
  for (;;) {
    if (used == out.size()) out.resize(out.size() * 2);
    const int n = gzread(file, out.data() + used, static_cast<unsigned>(out.size() - used));
    if (n < 0) {
      int code = 0;
      const std::string why = gzerror(file, &code);
      gzclose(file);
      throw DataError(path.string() + ": corrupt gzip stream (" + why + ")");
    }
    if (n == 0) break;
    // zlib passes a file that is not gzip through as it is; these files must be gzip.
    if (used == 0 && gzdirect(file)) {
      gzclose(file);
      throw DataError(path.string() + ": not gzip-compressed; expected a gzipped IDX file (*-ubyte.gz)");
    }
    used += static_cast<std::size_t>(n);
  }
  // gzread reports a stream cut short as a plain end of file; gzerror tells them apart.
  int code = 0;
  const std::string why = gzerror(file, &code);
  gzclose(file);
  if (code != Z_OK && code != Z_STREAM_END)
    throw DataError(path.string() + ": truncated or corrupt gzip stream (" + why + ")");
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
