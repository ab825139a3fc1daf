// SPDX-License-Identifier: Apache-2.0
#pragma once
// backend::nccl: collectives over NCCL on a communication stream of their own, one GPU per worker.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/types.h>

#include <dtrain/collective.hpp>
#include <dtrain/data/prefetch.hpp>
#include <dtrain/detail/cuda.hpp>
#include <dtrain/error.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/policy/category.hpp>

#if DTRAIN_WITH_CUDA
#include <dtrain/backend/detail/nccl_support.hpp>
#endif

#if DTRAIN_WITH_CUDA
#include <nccl.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

DTRAIN_NAMESPACE_BEGIN

namespace backend {

#if DTRAIN_WITH_CUDA


/// NCCL between the GPUs of the group: worker LOCAL_RANK uses cuda:LOCAL_RANK.
///
/// - Rank 0 creates the ncclUniqueId and passes it to the others through the rendezvous store.
/// - Collectives run on a communication stream of this communicator. An event recorded on the
///   caller's current (compute) stream orders each one after the kernels that produced its
///   tensors; an event recorded after it lets Work::wait() order the compute stream after it. So
///   DDP's bucket allreduces run while backward goes on computing the next gradients.
/// - A watchdog thread checks ncclCommGetAsyncError and each collective's age: a collective older
///   than RunConfig::collective_timeout, or an asynchronous NCCL error, aborts the communicator
///   (ncclCommAbort), which ends the kernels waiting for peers; the next call or wait() throws a
///   WorkerError naming the collective and the rank.
struct nccl {
  using category = dtrain::category::backend;
  static constexpr bool uses_cuda = true;
  static constexpr bool available = true;
  static constexpr const char* name = "nccl";
  /// How ctx.shard() moves batches to the device: pinned memory, a copy stream, one batch ahead.
  using batch_transfer = data::cuda_transfer;

  static torch::Device device(int local_rank) { return {torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank)}; }

