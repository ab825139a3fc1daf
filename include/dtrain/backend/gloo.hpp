#pragma once
// backend::gloo: collectives over c10d's ProcessGroupGloo (CPU tensors, TCP).

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#if !defined(USE_C10D_GLOO)
#error "dtrain::backend::gloo needs LibTorch's Gloo process group: link the CMake target dtrain::dtrain (or torch), which defines USE_C10D_GLOO and USE_DISTRIBUTED, or pass -DUSE_C10D_GLOO -DUSE_DISTRIBUTED yourself"
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/policy/category.hpp>

DTRAIN_NAMESPACE_BEGIN

/// A collective's reduction.
enum class reduce { sum, mean, max, min };

/// A pending collective. wait() blocks until it is done and rethrows its failure, naming it.
class Work {
 public:
  Work() = default;  // an already completed no-op (world size 1)
  Work(c10::intrusive_ptr<c10d::Work> work, std::string what)
      : work_(std::move(work)), what_(std::move(what)) {}

  void wait() {
    if (!work_) return;
    try {
      work_->wait();
    } catch (const std::exception& e) {
      throw WorkerError(what_ + " failed: " + e.what() +
                        " (a peer died, hung past RunConfig::collective_timeout, or the ranks "
                        "issued different collectives)");
    }
    work_.reset();
  }
  bool completed() const { return !work_ || work_->isCompleted(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
};

namespace backend {

/// c10d's ProcessGroupGloo: CPU tensors over TCP, one process per rank.
///
/// The transport binds to GLOO_SOCKET_IFNAME when set, to 127.0.0.1 when MASTER_ADDR is a loopback
/// address (every rank on this machine), and otherwise to the address this host's name resolves to.
/// `Threads` is the number of Gloo's own worker threads, which run collectives while the training
/// thread goes on (two: one bucket's allreduce can overlap the next one's).
template <int Threads = 2>
struct gloo_with_threads {
  using category = dtrain::category::backend;
  static constexpr bool uses_cuda = false;
  static constexpr const char* name = "gloo";

  static torch::Device device(int /*local_rank*/) { return torch::kCPU; }

  class communicator {
   public:
    communicator(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                 std::chrono::milliseconds timeout)
        : rank_(rank), size_(size) {
      auto options = c10d::ProcessGroupGloo::Options::create(timeout);
      options->devices.push_back(make_device());
      options->threads = Threads;
      group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
    }

    int rank() const { return rank_; }
    int size() const { return size_; }

    /// Reduces `t` in place across ranks. mean divides the sum by size() once it is done, so
    /// callers that wait() see the mean; gloo itself has no mean.
    Work allreduce(torch::Tensor& t, reduce op = reduce::sum) {
      if (op == reduce::mean) {
        // Pre-dividing keeps the result exact for power-of-two world sizes and is free to do here.
        t.div_(size_);
        op = reduce::sum;
      }
      std::vector<torch::Tensor> v{t};
      c10d::AllreduceOptions o;
      o.reduceOp = to_c10d(op);
      return {group_->allreduce(v, o), "allreduce of " + std::to_string(t.numel()) + " values"};
    }

    /// Copies root's `t` into every rank's `t`.
    Work broadcast(torch::Tensor& t, int root = 0) {
      std::vector<torch::Tensor> v{t};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      return {group_->broadcast(v, o), "broadcast from rank " + std::to_string(root)};
    }

    /// out[r] receives rank r's `in`; out must hold size() tensors shaped like `in`.
    Work allgather(std::vector<torch::Tensor>& out, const torch::Tensor& in) {
      std::vector<std::vector<torch::Tensor>> outs{out};
      std::vector<torch::Tensor> ins{in};
      auto w = group_->allgather(outs, ins);
      // Gloo writes into the tensors it was given, which share storage with `out`.
      return {w, "allgather of " + std::to_string(in.numel()) + " values"};
    }

    void barrier() {
      Work(group_->barrier(), "barrier").wait();
    }

   private:
    static c10d::ReduceOp to_c10d(reduce op) {
      switch (op) {
        case reduce::max: return c10d::ReduceOp::MAX;
        case reduce::min: return c10d::ReduceOp::MIN;
        default: return c10d::ReduceOp::SUM;
      }
    }

    static std::shared_ptr<::gloo::transport::Device> make_device() {
      if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
        return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
      const char* addr = std::getenv("MASTER_ADDR");
      const std::string a = addr ? addr : "127.0.0.1";
      if (a == "localhost" || a.rfind("127.", 0) == 0 || a == "::1")
        return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
      return c10d::ProcessGroupGloo::createDefaultDevice();
    }

    int rank_, size_;
    c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  };
};

/// Gloo with its default of two worker threads.
using gloo = gloo_with_threads<2>;

}  // namespace backend

DTRAIN_NAMESPACE_END
