// SPDX-License-Identifier: Apache-2.0
#pragma once
// A worker's threads: LibTorch's intra-op pool and OpenBLAS's, one count for both.

#include <dlfcn.h>

#include <torch/utils.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

/// OpenBLAS's thread count, when LibTorch uses OpenBLAS (OPENBLAS_NUM_THREADS is read only when
/// the library loads, so a forked worker needs the calls).
inline int blas_threads() {
  using getter = int (*)();
  auto get = reinterpret_cast<getter>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get ? get() : 0;
}
inline void set_blas_threads(int n) {
  using setter = void (*)(int);
  if (auto set = reinterpret_cast<setter>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(n);
}

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
