// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of safetensors_reader.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/weights/safetensors_reader.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace weights {
namespace detail {

DTRAIN_INLINE const std::vector<SafetensorsDtype>& dtypes() {
  const auto added = [](std::string_view n, unsigned bits) {
    const auto a = compat::added_scalar_type(n);
    return SafetensorsDtype{n, bits, a.type, a.since};
  };
  static const std::vector<SafetensorsDtype> table = {
      {"F64", 64, torch::kDouble}, {"F32", 32, torch::kFloat},  {"F16", 16, torch::kHalf},
      {"BF16", 16, torch::kBFloat16}, {"I64", 64, torch::kLong}, {"I32", 32, torch::kInt},
      {"I16", 16, torch::kShort},  {"I8", 8, torch::kChar},     {"U8", 8, torch::kByte},
      {"BOOL", 8, torch::kBool},   {"C64", 64, torch::kComplexFloat},
      added("U16", 16), added("U32", 32), added("U64", 64), added("F8_E4M3", 8), added("F8_E5M2", 8),
      added("F8_E4M3FNUZ", 8), added("F8_E5M2FNUZ", 8), added("F8_E8M0", 8), {"F6_E2M3", 6, {}},
      {"F6_E3M2", 6, {}}, {"F4", 4, {}}};
  return table;
}

DTRAIN_INLINE std::optional<std::string_view> dtype_name(torch::ScalarType type) {
  for (const auto& d : dtypes())
    if (d.type == type) return d.name;
  return std::nullopt;
}
}  // namespace detail

DTRAIN_INLINE const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

DTRAIN_INLINE torch::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const auto* t = find(name);
  if (!t) throw Error(where() + "has no tensor \"" + name + "\" (it has " + std::to_string(tensors_.size()) + ")");
  const auto& dt = *detail::find_dtype(t->dtype);
  if (!dt.type)
    throw Error(where() + "tensor \"" + name + "\" is " + t->dtype + ", a dtype LibTorch " +
                std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
                " has no type for" + (dt.since ? std::string(" (LibTorch ") + dt.since + " and later have)" : "") +
                "; convert it before saving (in Python: tensor.to(torch.float32) or torch.int64)");
  std::byte* p = map_->data() + data_begin_ + t->begin;
  const std::size_t bytes = t->end - t->begin;
  if (*dt.type == torch::kBool)  // a byte other than 0 or 1 is no bool: refuse it rather than read it
    for (std::size_t i = 0; i < bytes; ++i)
      if (static_cast<unsigned char>(p[i]) > 1)
        throw Error(where() + "tensor \"" + name + "\" is BOOL but holds the byte " +
                    std::to_string(static_cast<unsigned>(p[i])) + " at " + std::to_string(i) +
                    "; the file is corrupt, write it again");
  const auto options = torch::TensorOptions().dtype(*dt.type);
  if (reinterpret_cast<std::uintptr_t>(p) % (dt.bits / 8) != 0) {  // misaligned: copy
    auto out = torch::empty(t->shape, options);
    if (bytes) std::memcpy(out.data_ptr(), p, bytes);
    return out;
  }
  return torch::from_blob(p, t->shape, [keep = map_](void*) {}, options);
}

DTRAIN_INLINE std::vector<std::pair<std::string, torch::Tensor>> SafetensorsFile::state() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  out.reserve(tensors_.size());
  for (const auto& t : tensors_) out.emplace_back(t.name, tensor(t.name));
  return out;
}

