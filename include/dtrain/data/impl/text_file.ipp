// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of text_file.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/text_file.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {
namespace detail {

DTRAIN_INLINE ReadOnlyFile::ReadOnlyFile(const std::filesystem::path& path) : path_(path.string()) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0)
    throw DataError(path_ + ": cannot be opened (" + std::strerror(errno) + "); pass an existing, readable file");
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw DataError(path_ + ": is not a regular file; pass a file, or a glob such as dir/*.csv");
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
}

DTRAIN_INLINE std::string ReadOnlyFile::read(std::uint64_t offset, std::uint64_t length) const {
  std::string out(length, '\0');
  std::uint64_t done = 0;
  while (done < length) {
    const auto n = ::pread(fd_, out.data() + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw DataError(path_ + ": read failed (" + std::strerror(errno) + ")");
    if (n == 0) break;
    done += static_cast<std::uint64_t>(n);
  }
  out.resize(done);
  return out;
}
}  // namespace detail
}  // namespace data
DTRAIN_NAMESPACE_END
