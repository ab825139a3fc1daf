// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::detail::ReadOnlyFile: a file read by byte range from any thread (pread), scanned once in
// fixed-size chunks: what the file-backed sources build their row index with, so that neither the
// index scan nor a row read holds more of the file in memory than a chunk or a row.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data::detail {

/// Bytes read at a time while indexing a file.
inline constexpr std::size_t kScanChunkBytes = 1 << 20;

class ReadOnlyFile {
 public:
  explicit ReadOnlyFile(const std::filesystem::path& path);
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile() { ::close(fd_); }

  const std::string& path() const { return path_; }
  std::uint64_t size() const { return size_; }

  /// Bytes [offset, offset + length) (fewer at the end of the file); safe from several threads.
  std::string read(std::uint64_t offset, std::uint64_t length) const;

  /// Calls `f(chunk, offset_of_chunk)` for each kScanChunkBytes of the file, in order.
  template <class F>
  void scan(F&& f) const {
    for (std::uint64_t at = 0; at < size_; at += kScanChunkBytes) {
      const auto chunk = read(at, kScanChunkBytes);
      f(std::string_view(chunk), at);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace data::detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/text_file.ipp>
#endif
