// SPDX-License-Identifier: Apache-2.0
#pragma once
// Whether this build can use CUDA and NCCL, and which LibTorch it compiles against.
//
// DTRAIN_WITH_CUDA is 1 when LibTorch's CUDA headers, the CUDA runtime's and NCCL's are all on the
// include path (CMake defines it from find_package(Torch) when Torch found CUDA; define it to 0 to
// leave the CUDA path out). The CUDA path (backend::nccl, the prefetcher's copy stream, CUDA
// autocast) is compiled only then.

#include <dtrain/detail/torch_compat.hpp>

#if !defined(DTRAIN_WITH_CUDA)
#if __has_include(<c10/cuda/CUDAStream.h>) && __has_include(<cuda_runtime_api.h>) && __has_include(<nccl.h>)
#define DTRAIN_WITH_CUDA 1
#else
#define DTRAIN_WITH_CUDA 0
#endif
#endif

#if DTRAIN_WITH_CUDA
#include <cuda_runtime_api.h>

#include <string>

#include <c10/cuda/CUDAStream.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace detail {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw WorkerError(std::string(what) + " failed: " + cudaGetErrorString(e));
}

/// A CUDA event without timing (the cheapest kind): orders one stream after work on another.
class cuda_event {
 public:
  cuda_event() { check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate"); }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  ~cuda_event() { cudaEventDestroy(event_); }

  /// Marks the point `stream` has reached.
  void record(const c10::cuda::CUDAStream& stream) { check_cuda(cudaEventRecord(event_, stream.stream()), "cudaEventRecord"); }
  /// Work queued on `stream` from now on runs after the recorded point; the host does not wait.
  void block(const c10::cuda::CUDAStream& stream) const {
    check_cuda(cudaStreamWaitEvent(stream.stream(), event_, 0), "cudaStreamWaitEvent");
  }
  /// Whether the recorded point has been reached.
  bool query() const {
    const auto e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    check_cuda(e, "cudaEventQuery");
    return true;
  }

 private:
  cudaEvent_t event_{};
};

}  // namespace detail
DTRAIN_NAMESPACE_END
#endif
