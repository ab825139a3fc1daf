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

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

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

  shm_channel(c10d::Store& store, const std::string& key, int rank, int world, std::chrono::milliseconds timeout)
      : rank_(rank), world_(world), timeout_(timeout) {
    bytes_ = header_bytes() + 2 * world_ * slot_bytes;  // staging slots, then result slots
    std::string name;
    int fd = -1;
    if (rank_ == 0) {
      std::random_device rd;
      name = "/dtrain-" + std::to_string(getpid()) + "-" + std::to_string(rd());
      fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes_)) != 0)
        throw WorkerError("cannot create shared memory " + name + " (" + std::strerror(errno) +
                          "); is /dev/shm mounted and large enough?");
      store.set(key, std::vector<std::uint8_t>(name.begin(), name.end()));
    } else {
      const auto v = store.get(key);  // waits for rank 0
      name.assign(v.begin(), v.end());
      fd = shm_open(name.c_str(), O_RDWR, 0600);
      if (fd < 0) throw WorkerError("cannot open shared memory " + name + " (" + std::strerror(errno) + ")");
    }
    base_ = static_cast<char*>(mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ::close(fd);
    if (base_ == MAP_FAILED) throw WorkerError(std::string("cannot map shared memory: ") + std::strerror(errno));
    // Every rank has it mapped once all have added themselves; then the name can go, so nothing
    // is left in /dev/shm whatever happens to the processes later.
    store.add(key + "/mapped", 1);
    while (store.add(key + "/mapped", 0) < world_) std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (rank_ == 0) shm_unlink(name.c_str());
    spin_for_ = spin_budget(world_);
  }

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
  pending allreduce(const CollectiveCall& call, torch::Tensor t, bool mean, bool wake = true) {
    return submit(call, [this, t, mean]() mutable { allreduce_now(t, mean); }, wake);
  }
  /// Copies root's `t` into every rank's `t`.
  pending broadcast(const CollectiveCall& call, torch::Tensor t, int root, bool wake = true) {
    return submit(call, [this, t, root]() mutable { broadcast_now(t, root); }, wake);
  }
  /// Rank r's `piece` (contiguous, any dtype) into out[r*n, (r+1)*n), n = piece.numel(), on
  /// every rank: each rank copies its piece in once and every piece out once.
  pending allgather(const CollectiveCall& call, torch::Tensor out, torch::Tensor piece) {
    return submit(call, [this, out, piece]() mutable { allgather_now(out, piece); });
  }
  /// `out` (n values) = sum (or mean) over ranks of in[rank*n, (rank+1)*n): each rank copies all
  /// of `in` in, reduces only its slice and copies only that out (`in` is left unchanged).
  pending reduce_scatter(const CollectiveCall& call, torch::Tensor out, torch::Tensor in, bool mean) {
    return submit(call, [this, out, in, mean]() mutable { reduce_scatter_now(out, in, mean); });
  }
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
  static std::chrono::nanoseconds spin_budget(int world) {
    if (const char* us = std::getenv("DTRAIN_SHM_SPIN_US"); us && *us) {
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(us, &end, 10);
      if (*end != '\0' || errno == ERANGE || v < 0 || v > 10'000'000)
        throw ConfigError(std::string("DTRAIN_SHM_SPIN_US=\"") + us +
                          "\" is not a whole number of microseconds from 0 to 10000000");
      return std::chrono::microseconds(v);
    }
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    const int available = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    return static_cast<long long>(world) * at::get_num_threads() <= available ? std::chrono::nanoseconds(std::chrono::milliseconds(1))
                                                                                : std::chrono::nanoseconds(0);
  }

  static bool supports(const torch::Tensor& t) {
    return t.device().is_cpu() && t.is_contiguous() &&
           (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kDouble);
  }

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
  static void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t seen, long ns) {
    timespec ts{0, ns};
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
  }
  // The header: a phase counter per rank, then two generations of every rank's CollectiveCall
  // (a rank writes its next call while a slower one may still read the current one).
  std::size_t calls_offset() const { return world_ * sizeof(counter); }
  std::size_t header_bytes() const {
    return ((calls_offset() + 2 * world_ * CollectiveCall::words * sizeof(std::int64_t) + 4095) / 4096) * 4096;
  }
  counter& arrived(int r) { return reinterpret_cast<counter*>(base_)[r]; }
  std::int64_t* calls(std::uint64_t generation) {
    return reinterpret_cast<std::int64_t*>(base_ + calls_offset()) + (generation % 2) * world_ * CollectiveCall::words;
  }
  char* slot(int r) { return base_ + header_bytes() + r * slot_bytes; }
  char* result(int r) { return base_ + header_bytes() + (world_ + r) * slot_bytes; }

  pending submit(const CollectiveCall& call, std::function<void()> op, bool wake = true) {
    return tasks_.submit([this, call, op = std::move(op)] {
      const auto words = call.encode();
      ++generation_;
      std::memcpy(calls(generation_) + rank_ * CollectiveCall::words, words.data(), sizeof words);
      checking_ = call;
      current_ = call;
      op();
      if (checking_) barrier();  // a collective without a barrier of its own (no elements)
    }, wake);
  }

  // Announces this rank's next phase and waits for every rank to reach it: a spin (a peer that is
  // about to arrive costs no system call and no wake-up), then a futex sleep, so a waiting rank
  // leaves its core to the computation of others. The spin is long (spin_for_) only on a thread
  // that waits for the collective anyway (not the channel's own, whose core backward may need),
  // when every rank's threads have a core of their own, and while the recent waits were shorter
  // than it: a sleeping rank's wake-up took 100-300 us on the 2-core development VM, on every
  // collective; but where the peers are slow to come (other work on the cores, uneven ranks)
  // spinning only takes a core the rank it waits for may need.
  void barrier() {
    const std::uint32_t phase = ++phase_;
    auto& mine = arrived(rank_);
    mine.value.store(phase, std::memory_order_seq_cst);
    if (mine.sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&mine.value);
    const auto start = std::chrono::steady_clock::now();
    const bool long_spin = tasks_.by_waiter() && recent_wait_ < spin_for_;
    const auto spin_until = start + (long_spin ? spin_for_ : std::chrono::nanoseconds(0));
    auto next_check = start + std::chrono::seconds(1);
    for (int r = 0; r < world_; ++r) {
      auto& theirs = arrived(r);
      for (std::uint32_t spins = 0;; ++spins) {
        const std::uint32_t seen = theirs.value.load(std::memory_order_seq_cst);
        if (static_cast<std::int32_t>(seen - phase) >= 0) break;
        if (spins < min_spins || (spins % 64 != 0 ? true : std::chrono::steady_clock::now() < spin_until)) {
          cpu_relax();
          continue;
        }
        // Counted, so that the rank that arrives knows whether to wake anyone (a system call).
        // A wake-up lost to the race between the two is bounded by the 20 ms timeout.
        theirs.sleepers.fetch_add(1, std::memory_order_seq_cst);
        futex_wait(&theirs.value, seen, 20'000'000);  // 20 ms, then look at the clock
        theirs.sleepers.fetch_sub(1, std::memory_order_seq_cst);
        const auto now = std::chrono::steady_clock::now();
        if (now > start + timeout_)
          throw WorkerError("shared-memory collective: rank " + std::to_string(named(r)) + " did not arrive at " +
                            current_.describe() + " within " + std::to_string(timeout_.count()) +
                            " ms (it died, hangs, or issued other collectives)");
        if (now > next_check && stall_check_) {
          try {
            stall_check_();
          } catch (const std::exception& e) {
            throw WorkerError(std::string(e.what()) + " [rank " + std::to_string(named(rank_)) + " was in " +
                              current_.describe() + "; rank " + std::to_string(named(r)) + " had not arrived]");
          }
          next_check = now + std::chrono::seconds(1);
        }
      }
    }
    recent_wait_ = (recent_wait_ * 7 + (std::chrono::steady_clock::now() - start)) / 8;
    // Every rank has written its call before it arrived here: compare them before any data moves.
    if (checking_) {
      const CollectiveCall mine = *std::exchange(checking_, std::nullopt);
      if (names_.empty()) {
        verify_same_call(rank_, mine, calls(generation_), world_);
      } else {  // the same check, naming the group's ranks: each call at its group rank's place
        std::vector<std::int64_t> all(static_cast<std::size_t>(names_.back() + 1) * CollectiveCall::words);
        const auto w = mine.encode();
        for (std::size_t at = 0; at < all.size(); at += CollectiveCall::words) std::copy(w.begin(), w.end(), all.begin() + at);
        for (int r = 0; r < world_; ++r)
          std::copy_n(calls(generation_) + r * CollectiveCall::words, CollectiveCall::words,
                      all.begin() + names_[r] * CollectiveCall::words);
        verify_same_call(named(rank_), mine, all.data(), names_.back() + 1);
      }
    }
  }

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

  void allreduce_now(torch::Tensor& t, bool mean) {
    AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "dtrain_shm_allreduce", [&] {
      scalar_t* data = t.data_ptr<scalar_t>();
      const std::size_t total = static_cast<std::size_t>(t.numel()), per_round = slot_bytes / sizeof(scalar_t);
      for (std::size_t at = 0; at < total; at += per_round) reduce_round(data + at, std::min(per_round, total - at), mean);
    });
  }

  void broadcast_now(torch::Tensor& t, int root) {
    char* data = static_cast<char*>(t.data_ptr());
    const std::size_t total = static_cast<std::size_t>(t.numel()) * t.element_size();
    for (std::size_t at = 0; at < total; at += slot_bytes) {
      const std::size_t n = std::min(slot_bytes, total - at);
      if (rank_ == root) std::memcpy(slot(root), data + at, n);
      barrier();
      if (rank_ != root) std::memcpy(data + at, slot(root), n);
      barrier();  // the root's slot is free again
    }
  }

  void allgather_now(torch::Tensor& out, const torch::Tensor& piece) {
    const char* in = static_cast<const char*>(piece.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    const std::size_t total = static_cast<std::size_t>(piece.numel()) * piece.element_size();
    for (std::size_t at = 0; at < total; at += slot_bytes) {
      const std::size_t n = std::min(slot_bytes, total - at);
      std::memcpy(slot(rank_), in + at, n);
      barrier();  // every rank staged its chunk
      for (int q = 0; q < world_; ++q) std::memcpy(dst + q * total + at, slot(q), n);
      barrier();  // the slots are free again
    }
  }

  void reduce_scatter_now(torch::Tensor& out, const torch::Tensor& in, bool mean) {
    AT_DISPATCH_FLOATING_TYPES(in.scalar_type(), "dtrain_shm_reduce_scatter", [&] {
      const scalar_t* src = in.data_ptr<scalar_t>();
      scalar_t* dst = out.data_ptr<scalar_t>();
      const std::size_t n = static_cast<std::size_t>(out.numel());
      // A round stages chunk [at, at + c) of every rank's piece: world * c values per slot.
      const std::size_t c_max = slot_bytes / sizeof(scalar_t) / world_;
      for (std::size_t at = 0; at < n; at += c_max) {
        const std::size_t c = std::min(c_max, n - at);
        auto* staged = reinterpret_cast<scalar_t*>(slot(rank_));
        for (int q = 0; q < world_; ++q) std::memcpy(staged + q * c, src + q * n + at, c * sizeof(scalar_t));
        barrier();  // every rank staged its chunks
        sum_slices(dst + at, rank_ * c, c, mean);
        barrier();  // every rank read its slice: the slots are free again
      }
    });
  }

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