  class communicator {
   public:
    communicator(const c10::intrusive_ptr<c10d::Store>& store, const launch::WorkerIdentity& who,
                 std::chrono::milliseconds timeout)
        : rank_(who.rank), size_(who.world_size), timeout_(timeout), device_(select_device(who)),
          stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_.index())),
          state_(std::make_shared<nccl_detail::shared_state>()) {
      c10::cuda::CUDAGuard on_device(device_);
      ncclUniqueId id;
      const std::string key = "nccl/unique_id";
      if (rank_ == 0) {
        check(ncclGetUniqueId(&id), "ncclGetUniqueId");
        const auto* p = reinterpret_cast<const std::uint8_t*>(&id);
        store->set(key, std::vector<std::uint8_t>(p, p + sizeof id));
      } else {
        const auto bytes = store->get(key);  // waits for rank 0, up to the store's timeout
        if (bytes.size() != sizeof id)
          throw WorkerError("backend::nccl: rank " + std::to_string(rank_) + " read a " + std::to_string(bytes.size()) +
                            "-byte ncclUniqueId from the store, expected " + std::to_string(sizeof id) +
                            "; every rank must use the same NCCL version");
        std::memcpy(&id, bytes.data(), sizeof id);
      }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
      // Non-blocking, so that a rank that never joins ends in a timeout instead of a hang.
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      check(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRank");
#else
      check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
#endif
      settle("ncclCommInitRank");
      watchdog_ = std::thread([this] { watch(); });
    }

    communicator(const communicator&) = delete;
    communicator& operator=(const communicator&) = delete;

    ~communicator() {
      // Pending collectives finish first; the watchdog still aborts one that never does.
      if (!aborted_) cudaStreamSynchronize(stream_.stream());
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
      }
      wake_.notify_all();
      if (watchdog_.joinable()) watchdog_.join();
      if (comm_ && !aborted_) ncclCommDestroy(comm_);
    }

    /// `check` runs about once a second from the watchdog while a collective is older than
    /// stall_seconds; when it throws (a peer failed or left the loop) the communicator is aborted.
    void on_stall(std::function<void()> check) {
      std::lock_guard<std::mutex> lock(mutex_);
      on_stall_ = std::move(check);
    }

    int rank() const { return rank_; }
    int size() const { return size_; }
    torch::Device device() const { return device_; }
    /// The communication stream (for tests and profiles).
    const c10::cuda::CUDAStream& stream() const { return stream_; }

    /// Reduces `t` (on this worker's GPU) in place across ranks; mean is NCCL's ncclAvg.
    Work allreduce(torch::Tensor& t, reduce op = reduce::sum) {
      if (op == reduce::mean && !t.is_floating_point())
        throw ConfigError("backend::nccl: a mean allreduce needs a floating-point tensor; reduce integers with sum");
      const auto what = "allreduce of " + std::to_string(t.numel()) + " values";
      return run(what, describe(CollectiveCall::op::allreduce, static_cast<std::int64_t>(op), t), {t}, [&](cudaStream_t s) {
        return ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_detail::to_nccl(t.scalar_type()),
                             nccl_detail::to_nccl(op), comm_, s);
      });
    }

    /// Copies root's `t` into every rank's `t`.
    Work broadcast(torch::Tensor& t, int root = 0) {
      return run("broadcast from rank " + std::to_string(root), describe(CollectiveCall::op::broadcast, root, t), {t},
                 [&](cudaStream_t s) {
        return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_detail::to_nccl(t.scalar_type()), root,
                             comm_, s);
      });
    }

    /// out_full_flat (size() * in_shard.numel() values) receives every rank's shard, rank r's at
    /// r * in_shard.numel().
    Work allgather(torch::Tensor& out_full_flat, const torch::Tensor& in_shard) {
      same_dtype(out_full_flat, in_shard, "allgather");
      if (out_full_flat.numel() != in_shard.numel() * size_)
        throw ConfigError("backend::nccl: allgather into " + std::to_string(out_full_flat.numel()) + " values from a " +
                          std::to_string(in_shard.numel()) + "-value shard at world size " + std::to_string(size_) +
                          "; the output must hold world size x shard values");
      return run("allgather of " + std::to_string(in_shard.numel()) + " values",
                 describe(CollectiveCall::op::allgather, -1, in_shard), {out_full_flat, in_shard},
                 [&](cudaStream_t s) {
                   return ncclAllGather(in_shard.data_ptr(), out_full_flat.data_ptr(), in_shard.numel(),
                                        nccl_detail::to_nccl(in_shard.scalar_type()), comm_, s);
                 });
    }

    /// out[r] receives rank r's `in` (gloo's form: through a flat buffer).
    Work allgather(std::vector<torch::Tensor>& out, const torch::Tensor& in) {
      if (static_cast<int>(out.size()) != size_)
        throw ConfigError("backend::nccl: allgather needs one output tensor per rank (" + std::to_string(size_) +
                          "), got " + std::to_string(out.size()));
      auto flat = torch::empty({in.numel() * size_}, in.options());
      allgather(flat, in.contiguous()).wait();
      for (int r = 0; r < size_; ++r) out[r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view_as(out[r]));
      return {};
    }

    /// out_shard receives the reduction over ranks of values [rank * n, (rank + 1) * n) of every
    /// rank's in_full, n being out_shard.numel().
    Work reduce_scatter(torch::Tensor& out_shard, const torch::Tensor& in_full, reduce op = reduce::sum) {
      same_dtype(out_shard, in_full, "reduce_scatter");
      if (in_full.numel() != out_shard.numel() * size_)
        throw ConfigError("backend::nccl: reduce_scatter of " + std::to_string(in_full.numel()) + " values into a " +
                          std::to_string(out_shard.numel()) + "-value shard at world size " + std::to_string(size_) +
                          "; the input must hold world size x shard values");
      if (op == reduce::mean && !in_full.is_floating_point())
        throw ConfigError("backend::nccl: a mean reduce_scatter needs a floating-point tensor");
      return run("reduce_scatter of " + std::to_string(in_full.numel()) + " values",
                 describe(CollectiveCall::op::reduce_scatter, static_cast<std::int64_t>(op), in_full), {out_shard, in_full},
                 [&](cudaStream_t s) {
                   return ncclReduceScatter(in_full.data_ptr(), out_shard.data_ptr(), out_shard.numel(),
                                            nccl_detail::to_nccl(in_full.scalar_type()), nccl_detail::to_nccl(op),
                                            comm_, s);
                 });
    }

    /// Waits (on the host) for this rank's work on the current and the communication stream, and
    /// throws what the watchdog saw. The context calls it before a rank reports that it finished.
    void synchronize() {
      c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
      stream_.synchronize();
      state_->rethrow();
    }

    /// Returns when every rank got here and every collective issued before it is done.
    void barrier() {
      auto t = torch::zeros({1}, torch::TensorOptions().device(device_));
      allreduce(t, reduce::sum).wait();
      c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
      state_->rethrow();
    }

   private:
    // A collective pending this long makes the watchdog ask the context whether a peer failed or
    // left the loop. Long enough that a GPU running behind its host is not taken for a stall.
    static constexpr int stall_seconds = 10;

    static torch::Device select_device(const launch::WorkerIdentity& who) {
      const int count = c10::cuda::device_count();
      if (who.local_rank >= count)
        throw ConfigError("backend::nccl: rank " + std::to_string(who.rank) + " has LOCAL_RANK " +
                          std::to_string(who.local_rank) + " but this host shows " + std::to_string(count) +
                          " CUDA device(s); start at most one worker per GPU (ScalingConfig::num_workers) and "
                          "check CUDA_VISIBLE_DEVICES");
      const auto d = nccl::device(who.local_rank);
      c10::cuda::set_device(d.index());
      return d;
    }

    static void same_dtype(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
      if (a.scalar_type() != b.scalar_type())
        throw ConfigError(std::string("backend::nccl: ") + what + " between tensors of dtypes " +
                          c10::toString(a.scalar_type()) + " and " + c10::toString(b.scalar_type()) +
                          "; both must have the same dtype");
    }

    std::string on_rank(const std::string& what) const { return what + " on rank " + std::to_string(rank_); }

    // A failed NCCL call: the communicator is unusable; say which call, which rank, and why.
    [[noreturn]] void fail_call(ncclResult_t r, const std::string& what) {
      std::string msg = "backend::nccl: " + on_rank(what) + " failed: " + ncclGetErrorString(r);
      if (comm_) {
        if (const char* last = ncclGetLastError(comm_); last && *last) msg += std::string(" (") + last + ")";
      }
      state_->fail(msg);
      abort();
      throw WorkerError(msg);
    }

    void check(ncclResult_t r, const std::string& what) {
      if (r == ncclSuccess) return;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
      if (r == ncclInProgress) return settle(what);
#endif
      fail_call(r, what);
    }

    // A non-blocking communicator's call may still be in progress: wait for it, up to the timeout.
    void settle(const std::string& what) {
      const auto deadline = std::chrono::steady_clock::now() + timeout_;
      for (;;) {
        ncclResult_t state = ncclSuccess;
        const auto r = ncclCommGetAsyncError(comm_, &state);
        if (r != ncclSuccess) fail_call(r, what);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
        if (state != ncclInProgress) break;
#else
        break;
#endif
        if (std::chrono::steady_clock::now() > deadline) {
          const auto msg = "backend::nccl: " + on_rank(what) + " did not complete within " +
                           std::to_string(timeout_.count()) + " ms (RunConfig::collective_timeout); a peer " +
                           "never joined or hangs";
          state_->fail(msg);
          abort();
          throw WorkerError(msg);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }

    CollectiveCall describe(CollectiveCall::op operation, std::int64_t argument, const torch::Tensor& t) {
      note_collective_issued();
      return {operation, argument, t.scalar_type(), t.numel(), ++seq_};
    }

    // Every rank's CollectiveCall, gathered on the communication stream just before the collective
    // (a fixed-size gather, so it completes even when the calls differ) and copied to pinned host
    // memory; the returned check waits for that copy and compares the calls.
    std::function<void()> exchange_calls(const CollectiveCall& call) {
      const auto words = call.encode();
      const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
      auto mine = torch::tensor(std::vector<std::int64_t>(words.begin(), words.end()), i64).pin_memory();
      auto on_device = torch::empty({(size_ + 1) * CollectiveCall::words}, i64.device(device_));
      auto all = torch::empty({size_ * CollectiveCall::words}, i64.pinned_memory(true));
      auto gathered = std::make_shared<detail::cuda_event>();
      {
        c10::cuda::CUDAStreamGuard on_stream(stream_);
        on_device.narrow(0, 0, CollectiveCall::words).copy_(mine, /*non_blocking=*/true);
        check(ncclAllGather(on_device.data_ptr<std::int64_t>(), on_device.data_ptr<std::int64_t>() + CollectiveCall::words,
                            CollectiveCall::words, ncclInt64, comm_, stream_.stream()),
              "the exchange of the ranks' calls before " + call.describe());
        all.copy_(on_device.narrow(0, CollectiveCall::words, size_ * CollectiveCall::words), /*non_blocking=*/true);
        gathered->record(stream_);
      }
      return [call, all, gathered, rank = rank_, world = size_] {
        while (!gathered->query()) std::this_thread::sleep_for(std::chrono::microseconds(20));
        verify_same_call(rank, call, all.data_ptr<std::int64_t>(), world);
      };
    }

    template <class Launch>
    Work run(const std::string& what, const CollectiveCall& call, std::initializer_list<torch::Tensor> tensors,
             Launch&& launch) {
      state_->rethrow();
      for (const auto& t : tensors) {
        if (!t.is_cuda() || t.device() != device_)
          throw ConfigError("backend::nccl: the " + what + " got a tensor on " + t.device().str() + "; rank " +
                            std::to_string(rank_) + "'s collectives take tensors on " + device_.str() +
                            " (ctx.device())");
        if (!t.is_contiguous())
          throw ConfigError("backend::nccl: the " + what + " got a non-contiguous tensor; pass t.contiguous()");
      }
      c10::cuda::CUDAGuard on_device(device_);
      const auto compute = c10::cuda::getCurrentCUDAStream(device_.index());
      detail::cuda_event inputs_ready;
      inputs_ready.record(compute);
      inputs_ready.block(stream_);
      // The tensors are in use on the communication stream until the collective ends: the caching
      // allocator must not reuse their memory before then, even if the caller drops them.
      for (const auto& t : tensors) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
      auto verify = exchange_calls(call);
      auto p = std::make_shared<nccl_detail::pending>();
      p->what = on_rank(what);
      check(launch(stream_.stream()), what);
      p->done.record(stream_);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        in_flight_.push_back(p);
      }
      return Work(std::make_shared<nccl_detail::completion>(p, state_, device_), what).verified_by({}, std::move(verify));
    }

    void abort() {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      if (aborted_ || !comm_) return;
      aborted_ = true;
      ncclCommAbort(comm_);  // ends kernels that wait for peers; the communicator is gone
    }

    // The watchdog: every 100 ms, drops finished collectives and looks for NCCL's asynchronous
    // errors and collectives past the timeout.
    void watch() {
      auto last_stall_check = std::chrono::steady_clock::now();
      std::unique_lock<std::mutex> lock(mutex_);
      while (!stop_) {
        wake_.wait_for(lock, std::chrono::milliseconds(100));
        if (stop_ || aborted_) continue;
        try {
          while (!in_flight_.empty() && in_flight_.front()->done.query()) in_flight_.pop_front();
        } catch (const std::exception& e) {
          watchdog_fail(lock, "backend::nccl: " + on_rank("a collective") + " failed on the GPU: " + e.what());
          continue;
        }
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm_, &async);
        if (async != ncclSuccess
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
            && async != ncclInProgress
#endif
        ) {
          const std::string what = in_flight_.empty() ? on_rank("a collective") : in_flight_.front()->what;
          watchdog_fail(lock, "backend::nccl: " + what + " failed: NCCL reported " + ncclGetErrorString(async));
          continue;
        }
        if (in_flight_.empty()) continue;
        const auto now = std::chrono::steady_clock::now();
        const auto& oldest = *in_flight_.front();
        if (now - oldest.started > timeout_) {
          watchdog_fail(lock, "backend::nccl: " + oldest.what + " did not complete within " +
                                  std::to_string(timeout_.count()) +
                                  " ms (RunConfig::collective_timeout): a peer died, hangs, or issued "
                                  "different collectives");
          continue;
        }
        if (on_stall_ && now - oldest.started > std::chrono::seconds(stall_seconds) &&
            now - last_stall_check > std::chrono::seconds(1)) {
          last_stall_check = now;
          auto check_peers = on_stall_;
          lock.unlock();
          std::string peer_error;
          try {
            check_peers();
          } catch (const std::exception& e) {
            peer_error = e.what();
          }
          lock.lock();
          if (!peer_error.empty()) watchdog_fail(lock, "backend::nccl: " + oldest.what + " abandoned: " + peer_error);
        }
      }
    }

    void watchdog_fail(std::unique_lock<std::mutex>& lock, const std::string& msg) {
      state_->fail(msg);
      in_flight_.clear();
      lock.unlock();
      std::fprintf(stderr, "dtrain: %s; aborting the NCCL communicator\n", msg.c_str());
      abort();
      lock.lock();
    }

    int rank_, size_;
    std::uint64_t seq_ = 0;
    std::chrono::milliseconds timeout_;
    torch::Device device_;
    c10::cuda::CUDAStream stream_;
    std::shared_ptr<nccl_detail::shared_state> state_;
    ncclComm_t comm_ = nullptr;
    std::mutex abort_mutex_;
    std::atomic<bool> aborted_{false};
    // Shared with the watchdog.
    std::mutex mutex_;
    std::condition_variable wake_;
    bool stop_ = false;
    std::deque<std::shared_ptr<nccl_detail::pending>> in_flight_;
    std::function<void()> on_stall_;
    std::thread watchdog_;
  };
};

#else  // no CUDA

/// backend::nccl in a build without CUDA and NCCL: naming it in a Trainer fails to compile with a
/// message that names the fix (policy::set checks `available`).
struct nccl {
  using category = dtrain::category::backend;
  static constexpr bool uses_cuda = true;
  static constexpr bool available = false;
  static constexpr const char* name = "nccl";
};

#endif

}  // namespace backend

DTRAIN_NAMESPACE_END
