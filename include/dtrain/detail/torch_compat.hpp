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
bool autocast_enabled(at::DeviceType type);
at::ScalarType autocast_dtype(at::DeviceType type);
void set_autocast(at::DeviceType type, bool enabled, at::ScalarType dtype);

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
AddedScalarType added_scalar_type(std::string_view safetensors_name);

}  // namespace compat
DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/detail/impl/torch_compat.ipp>
#endif
