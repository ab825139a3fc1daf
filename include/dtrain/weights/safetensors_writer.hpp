// SPDX-License-Identifier: Apache-2.0
#pragma once
// Writing a safetensors file, atomically. See <dtrain/weights/safetensors.hpp>.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/weights/safetensors_reader.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace weights {

namespace detail {

/// A file descriptor written in full or not at all: the destructor of an unfinished one removes
/// the temporary file.
class TempFile {
 public:
  TempFile(std::filesystem::path dest);
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!done_) ::unlink(tmp_.c_str());
  }
  void write(const void* data, std::size_t n);
  /// fsync, close and rename over the destination.
  void commit();

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(dest_.string() + ": " + what + " (" + std::strerror(errno) + "); is the directory writable, the disk full?");
  }
  std::filesystem::path dest_, tmp_;
  int fd_ = -1;
  bool done_ = false;
};

}  // namespace detail

/// Writes `tensors` (name -> tensor, any device, any layout of strides) and `metadata` to `path`
/// as safetensors: CPU, contiguous, little-endian bytes, in a temporary file renamed into place.
/// Throws Error naming the file and the tensor for an empty, reserved ("__metadata__") or repeated
/// name, an undefined or sparse tensor, or a dtype safetensors cannot hold for LibTorch (only the
/// format's dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL C64).
void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace weights

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/weights/impl/safetensors_writer.ipp>
#endif
