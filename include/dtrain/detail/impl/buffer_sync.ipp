// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of buffer_sync.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/detail/buffer_sync.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace detail {

DTRAIN_INLINE buffer_sync::buffer_sync(torch::nn::Module& module) {
  for (auto& b : module.buffers())
    if (b.is_floating_point()) buffers_.push_back(b);
  if (buffers_.empty()) return;
  std::int64_t n = 0;
  for (auto& b : buffers_) n += b.numel();
  flat_ = torch::empty({n}, buffers_.front().options().dtype(torch::kFloat));
}

DTRAIN_INLINE void buffer_sync::finish() {
  if (!pending_) return;
  pending_ = false;
  torch::NoGradGuard no_grad;
  std::int64_t at = 0;
  for (auto& b : buffers_) {
    b.detach().copy_(flat_.narrow(0, at, b.numel()).view(b.sizes()));
    at += b.numel();
  }
}
}  // namespace detail
DTRAIN_NAMESPACE_END
