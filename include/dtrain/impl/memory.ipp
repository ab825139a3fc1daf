// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of memory.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/memory.hpp>

DTRAIN_NAMESPACE_BEGIN

DTRAIN_INLINE bool retain_freed_memory(std::size_t mmap_threshold,
                                       std::size_t trim_threshold) {
  detail::freed_memory_chosen() = true;
#if defined(__GLIBC__)
  // Setting either value also turns off glibc's dynamic threshold, which would otherwise lower the
  // trim threshold back to twice the largest block freed so far.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold)) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, static_cast<int>(trim_threshold)) == 1;
  return mmap_ok && trim_ok;
#else
  (void)mmap_threshold;
  (void)trim_threshold;
  return false;
#endif
}

DTRAIN_INLINE void retain_freed_memory_by_default() {
  if (detail::freed_memory_chosen()) return;
  if (const char* tunables = std::getenv("GLIBC_TUNABLES"); tunables && std::strstr(tunables, "glibc.malloc."))
    return;
  retain_freed_memory();
}
DTRAIN_NAMESPACE_END
