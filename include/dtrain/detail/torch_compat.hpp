// SPDX-License-Identifier: Apache-2.0
#pragma once
// Every difference between the LibTorch versions dtrain supports (1.13 through 2.x) that dtrain or
// its tests must spell differently, each named for what differs. Nothing else in dtrain or its
// tests tests TORCH_VERSION: a new difference gets a shim here.

#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <dtrain/version.hpp>

/// True when the LibTorch being compiled against is at least major.minor.
#define DTRAIN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

DTRAIN_NAMESPACE_BEGIN
namespace compat {

/// The key type of Optimizer::state(): the TensorImpl's address as text before LibTorch 2.1
/// (`c10::guts::to_string`, since removed), the address itself from then on.
using optimizer_state_key_t =
    typename std::remove_cvref_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

template <class Key = optimizer_state_key_t>
Key optimizer_state_key(const at::Tensor& param) {
  void* impl = param.unsafeGetTensorImpl();
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;  // what c10::guts::to_string wrote
    text << impl;
    return text.str();
  } else {
    return Key(impl);
  }
}

/// Autocast per device type: LibTorch before 2.4 spells it per device (set_cpu_enabled,
/// set_autocast_gpu_dtype); 2.4 and later take the device type as an argument.
inline bool autocast_enabled(at::DeviceType type) {
#if DTRAIN_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(type);
#else
  return type == at::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}
inline at::ScalarType autocast_dtype(at::DeviceType type) {
#if DTRAIN_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(type);
#else
  return type == at::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
}
inline void set_autocast(at::DeviceType type, bool enabled, at::ScalarType dtype) {
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

/// The handle of a parameter's gradient accumulator (autograd's Node) that DDP's hooks hold:
/// a std::shared_ptr up to LibTorch 2.11 at least, a c10::intrusive_ptr in 2.15.
using grad_accumulator_ptr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

/// LibTorch autocasts CPU code to fp16 from 2.4 on; before, to bf16 only.
inline constexpr bool cpu_autocasts_fp16 = DTRAIN_TORCH_AT_LEAST(2, 4);

/// ATen's fused optimizer kernels (_fused_sgd_, _fused_adam_, _fused_adamw_) exist from 2.3 on
/// (_fused_sgd_ came last).
inline constexpr bool fused_optimizers = DTRAIN_TORCH_AT_LEAST(2, 3);

/// The scalar types LibTorch added after 1.13 that safetensors files use, by safetensors' name:
/// F8_E4M3 and F8_E5M2 from 2.1, F8_E4M3FNUZ and F8_E5M2FNUZ from 2.2, U16, U32 and U64 from 2.3,
/// F8_E8M0 from 2.8 (`since`). `type` is empty under an older LibTorch, and for a name not here.
struct AddedScalarType {
  const char* since;
  std::optional<at::ScalarType> type;
};
inline AddedScalarType added_scalar_type(std::string_view safetensors_name) {
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
