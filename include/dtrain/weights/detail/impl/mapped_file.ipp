// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of mapped_file.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/weights/detail/mapped_file.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace weights {
namespace detail {

DTRAIN_INLINE MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path.string() + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string why = S_ISDIR(st.st_mode) ? "a directory" : std::strerror(errno);
    ::close(fd);
    throw Error(path.string() + ": not a regular file (" + why + ")");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw Error(path.string() + ": cannot map " + std::to_string(size_) + " bytes (" + std::strerror(err) + ")");
    }
    data_ = static_cast<std::byte*>(p);
  }
  ::close(fd);  // the mapping keeps the file open
}
}  // namespace detail
}  // namespace weights
DTRAIN_NAMESPACE_END
