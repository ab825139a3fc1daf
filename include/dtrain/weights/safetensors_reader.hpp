// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reading a safetensors file: mapped, validated, tensors over the mapping. The format, the checks
// and the ownership rules are in <dtrain/weights/safetensors.hpp>, which includes this header.

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/types.h>
#include <torch/version.h>

#include <dtrain/detail/torch_compat.hpp>
#include <dtrain/error.hpp>
#include <dtrain/weights/detail/mapped_file.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace weights {

/// Upstream's limit on the JSON header: a longer one is a corrupt or hostile file.
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

namespace detail {

struct SafetensorsDtype {
  std::string_view name;
  unsigned bits;                          // per element
  std::optional<torch::ScalarType> type;  // nothing: this LibTorch has no such type
  const char* since = nullptr;            // the first LibTorch with the type, when it came after 1.13
};

// Every safetensors dtype, in the format's order of its own names.
const std::vector<SafetensorsDtype>& dtypes();

inline const SafetensorsDtype* find_dtype(std::string_view name) {
  for (const auto& d : dtypes())
    if (d.name == name) return &d;
  return nullptr;
}

/// The safetensors name of a LibTorch scalar type, when safetensors has one.
std::optional<std::string_view> dtype_name(torch::ScalarType type);

inline void require_little_endian(const std::filesystem::path& path) {
  if constexpr (std::endian::native != std::endian::little)
    throw Error(path.string() + ": safetensors data is little-endian and this machine is not; dtrain does not swap bytes");
}

}  // namespace detail

/// One tensor as the header describes it.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;                  // the file's dtype string: "F32", "BF16", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;   // bytes [begin, end) of the data region
};

/// A safetensors file, mapped and validated (see the header's comment).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path)
      : map_(std::make_shared<detail::MappedFile>(path)) {
    detail::require_little_endian(path);
    parse();
  }

  const std::filesystem::path& path() const { return map_->path(); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Every tensor of the header, in the order of its data.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;

  /// The tensor `name`, over the mapping (no copy; see the header's comment).
  torch::Tensor tensor(const std::string& name) const;

  /// Every tensor, by name, in the order of its data.
  std::vector<std::pair<std::string, torch::Tensor>> state() const;

 private:
  std::string where() const { return path().string() + ": "; }

  void parse();

  SafetensorsTensor read_entry(const std::string& name, const nlohmann::json& entry) const;

  std::shared_ptr<detail::MappedFile> map_;
  std::uint64_t data_begin_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

/// Every tensor of the safetensors file at `path`, in the order of its data (no copy).
inline std::vector<std::pair<std::string, torch::Tensor>> read_safetensors(const std::filesystem::path& path) {
  return SafetensorsFile(path).state();
}

}  // namespace weights

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/weights/impl/safetensors_reader.ipp>
#endif
