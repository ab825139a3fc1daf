// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of flat_storage.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/strategy/detail/flat_storage.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace strategy {
namespace detail {

DTRAIN_INLINE void unmap(void* ctx) {
  auto* m = static_cast<mapping*>(ctx);
  ::munmap(m->at, m->bytes);
  delete m;
}

DTRAIN_INLINE at::DataPtr map_bytes(std::size_t bytes, c10::Device device) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error("strategy::fsdp<>: cannot map " + std::to_string(bytes) + " bytes for full parameters or gradients (" +
                std::strerror(errno) + "); the worker is out of memory");
  return at::DataPtr(p, new mapping{p, bytes}, &unmap, device);
}

DTRAIN_INLINE bool spare_pages::holds(std::size_t n) const {
  const auto* m = static_cast<const mapping*>(ptr.get_context());
  return m && m->bytes == n;
}

DTRAIN_INLINE void free_storage(const torch::Tensor& t, spare_pages& spare) {
  auto* s = t.storage().unsafeGetStorageImpl();
  at::DataPtr old = s->set_data_ptr(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
  if (old.cast_context<mapping>(&unmap)) spare.ptr = std::move(old);
}

DTRAIN_INLINE at::DataPtr take_bytes(std::size_t bytes, c10::Device device, spare_pages& spare) {
  if (!spare.holds(bytes)) return map_bytes(bytes, device);
  return std::exchange(spare.ptr, at::DataPtr(nullptr, device));
}

DTRAIN_INLINE void allocate_storage(const torch::Tensor& t, std::size_t nbytes, spare_pages& spare) {
  auto* s = t.storage().unsafeGetStorageImpl();
  if (t.device().is_cpu() && nbytes > 0) s->set_data_ptr_noswap(take_bytes(nbytes, t.device(), spare));
  else s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

DTRAIN_INLINE torch::Tensor flat_zeros(std::int64_t n, const torch::TensorOptions& options, spare_pages& spare) {
  const auto bytes = static_cast<std::size_t>(n) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  if (!options.device().is_cpu() || bytes == 0) return torch::zeros({n}, options);
  const bool reused = spare.holds(bytes);  // fresh anonymous pages are zeros already
  auto data = take_bytes(bytes, options.device(), spare);
  if (reused) std::memset(data.get(), 0, bytes);
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, std::move(data), nullptr, false);
  return torch::empty({0}, options).set_(storage, 0, {n}, {1});
}
}  // namespace detail
}  // namespace strategy
DTRAIN_NAMESPACE_END
