// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of idx_cache.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/idx_cache.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

DTRAIN_INLINE std::filesystem::path default_cache_directory() {
  if (const char* own = std::getenv("DTRAIN_CACHE_DIR")) return own;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::filesystem::path(xdg) / "dtrain";
  if (const char* home = std::getenv("HOME"); home && *home) return std::filesystem::path(home) / ".cache" / "dtrain";
  return {};
}

namespace detail {

DTRAIN_INLINE std::string fnv1a_hex(const std::string& text) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

DTRAIN_INLINE std::string idx_cache_prefix(const std::filesystem::path& source) {
  std::error_code ec;
  return source.stem().string() + "-" + fnv1a_hex(std::filesystem::absolute(source, ec).string()) + "-";
}

DTRAIN_INLINE std::string idx_cache_name(const std::filesystem::path& source) {
  struct stat st {};
  if (::stat(source.c_str(), &st) != 0) return {};
  return idx_cache_prefix(source) +
         fnv1a_hex(std::to_string(st.st_size) + "|" + std::to_string(st.st_mtim.tv_sec) + "." +
                   std::to_string(st.st_mtim.tv_nsec)) +
         ".idx";
}

DTRAIN_INLINE void remove_stale_idx_caches(const std::filesystem::path& cached, const std::string& prefix) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(cached.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name != cached.filename().string() && name.rfind(prefix, 0) == 0 && e.path().extension() == ".idx")
      std::filesystem::remove(e.path(), ec);  // a process mapping it keeps its pages
  }
}

DTRAIN_INLINE std::optional<torch::Tensor> map_idx_file(const std::filesystem::path& cached, int expected_dims) {
  const int fd = ::open(cached.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  void* base = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && st.st_size > 0)
    base = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (base == MAP_FAILED) return std::nullopt;
  const auto size = static_cast<std::size_t>(st.st_size);
  std::size_t header = 0;
  try {
    const auto dims = parse_idx_ubyte(static_cast<const std::uint8_t*>(base), size, cached, expected_dims, header);
    // Read-only memory: the tensor is for reading (index_select, to(float)); a write faults.
    return torch::from_blob(static_cast<std::uint8_t*>(base) + header, dims,
                            [base, size](void*) { ::munmap(base, size); }, torch::kUInt8);
  } catch (const DataError&) {
    ::munmap(base, size);
    return std::nullopt;
  }
}

DTRAIN_INLINE bool write_idx_cache(const std::filesystem::path& cached, const std::vector<std::uint8_t>& bytes,
                                   std::string& why) {
  std::error_code ec;
  std::filesystem::create_directories(cached.parent_path(), ec);
  if (ec) {
    why = "cannot create " + cached.parent_path().string() + " (" + ec.message() + ")";
    return false;
  }
  const auto tmp = cached.string() + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    why = "cannot create " + tmp + " (" + std::strerror(errno) + ")";
    return false;
  }
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !written) {
    std::filesystem::remove(tmp, ec);
    why = "cannot write " + tmp + " (" + std::strerror(written ? errno : err) + ")";
    return false;
  }
  std::filesystem::rename(tmp, cached, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    why = "cannot rename " + tmp + " to " + cached.string();
    return false;
  }
  return true;
}

DTRAIN_INLINE torch::Tensor read_idx_ubyte_cached(const std::filesystem::path& source, int expected_dims,
                                                  const std::filesystem::path& cache_dir) {
  const std::string name = cache_dir.empty() ? std::string() : idx_cache_name(source);
  if (name.empty()) return read_idx_ubyte(source, expected_dims);
  const auto cached = cache_dir / name;
  if (auto mapped = map_idx_file(cached, expected_dims)) return *mapped;
  const std::vector<std::uint8_t> raw = read_gzip(source);
  std::size_t header = 0;
  const auto dims = parse_idx_ubyte(raw.data(), raw.size(), source, expected_dims, header);
  std::string why;
  if (write_idx_cache(cached, raw, why)) {
    remove_stale_idx_caches(cached, idx_cache_prefix(source));
    if (auto mapped = map_idx_file(cached, expected_dims)) return *mapped;
  }
  if (!why.empty())
    std::fprintf(stderr, "dtrain: warning: %s; %s is decompressed again on every run (set DTRAIN_CACHE_DIR to a "
                 "writable directory, or to \"\" to turn the cache off)\n", why.c_str(), source.c_str());
  auto t = torch::empty(dims, torch::kUInt8);
  std::memcpy(t.data_ptr<std::uint8_t>(), raw.data() + header, raw.size() - header);
  return t;
}
}  // namespace detail
}  // namespace data
DTRAIN_NAMESPACE_END
