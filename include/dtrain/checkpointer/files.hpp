// SPDX-License-Identifier: Apache-2.0
#pragma once
// The checkpoint format's files and the low-level pieces that write and read them: names, CRC-32s
// (zlib), fsynced writes, the CPU generator's state, a module's named tensors.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer {

namespace files {
inline constexpr const char* model = "model.pt";
inline constexpr const char* optimizer = "optimizer.pt";
inline constexpr const char* state = "state.json";
inline constexpr const char* manifest = "manifest.json";
/// The optimizer's state as Python's optimizer.state_dict() structures it (torch.save format).
inline constexpr const char* python_optimizer = "optimizer_state.pt";
/// The Precision policy's state (amp's GradScaler: loss scale, growth tracker).
inline constexpr const char* precision = "precision.pt";
/// The model's type and construction config, for a model with `Config config;` (model_config.hpp).
inline constexpr const char* model_config = "model_config.json";
/// Directories of the user's files (with_file) and objects (with_object: NAME.pt).
inline constexpr const char* user_files = "files";
inline constexpr const char* user_objects = "objects";
inline std::string rank(int r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d.json", r);
  return buf;
}
/// Rank r's optimizer state when the strategy shards it (strategy::fsdp<>).
inline std::string rank_optimizer(int r) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "optimizer_rank_%05d.pt", r);
  return buf;
}
}  // namespace files

namespace detail {

inline constexpr const char* sharded_optimizer_key = "dtrain_optimizer_sharded_over_ranks";

inline std::uint32_t crc32_of(const char* data, std::size_t n, std::uint32_t crc = 0) {
  uLong c = crc == 0 ? ::crc32(0L, Z_NULL, 0) : crc;
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    c = ::crc32(c, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(c);
}

/// CRC-32 and size of a file on disk.
inline std::pair<std::uint32_t, std::uint64_t> crc32_of_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error(p.string() + ": cannot be read");
  std::vector<char> buf(1 << 20);
  uLong c = ::crc32(0L, Z_NULL, 0);
  std::uint64_t size = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = in.gcount();
    if (got <= 0) break;
    c = ::crc32(c, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(got));
    size += static_cast<std::uint64_t>(got);
  }
  return {static_cast<std::uint32_t>(c), size};
}

[[noreturn]] inline void io_error(const std::filesystem::path& p, const std::string& what) {
  throw Error(p.string() + ": cannot " + what + " (" + std::strerror(errno) +
              "); check that the storage path is writable and not full");
}

/// Opens `dir` and fsyncs it, so that the names created or renamed in it are durable.
inline void fsync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) io_error(dir, "open the directory to fsync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) io_error(dir, "fsync the directory");
}

/// Writes `bytes` to `p` (created or truncated) and fsyncs it. Returns the CRC-32.
inline std::uint32_t write_file(const std::filesystem::path& p, const char* data, std::size_t n) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_error(p, "create the file");
  std::size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, data + done, n - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      io_error(p, "write the file");
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    io_error(p, "fsync the file");
  }
  if (::close(fd) != 0) io_error(p, "close the file");
  return crc32_of(data, n);
}
inline std::uint32_t write_file(const std::filesystem::path& p, const std::string& s) {
  return write_file(p, s.data(), s.size());
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error(p.string() + ": cannot be read");
  return {std::istreambuf_iterator<char>(in), {}};
}

inline std::string to_hex(const std::uint8_t* p, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  return s;
}
inline std::vector<std::uint8_t> from_hex(const std::string& s) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw Error("checkpoint: bad hex digit in a generator state");
  };
  std::vector<std::uint8_t> out(s.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::uint8_t>(nibble(s[2 * i]) << 4 | nibble(s[2 * i + 1]));
  return out;
}

/// The state of torch's default CPU generator (a uint8 tensor), cloned.
inline torch::Tensor default_generator_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state().clone();
}
inline void set_default_generator_state(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

/// The state of `device`'s default generator (a GPU's CUDA generator), cloned; and setting it.
inline torch::Tensor device_generator_state(torch::Device device) {
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state().clone();
}
inline void set_device_generator_state(torch::Device device, const torch::Tensor& state) {
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

/// Parameters and buffers by their dotted names (`0.weight`, `2.running_mean`).
inline c10::Dict<std::string, at::Tensor> named_state(const torch::nn::Module& m, bool clone) {
  c10::Dict<std::string, at::Tensor> d;
  for (const auto& p : m.named_parameters(true)) d.insert(p.key(), clone ? p.value().detach().clone() : p.value());
  for (const auto& b : m.named_buffers(true)) d.insert(b.key(), clone ? b.value().detach().clone() : b.value());
  return d;
}

}  // namespace detail

}  // namespace checkpointer

DTRAIN_NAMESPACE_END
