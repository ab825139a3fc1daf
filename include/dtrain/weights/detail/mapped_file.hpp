// SPDX-License-Identifier: Apache-2.0
#pragma once
// A whole file mapped into memory, read-only as far as the file is concerned: MAP_PRIVATE with
// write permission, so a tensor made over the mapping may be written in place (the kernel copies the
// page, the file never changes) instead of faulting. Nothing is read until a page is touched.
//
// The file must not be truncated while it is mapped (a touch past the new end is SIGBUS, as with
// every mmap reader, upstream safetensors' included): replace weight files by rename, never in place.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <string>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace weights::detail {

class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_) ::munmap(data_, size_);
  }

  const std::filesystem::path& path() const { return path_; }
  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::filesystem::path path_;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace weights::detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/weights/detail/impl/mapped_file.ipp>
#endif
