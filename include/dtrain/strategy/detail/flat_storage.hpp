// SPDX-License-Identifier: Apache-2.0
#pragma once
// strategy::fsdp<>'s memory for full parameters and flat gradients: mapped from the kernel on
// CPU, and freed while the tensors (and autograd's views of them) live on.

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include <sys/mman.h>

#include <c10/core/StorageImpl.h>
#include <torch/types.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace strategy::detail {

// The full parameters and flat gradients come and go every step. On CPU each is a mapping of its
// own, straight from the kernel: through malloc, glibc's heap served buffers of these sizes among
// torch's other allocations and grew (the multirank fsdp_memory scenario's 9.5M-parameter MLP on
// 2 workers peaked at 318 MB RSS that way, against ddp<>'s 288 MB; mapped, below ddp<>).
struct mapping {
  void* at;
  std::size_t bytes;
};
void unmap(void* ctx);
at::DataPtr map_bytes(std::size_t bytes, c10::Device device);

// A freed buffer's mapping, kept resident for the next buffer of the same size (the unit's next
// gather, or its next flat gradient), as PyTorch's caching allocator keeps a freed block: the
// tensors are gone, their pages stay. The whole model is gathered at once at the start of
// backward, so the pages kept between steps are never more than that moment holds anyway. On the
// 2-core development VM a page faulted in afresh cost ~14 us: mapped afresh every step, the mlp
// example's 2.4 MB of such buffers a step cost ~8 ms. Handing the pages to the kernel with
// MADV_FREE instead was measured too: writing them again still cost half a fresh fault there.
struct spare_pages {
  at::DataPtr ptr;  // one of our mappings (its size in its context), or empty
  bool holds(std::size_t n) const;
};

// Frees a tensor's memory but keeps its storage object, so that every view of it (also the views
// autograd saved for backward) sees the data again once allocate_storage() refills it. A mapping
// of ours goes to `spare`; any other memory (the first full parameters, from torch) is freed.
void free_storage(const torch::Tensor& t, spare_pages& spare);
// The mapping in `spare` when it has `bytes`, else a new one (the memory's contents are undefined).
at::DataPtr take_bytes(std::size_t bytes, c10::Device device, spare_pages& spare);
void allocate_storage(const torch::Tensor& t, std::size_t nbytes, spare_pages& spare);
// A flat tensor of n zeros.
torch::Tensor flat_zeros(std::int64_t n, const torch::TensorOptions& options, spare_pages& spare);
}  // namespace strategy::detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/strategy/detail/impl/flat_storage.ipp>
#endif
