// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of torch_compat.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/detail/torch_compat.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace compat {

DTRAIN_INLINE bool autocast_enabled(at::DeviceType type) {
#if DTRAIN_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(type);
#else
  return type == at::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

DTRAIN_INLINE at::ScalarType autocast_dtype(at::DeviceType type) {
#if DTRAIN_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(type);
#else
  return type == at::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
}

DTRAIN_INLINE void set_autocast(at::DeviceType type, bool enabled, at::ScalarType dtype) {
#if DTRAIN_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(type, enabled);
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == at::kCUDA) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

DTRAIN_INLINE AddedScalarType added_scalar_type(std::string_view safetensors_name) {
  using T = at::ScalarType;
  const auto added = [&](const char* name, const char* since, std::optional<T> type) {
    return safetensors_name == name ? std::optional<AddedScalarType>(AddedScalarType{since, type}) : std::nullopt;
  };
  std::optional<T> f8_e4m3, f8_e5m2, f8_e4m3fnuz, f8_e5m2fnuz, u16, u32, u64, f8_e8m0;
#if DTRAIN_TORCH_AT_LEAST(2, 1)
  f8_e4m3 = T::Float8_e4m3fn;
  f8_e5m2 = T::Float8_e5m2;
#endif
#if DTRAIN_TORCH_AT_LEAST(2, 2)
  f8_e4m3fnuz = T::Float8_e4m3fnuz;
  f8_e5m2fnuz = T::Float8_e5m2fnuz;
#endif
#if DTRAIN_TORCH_AT_LEAST(2, 3)
  u16 = T::UInt16;
  u32 = T::UInt32;
  u64 = T::UInt64;
#endif
#if DTRAIN_TORCH_AT_LEAST(2, 8)
  f8_e8m0 = T::Float8_e8m0fnu;
#endif
  for (const auto& a : {added("F8_E4M3", "2.1", f8_e4m3), added("F8_E5M2", "2.1", f8_e5m2),
                        added("F8_E4M3FNUZ", "2.2", f8_e4m3fnuz), added("F8_E5M2FNUZ", "2.2", f8_e5m2fnuz),
                        added("U16", "2.3", u16), added("U32", "2.3", u32), added("U64", "2.3", u64),
                        added("F8_E8M0", "2.8", f8_e8m0)})
    if (a) return *a;
  return {nullptr, std::nullopt};
}
}  // namespace compat
DTRAIN_NAMESPACE_END