DTRAIN_INLINE void SafetensorsFile::parse() {
  const auto size = map_->size();
  if (size < 8)
    throw Error(where() + "is " + std::to_string(size) +
                " bytes, less than a safetensors header's length field; is it truncated or another format?");
  std::uint64_t n = 0;
  std::memcpy(&n, map_->data(), 8);
  if (n > kMaxSafetensorsHeaderBytes)
    throw Error(where() + "the header length field says " + std::to_string(n) +
                " bytes, more than safetensors' 100 MB limit: not a safetensors file, or a corrupt one");
  if (n > size - 8)
    throw Error(where() + "the header length field says " + std::to_string(n) + " bytes but only " +
                std::to_string(size - 8) + " follow it: the file is truncated, copy or download it again");
  data_begin_ = 8 + n;
  const auto* text = reinterpret_cast<const char*>(map_->data()) + 8;
  nlohmann::json header;
  std::set<std::string> seen;
  std::string duplicate;
  try {
    if (n == 0 || text[0] != '{') throw Error("it does not start with '{'");
    header = nlohmann::json::parse(text, text + n, [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& key) {
      if (depth == 1 && event == nlohmann::json::parse_event_t::key && !seen.insert(key.get<std::string>()).second)
        duplicate = key.get<std::string>();
      return true;
    });
  } catch (const std::exception& e) {
    throw Error(where() + "the header is not a JSON object (" + e.what() + "): not a safetensors file, or a corrupt one");
  }
  if (!duplicate.empty())
    throw Error(where() + "tensor \"" + duplicate + "\" appears twice in the header; the file is corrupt, write it again");
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw Error(where() + "\"__metadata__\" is not a JSON object; the file is corrupt");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          throw Error(where() + "\"__metadata__\" entry \"" + k + "\" is not a string, as safetensors requires");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    tensors_.push_back(read_entry(name, entry));
  }
  std::stable_sort(tensors_.begin(), tensors_.end(),
                   [](const auto& a, const auto& b) { return std::pair(a.begin, a.end) < std::pair(b.begin, b.end); });
  const std::uint64_t data_size = size - data_begin_;
  std::uint64_t at = 0;
  const SafetensorsTensor* previous = nullptr;
  for (const auto& t : tensors_) {
    if (t.begin < at)
      throw Error(where() + "tensor \"" + t.name + "\" (bytes " + std::to_string(t.begin) + ".." + std::to_string(t.end) +
                  ") overlaps tensor \"" + previous->name + "\"; the file is corrupt, write it again");
    if (t.begin > at)
      throw Error(where() + "bytes " + std::to_string(at) + ".." + std::to_string(t.begin) +
                  " of the data region, before tensor \"" + t.name + "\", belong to no tensor; the file is corrupt");
    if (t.end > data_size)
      throw Error(where() + "tensor \"" + t.name + "\" ends at byte " + std::to_string(t.end) + " of a " +
                  std::to_string(data_size) + "-byte data region: the file is truncated, copy or download it again");
    at = t.end;
    previous = &t;
  }
  if (at != data_size)
    throw Error(where() + "the data region is " + std::to_string(data_size) + " bytes and its tensors cover " +
                std::to_string(at) + (previous ? " (the last is \"" + previous->name + "\")" : std::string()) +
                "; the file is corrupt, write it again");
  for (std::size_t i = 0; i < tensors_.size(); ++i) by_name_[tensors_[i].name] = i;
}

DTRAIN_INLINE SafetensorsTensor SafetensorsFile::read_entry(const std::string& name, const nlohmann::json& entry) const {
  const auto bad = [&](const std::string& what) {
    return Error(where() + "tensor \"" + name + "\" " + what + "; the file is corrupt, write it again");
  };
  if (!entry.is_object()) throw bad("is not a JSON object");
  const auto dtype = entry.find("dtype");
  const auto shape = entry.find("shape");
  const auto offsets = entry.find("data_offsets");
  if (dtype == entry.end() || !dtype->is_string()) throw bad("has no \"dtype\" string");
  if (shape == entry.end() || !shape->is_array()) throw bad("has no \"shape\" array");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned())
    throw bad("has no \"data_offsets\" pair of byte offsets");
  SafetensorsTensor t{name, dtype->get<std::string>(), {}, (*offsets)[0].get<std::uint64_t>(),
                      (*offsets)[1].get<std::uint64_t>()};
  const auto* dt = detail::find_dtype(t.dtype);
  if (!dt) throw bad("has dtype \"" + t.dtype + "\", which is no safetensors dtype (F32, F16, BF16, I64, ...)");
  if (t.begin > t.end) throw bad("has data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] that run backwards");
  // bits: the tensor's size; span: the product of its non-zero sizes, which LibTorch's strides
  // must hold even when a zero size makes the tensor empty.
  std::uint64_t bits = dt->bits, span = 1;
  for (const auto& d : *shape) {
    if (!d.is_number_unsigned()) throw bad("has a shape " + shape->dump() + " that is not a list of sizes");
    const auto size = d.get<std::uint64_t>();
    if (__builtin_mul_overflow(bits, size, &bits) || __builtin_mul_overflow(span, std::max<std::uint64_t>(size, 1), &span) ||
        span > static_cast<std::uint64_t>(INT64_MAX))
      throw bad("has a shape " + shape->dump() + " too large for any tensor");
    t.shape.push_back(static_cast<std::int64_t>(size));
  }
  if (bits % 8 != 0 || bits / 8 != t.end - t.begin)
    throw bad("has shape " + shape->dump() + " of " + t.dtype + ", " + std::to_string(bits / 8) +
              " bytes, but its data_offsets span " + std::to_string(t.end - t.begin));
  return t;
}
}  // namespace weights
DTRAIN_NAMESPACE_END
