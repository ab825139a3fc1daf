// SPDX-License-Identifier: Apache-2.0
#pragma once
// backend::nccl's pieces: dtype and reduction mapping, the error state a communicator shares with
// its collectives and watchdog, and Work's view of a collective in flight. CUDA builds only.

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include <torch/types.h>

#include <dtrain/collective.hpp>
#include <dtrain/detail/cuda.hpp>
#include <dtrain/error.hpp>

#if DTRAIN_WITH_CUDA
#include <nccl.h>

#include <c10/cuda/CUDAStream.h>

DTRAIN_NAMESPACE_BEGIN

namespace backend {

namespace nccl_detail {

inline ncclDataType_t to_nccl(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return ncclFloat32;
    case torch::kHalf: return ncclFloat16;
    case torch::kBFloat16: return ncclBfloat16;
    case torch::kDouble: return ncclFloat64;
    case torch::kInt: return ncclInt32;
    case torch::kLong: return ncclInt64;
    case torch::kChar: return ncclInt8;
    case torch::kByte:
    case torch::kBool: return ncclUint8;
    default:
      throw ConfigError(std::string("backend::nccl cannot communicate tensors of dtype ") + c10::toString(t) +
                        "; convert them to float, half, bfloat16, double or an integer type first");
  }
}

inline ncclRedOp_t to_nccl(reduce op) {
  switch (op) {
    case reduce::mean: return ncclAvg;
    case reduce::max: return ncclMax;
    case reduce::min: return ncclMin;
    default: return ncclSum;
  }
}

// The error state one communicator shares with its pending collectives and its watchdog.
struct shared_state {
  std::mutex mutex;
  std::string error;  // non-empty once the communicator failed; every later call throws it
  void fail(const std::string& e) {
    std::lock_guard<std::mutex> lock(mutex);
    if (error.empty()) error = e;
  }
  void rethrow() {
    std::lock_guard<std::mutex> lock(mutex);
    if (!error.empty()) throw WorkerError(error);
  }
};

// One collective in flight: the event recorded after it on the communication stream.
struct pending {
  std::string what;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  detail::cuda_event done;
};

// Work's view of a pending collective. wait() orders the caller's current stream after the
// collective (the host goes on: as c10d's ProcessGroupNCCL, completion is stream-ordered), and
// rethrows a failure the watchdog saw.
class completion final : public Completion {
 public:
  completion(std::shared_ptr<pending> p, std::shared_ptr<shared_state> s, torch::Device device)
      : pending_(std::move(p)), state_(std::move(s)), device_(device) {}
  void wait() override {
    state_->rethrow();
    pending_->done.block(c10::cuda::getCurrentCUDAStream(device_.index()));
  }
  bool completed() const override { return pending_->done.query(); }

 private:
  std::shared_ptr<pending> pending_;
  std::shared_ptr<shared_state> state_;
  torch::Device device_;
};

}  // namespace nccl_detail

}  // namespace backend

DTRAIN_NAMESPACE_END

#endif  // DTRAIN_WITH_CUDA
