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
/// An adapted model's LoRA config (PEFT's adapter_config.json) and its base's identity; model.pt
/// then holds the trainable tensors only (nn/lora.hpp).
inline constexpr const char* adapter_config = "adapter_config.json";
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

std::uint32_t crc32_of(const char* data, std::size_t n, std::uint32_t crc = 0);

/// CRC-32 and size of a file on disk.
std::pair<std::uint32_t, std::uint64_t> crc32_of_file(const std::filesystem::path& p);

[[noreturn]] inline void io_error(const std::filesystem::path& p, const std::string& what) {
  throw Error(p.string() + ": cannot " + what + " (" + std::strerror(errno) +
              "); check that the storage path is writable and not full");
}

/// Opens `dir` and fsyncs it, so that the names created or renamed in it are durable.
void fsync_directory(const std::filesystem::path& dir);

/// Writes `bytes` to `p` (created or truncated) and fsyncs it. Returns the CRC-32.
std::uint32_t write_file(const std::filesystem::path& p, const char* data, std::size_t n);
inline std::uint32_t write_file(const std::filesystem::path& p, const std::string& s) {
  return write_file(p, s.data(), s.size());
}

std::string read_text(const std::filesystem::path& p);

std::string to_hex(const std::uint8_t* p, std::size_t n);
std::vector<std::uint8_t> from_hex(const std::string& s);

/// The state of torch's default CPU generator (a uint8 tensor), cloned.
torch::Tensor default_generator_state();
void set_default_generator_state(const torch::Tensor& state);

/// The state of `device`'s default generator (a GPU's CUDA generator), cloned; and setting it.
torch::Tensor device_generator_state(torch::Device device);
void set_device_generator_state(torch::Device device, const torch::Tensor& state);

/// Parameters and buffers by their dotted names (`0.weight`, `2.running_mean`).
c10::Dict<std::string, at::Tensor> named_state(const torch::nn::Module& m, bool clone);
/// Whether a checkpoint of `m` keeps its trainable parameters only (and its buffers): a model with
/// LoRA adapters, whose frozen base comes from the base model's own files.
bool saves_trainable_only(const torch::nn::Module& m);
/// adapter_config.json's text for a model with LoRA adapters, "" for any other.
std::string adapter_config_of(const torch::nn::Module& m);

}  // namespace detail

}  // namespace checkpointer

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/checkpointer/impl/files.ipp>
#endif
