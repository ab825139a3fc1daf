// SPDX-License-Identifier: Apache-2.0
#pragma once
// strategy::fsdp<>'s memory for full parameters and flat gradients: mapped from the kernel on
// CPU, and freed while the tensors (and autograd's views of them) live on.

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <sys/mman.h>

#include <c10/core/StorageImpl.h>
#include <torch/types.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace strategy::detail {

// The full parameters and flat gradients come and go every step. On CPU they are mapped straight
// from the kernel, so that freeing them gives the memory back: through malloc, glibc's dynamic
// mmap threshold soon serves buffers of this size from its heap, which keeps them resident (the
// multirank fsdp_memory scenario's 9.5M-parameter MLP on 2 workers peaked at 318 MB RSS through
// malloc against ddp<>'s 288 MB; mapped, below ddp<>).
struct mapping {
  void* at;
  std::size_t bytes;
};
inline void unmap(void* ctx) {
  auto* m = static_cast<mapping*>(ctx);
  ::munmap(m->at, m->bytes);
  delete m;
}
inline at::DataPtr map_bytes(std::size_t bytes, c10::Device device) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error("strategy::fsdp<>: cannot map " + std::to_string(bytes) + " bytes for full parameters or gradients (" +
                std::strerror(errno) + "); the worker is out of memory");
  return at::DataPtr(p, new mapping{p, bytes}, &unmap, device);
}

// Frees a tensor's memory but keeps its storage object, so that every view of it (also the views
// autograd saved for backward) sees the data again once allocate_storage() refills it.
inline void free_storage(const torch::Tensor& t) {
  auto* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}
inline void allocate_storage(const torch::Tensor& t, std::size_t nbytes) {
  auto* s = t.storage().unsafeGetStorageImpl();
  if (t.device().is_cpu() && nbytes > 0) s->set_data_ptr_noswap(map_bytes(nbytes, t.device()));
  else s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}
// A flat tensor of n zeros (fresh anonymous pages are zero: nothing to fill on CPU).
inline torch::Tensor flat_zeros(std::int64_t n, const torch::TensorOptions& options) {
  const auto bytes = static_cast<std::size_t>(n) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  if (!options.device().is_cpu() || bytes == 0) return torch::zeros({n}, options);
  auto data = map_bytes(bytes, options.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, std::move(data), nullptr, false);
  return torch::empty({0}, options).set_(storage, 0, {n}, {1});
}
}  // namespace strategy::detail

DTRAIN_NAMESPACE_END
