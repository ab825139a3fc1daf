// SPDX-License-Identifier: Apache-2.0
#pragma once
// Allreduce, broadcast, allgather and reduce-scatter through shared memory, for ranks that share
// one machine.
//
// On one host, Gloo's TCP loopback copies every byte through the kernel twice; here each rank
// copies its tensor into a shared segment once, reduces one slice of it, and copies the result
// out. For a 0.8 MB gradient on two ranks this takes a fraction of Gloo's time.

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/types.h>

#include <dtrain/collective.hpp>
#include <dtrain/detail/serial_tasks.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {

void cpu_relax();

/// A shared segment for `world` ranks of one host, with one worker thread that runs the queued
/// collectives in submission order (the order must be the same on every rank, as for any
/// collective). Throws WorkerError when a peer does not arrive within the timeout.
///
/// A rank that waits for a collective its thread has not started runs it itself (and any queued
/// before it): a collective launched only when the caller is about to wait anyway (a model whose
/// gradients fit one bucket) then costs no wake-up of the thread and no wake-up back, which on two
/// busy cores is a large share of a short step.
///
/// Every collective carries its CollectiveCall: each rank writes it into the header before the
/// collective's first barrier and compares every rank's right after it, so ranks that issued
/// different collectives get CollectiveMismatch before any of them reads another's bytes (and
/// without a barrier of its own: the check rides on the first one the collective has anyway).
class shm_channel {
 public:
  /// Bytes each rank stages per round; larger tensors go in rounds of this size.
  static constexpr std::size_t slot_bytes = std::size_t{4} << 20;

  shm_channel(c10d::Store& store, const std::string& key, int rank, int world, std::chrono::milliseconds timeout);

  shm_channel(const shm_channel&) = delete;
  shm_channel& operator=(const shm_channel&) = delete;
  ~shm_channel() {
    tasks_.stop();  // before the segment goes: a queued collective still runs in it
    munmap(base_, bytes_);
  }

  /// A queued collective (detail/serial_tasks.hpp): `done`, and `help` for the thread about to
  /// wait for it.
  using pending = pending_task;

  /// Sums `t` (contiguous float or double, CPU) over ranks in place, divided by world if `mean`.
  /// `wake` false: the caller waits for it next (runs::by_waiter); the thread is not woken for it.
  pending allreduce(const CollectiveCall& call, torch::Tensor t, bool mean, bool wake = true);
  /// Copies root's `t` into every rank's `t`.
  pending broadcast(const CollectiveCall& call, torch::Tensor t, int root, bool wake = true);
  /// Rank r's `piece` (contiguous, any dtype) into out[r*n, (r+1)*n), n = piece.numel(), on
  /// every rank: each rank copies its piece in once and every piece out once.
  pending allgather(const CollectiveCall& call, torch::Tensor out, torch::Tensor piece) {
    return submit(call, [this, out, piece]() mutable { allgather_now(out, piece); });
  }
  /// `out` (n values) = sum (or mean) over ranks of in[rank*n, (rank+1)*n): each rank copies all
  /// of `in` in, reduces only its slice and copies only that out (`in` is left unchanged).
  pending reduce_scatter(const CollectiveCall& call, torch::Tensor out, torch::Tensor in, bool mean);
  /// Only the comparison of the ranks' calls (one barrier), for a collective that then runs
  /// elsewhere (over Gloo): the communicator waits for it before it issues that collective.
  pending check(const CollectiveCall& call) {
    return submit(call, [] {});
  }

  /// A collective of several steps (backend::gloo's hierarchical allreduce): `body` runs in the
  /// queue's order, as one collective with `call`, and may run the steps below, which run at once
  /// on the calling thread (only from a body).
  pending compose(const CollectiveCall& call, std::function<void()> body) { return submit(call, std::move(body)); }
  void allreduce_step(torch::Tensor& t, bool mean) { allreduce_now(t, mean); }
  void broadcast_step(torch::Tensor& t, int root) { broadcast_now(t, root); }
  /// The group's ranks of this channel's ranks 0, 1, ..., as its errors name them (a host's ranks).
  void name_ranks(std::vector<int> ranks) { names_ = std::move(ranks); }

  /// Called about once a second while a collective waits for a peer; it may throw to give up early
  /// (the worker context checks whether a peer failed or left the loop).
  void on_stall(std::function<void()> check) { stall_check_ = std::move(check); }

  /// How long a rank spins in a barrier before it sleeps: DTRAIN_SHM_SPIN_US (microseconds) when
  /// set; else 1 ms when the ranks' intra-op threads fit the CPUs this process may run on
  /// (ranks x threads <= CPUs), and none beyond a few microseconds when they do not.
  static std::chrono::nanoseconds spin_budget(int world);

  static bool supports(const torch::Tensor& t);

 private:
  // A rank's barrier phase; 32 bits because it is also a futex word (shared between processes,
  // so not FUTEX_PRIVATE). Phases are compared modulo 2^32.
  struct alignas(64) counter {
    std::atomic<std::uint32_t> value;
    std::atomic<std::uint32_t> sleepers;  // ranks in futex_wait on `value`
  };
  static_assert(sizeof(std::atomic<std::uint32_t>) == 4, "a futex word is 32 bits");

