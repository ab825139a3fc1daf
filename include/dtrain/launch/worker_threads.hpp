// SPDX-License-Identifier: Apache-2.0
#pragma once
// A worker's threads: LibTorch's intra-op pool and OpenBLAS's, one count for both; and a warning
// when OpenBLAS runs its generic kernel on a CPU that has a fast one.

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include <torch/utils.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

/// OpenBLAS's thread count, when LibTorch uses OpenBLAS (OPENBLAS_NUM_THREADS is read only when
/// the library loads, so a forked worker needs the calls).
int blas_threads();
void set_blas_threads(int n);

/// OpenBLAS's kernel ("Haswell", "SkylakeX", ...), or "" when LibTorch does not use OpenBLAS.
std::string blas_kernel();

/// What to set when OpenBLAS runs its generic SSE3 kernel ("Prescott") on a CPU with AVX2 or
/// AVX-512, or "": a DYNAMIC_ARCH OpenBLAS falls back to it on a CPU it does not recognise
/// (Debian bookworm's 0.3.21 on the development VM's Xeon), which ran the Fashion-MNIST mlp at
/// 26,000 samples/s against 54,000-58,000 with OPENBLAS_CORETYPE=SkylakeX. The kernel is chosen
/// as the library loads, before main(): only the environment of a new process can change it.
inline std::string blas_kernel_fix(const std::string& kernel, bool coretype_set, bool avx512, bool avx2) {
  if (kernel != "Prescott" || coretype_set) return "";
  return avx512 ? "SkylakeX" : avx2 ? "Haswell" : "";
}

/// Prints, once per process, how to give OpenBLAS its fast kernel when it runs the generic one.
void warn_if_generic_blas_kernel();

/// Intra-op threads for this worker, and as many for OpenBLAS, whose own pool would otherwise
/// compete with torch's. OpenBLAS's count is set only when it differs: in a forked process the
/// call starts a new pool whose threads spin for ~0.1 s on the cores the workers need, so the
/// driver forks with the workers' count already set (BlasThreadsForWorkers).
inline void set_worker_threads(int n) {
  torch::set_num_threads(n);
  if (blas_threads() != n) set_blas_threads(n);
}

/// While alive, the driver's OpenBLAS count is the workers' (forked workers inherit it); restored
/// after.
class BlasThreadsForWorkers {
 public:
  explicit BlasThreadsForWorkers(int n) : saved_(blas_threads()) {
    if (saved_ > 0 && saved_ != n) set_blas_threads(n);
  }
  ~BlasThreadsForWorkers() {
    if (saved_ > 0 && blas_threads() != saved_) set_blas_threads(saved_);
  }
  BlasThreadsForWorkers(const BlasThreadsForWorkers&) = delete;
  BlasThreadsForWorkers& operator=(const BlasThreadsForWorkers&) = delete;

 private:
  int saved_;
};

}  // namespace launch

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/launch/impl/worker_threads.ipp>
#endif
