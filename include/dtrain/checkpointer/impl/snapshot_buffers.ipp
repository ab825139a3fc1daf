// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of snapshot_buffers.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/checkpointer/files.hpp>
#include <dtrain/checkpointer/snapshot_buffers.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace checkpointer {
namespace detail {

DTRAIN_INLINE at::Tensor huge_page_tensor_like(const at::Tensor& source) {
  constexpr std::size_t huge = std::size_t{2} << 20;
  const auto bytes = static_cast<std::size_t>(source.nbytes());
  void* data = nullptr;
  if (bytes < huge || ::posix_memalign(&data, huge, bytes) != 0) return at::empty_like(source);
  const std::size_t length = (bytes + 4095) / 4096 * 4096;
  ::madvise(data, length, MADV_HUGEPAGE);  // advice: without it, 4 KiB pages
#ifdef MADV_POPULATE_WRITE
  ::madvise(data, length, MADV_POPULATE_WRITE);  // Linux 5.14+: every fault in one call, not one per page
#endif
  return at::from_blob(data, source.sizes(), source.strides(), [](void* p) { std::free(p); }, source.options());
}

DTRAIN_INLINE at::Tensor SnapshotBuffers::copy(const std::string& name, const at::Tensor& source) {
  const auto it = kept_.find(name);
  if (it != kept_.end()) {
    at::Tensor buffer = std::move(it->second);
    kept_.erase(it);
    if (reusable(buffer, source)) {
      ++reused_;
      return buffer.copy_(source.detach());
    }
  }
  ++allocated_;
  if (source.device().is_cpu() && source.layout() == at::kStrided && source.is_non_overlapping_and_dense())
    return huge_page_tensor_like(source).copy_(source.detach());
  return source.detach().clone();
}

DTRAIN_INLINE void SnapshotBuffers::keep(const std::string& name, const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.device().is_cpu()) return;
  next_.insert_or_assign(name, at::empty({0}, tensor.options())
                                   .set_(tensor.storage(), tensor.storage_offset(), tensor.sizes(), tensor.strides()));
}

DTRAIN_INLINE c10::Dict<std::string, at::Tensor> SnapshotBuffers::model_state(const torch::nn::Module& module) {
  c10::Dict<std::string, at::Tensor> d;
  auto add = [&](const std::string& name, const at::Tensor& t) {
    auto c = copy("model/" + name, t);
    keep("model/" + name, c);
    d.insert(name, std::move(c));
  };
  const bool adapters_only = saves_trainable_only(module);
  for (const auto& p : module.named_parameters(true))
    if (!adapters_only || p.value().requires_grad()) add(p.key(), p.value());
  for (const auto& b : module.named_buffers(true)) add(b.key(), b.value());
  return d;
}

DTRAIN_INLINE bool SnapshotBuffers::reusable(const at::Tensor& buffer, const at::Tensor& source) {
  return buffer.defined() && buffer.use_count() == 1 && buffer.storage().use_count() == 1 &&
         source.device().is_cpu() && source.layout() == at::kStrided && source.is_non_overlapping_and_dense() &&
         buffer.device() == source.device() && buffer.dtype() == source.dtype() && !buffer.requires_grad() &&
         buffer.sizes() == source.sizes() && buffer.strides() == source.strides() && buffer.storage_offset() == 0 &&
         buffer.storage().nbytes() == source.nbytes();
}
}  // namespace detail
}  // namespace checkpointer
DTRAIN_NAMESPACE_END
