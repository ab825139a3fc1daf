// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of worker_threads.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/launch/worker_threads.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace launch {

DTRAIN_INLINE int blas_threads() {
  using getter = int (*)();
  auto get = reinterpret_cast<getter>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get ? get() : 0;
}

DTRAIN_INLINE void set_blas_threads(int n) {
  using setter = void (*)(int);
  if (auto set = reinterpret_cast<setter>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(n);
}

DTRAIN_INLINE std::string blas_kernel() {
  using getter = char* (*)();
  auto get = reinterpret_cast<getter>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const char* name = get ? get() : nullptr;
  return name ? name : "";
}

DTRAIN_INLINE void warn_if_generic_blas_kernel() {
#if defined(__x86_64__) || defined(__i386__)
  static bool warned = false;
  if (std::exchange(warned, true)) return;
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512cd");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const auto fix = blas_kernel_fix(blas_kernel(), std::getenv("OPENBLAS_CORETYPE") != nullptr, avx512, avx2);
  if (!fix.empty())
    std::fprintf(stderr,
                 "dtrain: warning: OpenBLAS does not recognise this CPU and runs its generic Prescott kernel "
                 "(SSE3), which can run Linear layers at half speed; the CPU has %s: run "
                 "with OPENBLAS_CORETYPE=%s in the environment (OpenBLAS reads it as it loads)\n",
                 avx512 ? "AVX-512" : "AVX2", fix.c_str());
#endif
}
}  // namespace launch
DTRAIN_NAMESPACE_END
