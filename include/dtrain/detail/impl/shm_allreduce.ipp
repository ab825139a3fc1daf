// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of shm_allreduce.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/detail/shm_allreduce.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace detail {

DTRAIN_INLINE void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

DTRAIN_INLINE shm_channel::shm_channel(c10d::Store& store, const std::string& key, int rank, int world, std::chrono::milliseconds timeout)
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

DTRAIN_INLINE shm_channel::pending shm_channel::allreduce(const CollectiveCall& call, torch::Tensor t, bool mean, bool wake) {
  return submit(call, [this, t, mean]() mutable { allreduce_now(t, mean); }, wake);
}

DTRAIN_INLINE shm_channel::pending shm_channel::broadcast(const CollectiveCall& call, torch::Tensor t, int root, bool wake) {
  return submit(call, [this, t, root]() mutable { broadcast_now(t, root); }, wake);
}

DTRAIN_INLINE shm_channel::pending shm_channel::reduce_scatter(const CollectiveCall& call, torch::Tensor out, torch::Tensor in, bool mean) {
  return submit(call, [this, out, in, mean]() mutable { reduce_scatter_now(out, in, mean); });
}

DTRAIN_INLINE std::chrono::nanoseconds shm_channel::spin_budget(int world) {
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

DTRAIN_INLINE bool shm_channel::supports(const torch::Tensor& t) {
  return t.device().is_cpu() && t.is_contiguous() &&
         (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kDouble);
}

DTRAIN_INLINE void shm_channel::futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t seen, long ns) {
  timespec ts{0, ns};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

DTRAIN_INLINE std::size_t shm_channel::header_bytes() const {
  return ((calls_offset() + 2 * world_ * CollectiveCall::words * sizeof(std::int64_t) + 4095) / 4096) * 4096;
}

DTRAIN_INLINE std::int64_t* shm_channel::calls(std::uint64_t generation) {
  return reinterpret_cast<std::int64_t*>(base_ + calls_offset()) + (generation % 2) * world_ * CollectiveCall::words;
}

DTRAIN_INLINE shm_channel::pending shm_channel::submit(const CollectiveCall& call, std::function<void()> op, bool wake) {
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

DTRAIN_INLINE void shm_channel::barrier() {
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

DTRAIN_INLINE void shm_channel::allreduce_now(torch::Tensor& t, bool mean) {
  AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "dtrain_shm_allreduce", [&] {
    scalar_t* data = t.data_ptr<scalar_t>();
    const std::size_t total = static_cast<std::size_t>(t.numel()), per_round = slot_bytes / sizeof(scalar_t);
    for (std::size_t at = 0; at < total; at += per_round) reduce_round(data + at, std::min(per_round, total - at), mean);
  });
}

DTRAIN_INLINE void shm_channel::broadcast_now(torch::Tensor& t, int root) {
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

DTRAIN_INLINE void shm_channel::allgather_now(torch::Tensor& out, const torch::Tensor& piece) {
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

DTRAIN_INLINE void shm_channel::reduce_scatter_now(torch::Tensor& out, const torch::Tensor& in, bool mean) {
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
}  // namespace detail
DTRAIN_NAMESPACE_END