  static void futex_wake_all(std::atomic<std::uint32_t>* word) {
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
  }
  // Sleeps while *word == seen, at most `ns` nanoseconds (wakes early on any change).
  static void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t seen, long ns);
  // The header: a phase counter per rank, then two generations of every rank's CollectiveCall
  // (a rank writes its next call while a slower one may still read the current one).
  std::size_t calls_offset() const { return world_ * sizeof(counter); }
  std::size_t header_bytes() const;
  counter& arrived(int r) { return reinterpret_cast<counter*>(base_)[r]; }
  std::int64_t* calls(std::uint64_t generation);
  char* slot(int r) { return base_ + header_bytes() + r * slot_bytes; }
  char* result(int r) { return base_ + header_bytes() + (world_ + r) * slot_bytes; }

  pending submit(const CollectiveCall& call, std::function<void()> op, bool wake = true);

  // Announces this rank's next phase and waits for every rank to reach it: a spin (a peer that is
  // about to arrive costs no system call and no wake-up), then a futex sleep, so a waiting rank
  // leaves its core to the computation of others. The spin is long (spin_for_) only on a thread
  // that waits for the collective anyway (not the channel's own, whose core backward may need),
  // when every rank's threads have a core of their own, and while the recent waits were shorter
  // than it: a sleeping rank's wake-up took 100-300 us on the 2-core development VM, on every
  // collective; but where the peers are slow to come (other work on the cores, uneven ranks)
  // spinning only takes a core the rank it waits for may need.
  void barrier();

  // out[i] = the sum over ranks, in rank order, of their staged values [from + i], times 1/world
  // for a mean. The loops go 16 bytes at a time in the compiler's vector type, so they are
  // vectorised at any optimisation level of the including program (a plain loop is not, at -O2
  // with GCC 12: 0.8 MB on two ranks took ~270 us instead of ~115).
  template <class T>
  void sum_slices(T* out, std::size_t from, std::size_t n, bool mean) {
    typedef T vec __attribute__((vector_size(16)));
    constexpr std::size_t lanes = sizeof(vec) / sizeof(T);
    const std::size_t whole = n / lanes * lanes;
    std::memcpy(out, reinterpret_cast<const T*>(slot(0)) + from, n * sizeof(T));
    for (int q = 1; q < world_; ++q) {
      const T* in = reinterpret_cast<const T*>(slot(q)) + from;
      for (std::size_t i = 0; i < whole; i += lanes) {
        vec a, b;
        std::memcpy(&a, out + i, sizeof a);
        std::memcpy(&b, in + i, sizeof b);
        a += b;
        std::memcpy(out + i, &a, sizeof a);
      }
      for (std::size_t i = whole; i < n; ++i) out[i] += in[i];
    }
    if (!mean) return;
    const T scale = T(1) / T(world_);
    for (std::size_t i = 0; i < whole; i += lanes) {
      vec a;
      std::memcpy(&a, out + i, sizeof a);
      a *= scale;
      std::memcpy(out + i, &a, sizeof a);
    }
    for (std::size_t i = whole; i < n; ++i) out[i] *= scale;
  }

  template <class T>
  void reduce_round(T* data, std::size_t n, bool mean) {
    std::memcpy(slot(rank_), data, n * sizeof(T));
    barrier();  // every rank staged its part
    // Rank r reduces elements [lo, hi) of the round and publishes them in its result slot.
    const std::size_t per = (n + world_ - 1) / world_, lo = std::min(n, per * rank_), hi = std::min(n, lo + per);
    sum_slices(reinterpret_cast<T*>(result(rank_)), lo, hi - lo, mean);
    barrier();  // every slice reduced
    for (int q = 0; q < world_; ++q) {
      const std::size_t qlo = std::min(n, per * q), qhi = std::min(n, qlo + per);
      std::memcpy(data + qlo, result(q), (qhi - qlo) * sizeof(T));
    }
  }

  void allreduce_now(torch::Tensor& t, bool mean);

  void broadcast_now(torch::Tensor& t, int root);

  void allgather_now(torch::Tensor& out, const torch::Tensor& piece);

  void reduce_scatter_now(torch::Tensor& out, const torch::Tensor& in, bool mean);

  int rank_, world_;
  std::chrono::milliseconds timeout_;
  std::size_t bytes_ = 0;
  char* base_ = nullptr;
  static constexpr std::uint32_t min_spins = 2000;  // a few microseconds, always
  std::chrono::nanoseconds spin_for_ = std::chrono::nanoseconds(0);
  std::chrono::nanoseconds recent_wait_ = std::chrono::nanoseconds(0);  // a moving average of barrier waits
  std::uint32_t phase_ = 0;
  std::optional<CollectiveCall> checking_;  // the call to verify at the next barrier
  CollectiveCall current_;                  // the collective running (named when a peer is missing)
  std::uint64_t generation_ = 0;            // collectives run on this channel (the calls' buffer)
  std::function<void()> stall_check_;
  std::vector<int> names_;  // empty: the channel's ranks are the group's
  int named(int r) const { return names_.empty() ? r : names_[r]; }
  serial_tasks tasks_;  // the collectives, in order: on the channel's thread or on a waiting one
};

}  // namespace detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/detail/impl/shm_allreduce.ipp>
#endif
