// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of files.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/checkpointer/files.hpp>
#include <dtrain/nn/lora_layer.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace checkpointer {
namespace detail {

DTRAIN_INLINE std::uint32_t crc32_of(const char* data, std::size_t n, std::uint32_t crc) {
  uLong c = crc == 0 ? ::crc32(0L, Z_NULL, 0) : crc;
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    c = ::crc32(c, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(c);
}

DTRAIN_INLINE std::pair<std::uint32_t, std::uint64_t> crc32_of_file(const std::filesystem::path& p) {
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

DTRAIN_INLINE void fsync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) io_error(dir, "open the directory to fsync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) io_error(dir, "fsync the directory");
}

DTRAIN_INLINE std::uint32_t write_file(const std::filesystem::path& p, const char* data, std::size_t n) {
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

DTRAIN_INLINE std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error(p.string() + ": cannot be read");
  return {std::istreambuf_iterator<char>(in), {}};
}

DTRAIN_INLINE std::string to_hex(const std::uint8_t* p, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  return s;
}

DTRAIN_INLINE std::vector<std::uint8_t> from_hex(const std::string& s) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw Error("checkpoint: bad hex digit in a generator state");
  };
  std::vector<std::uint8_t> out(s.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::uint8_t>(nibble(s[2 * i]) << 4 | nibble(s[2 * i + 1]));
  return out;
}

DTRAIN_INLINE torch::Tensor default_generator_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state().clone();
}

DTRAIN_INLINE void set_default_generator_state(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

DTRAIN_INLINE torch::Tensor device_generator_state(torch::Device device) {
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state().clone();
}

DTRAIN_INLINE void set_device_generator_state(torch::Device device, const torch::Tensor& state) {
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

DTRAIN_INLINE bool saves_trainable_only(const torch::nn::Module& m) { return nn::detail::lora_config_of(m) != nullptr; }

DTRAIN_INLINE std::string adapter_config_of(const torch::nn::Module& m) { return nn::detail::adapter_checkpoint_config(m); }

DTRAIN_INLINE c10::Dict<std::string, at::Tensor> named_state(const torch::nn::Module& m, bool clone) {
  c10::Dict<std::string, at::Tensor> d;
  const bool adapters_only = saves_trainable_only(m);
  for (const auto& p : m.named_parameters(true))
    if (!adapters_only || p.value().requires_grad()) d.insert(p.key(), clone ? p.value().detach().clone() : p.value());
  for (const auto& b : m.named_buffers(true)) d.insert(b.key(), clone ? b.value().detach().clone() : b.value());
  return d;
}
}  // namespace detail
}  // namespace checkpointer
DTRAIN_NAMESPACE_END
