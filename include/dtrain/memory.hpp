// SPDX-License-Identifier: Apache-2.0
#pragma once
// dtrain::retain_freed_memory: keep the memory a training step frees for the next step, instead of
// glibc handing it back to the kernel and faulting it in again, zeroed, a page at a time.
//
// Why: a step allocates and frees the same large tensors every time (a transformer's attention
// weights, [batch x heads, length, length] floats, 8 MiB at batch 32 and length 128; a dense
// embedding gradient). glibc's malloc serves such sizes with mmap, or trims the top of the heap
// when more than M_TRIM_THRESHOLD is free; either way the next step page-faults all of it back.
// Measured on examples/text_classifier's transformer (LibTorch 1.13, one thread): ~15% of the
// time in the kernel's page-fault path, and a step 1.3-1.8x slower than with the memory retained.
// PyTorch's own advice for CPU training is a caching allocator (jemalloc, tcmalloc); this is the
// same effect with the C library's malloc, set from inside the program.

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

/// Above this size glibc maps a block of its own (and unmaps it on free): larger than any tensor
/// a step of the examples allocates, so those come from the heap and are reused.
inline constexpr std::size_t default_mmap_threshold_bytes = std::size_t{256} << 20;
/// Free memory at the top of the heap beyond this is returned to the kernel.
inline constexpr std::size_t default_trim_threshold_bytes = std::size_t{1} << 30;

namespace detail {
inline std::atomic<bool>& freed_memory_chosen() {
  static std::atomic<bool> chosen{false};
  return chosen;
}
}  // namespace detail

/// Sets glibc's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD for this process. fit() calls it with the
/// defaults in every worker; call it yourself early in main() (the workers run main() too) for
/// other values, or for the driver's own work. The process then keeps up to `trim_threshold` of
/// freed memory; its peak use does not grow. Returns false where the C library is not glibc
/// (nothing changed) or glibc refused a value.
bool retain_freed_memory(std::size_t mmap_threshold = default_mmap_threshold_bytes,
                         std::size_t trim_threshold = default_trim_threshold_bytes);

/// What fit() calls in each worker: retain_freed_memory() with the defaults, unless this process
/// called retain_freed_memory() already or GLIBC_TUNABLES sets glibc.malloc.* (the user's choice
/// wins). Without it an evaluation under NoGradGuard, which frees each layer's output at once,
/// page-faulted its activations in again every batch: the Fashion-MNIST example's evaluation of
/// its best checkpoint took 20-57 s on 2 workers of the loaded 2-core machine instead of 2-3 s.
void retain_freed_memory_by_default();

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/impl/memory.ipp>
#endif
