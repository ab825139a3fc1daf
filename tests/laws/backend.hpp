// SPDX-License-Identifier: Apache-2.0
#pragma once
// Laws of the Backend concept (policy/concepts.hpp), checked for one model on `world` real
// processes: forks of the test process (launch::WorkerGroup, as the driver starts its workers)
// that meet over a c10d TCPStore on 127.0.0.1, hosted by the test process, with a short timeout.
//
// On every rank r of N, with integer-valued tensors (so every sum is exact), in(q) being rank q's
// input:
//   - rank() is r and size() is N;
//   - allreduce(t, sum | max | min): t becomes the elementwise sum | max | min of every rank's t,
//     exactly, in float and double; allreduce(t, mean) is exact where every value is a multiple
//     of N (the mean then is an integer, however the backend divides);
//   - broadcast(t, root): every rank's t becomes root's, for every root;
//   - allgather(out, in): out[q*n, (q+1)*n) is rank q's in (n = in.numel());
//   - reduce_scatter(out, in, op): rank r's out is op over ranks of in[r*n, (r+1)*n)
//     (n = out.numel()), for sum, mean, max and min;
//   - collectives issued without waiting complete in issue order on every rank: waiting for them
//     in reverse order still gives every result;
//   - barrier(): no rank leaves it before the last rank entered it.
// Sizes: 7 and 4099 values for every collective, and a large case for sum and mean, reduce-scatter,
// broadcast and allgather: about 1M values on one host (more than one round of gloo's
// shared-memory slot), 64K between hosts.
// `placement` says where the ranks believe they are: one_host (LOCAL_WORLD_SIZE = N; gloo then
// takes its shared-memory path) or host_per_rank (LOCAL_WORLD_SIZE = 1; Gloo's TCP transport).
// Tensors live on B::device(local rank), so tests/gpu can run the checker for backend::nccl
// (one_host; the test process itself must not have touched CUDA before).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/process.hpp>
#include <dtrain/launch/rendezvous.hpp>
#include <dtrain/policy/concepts.hpp>

#include "../dtrain_catch.hpp"

namespace dtrain_laws::backend {

enum class placement { one_host, host_per_rank };

namespace detail {

using dtrain::reduce;

// Rank q's input: n integer values in [-11, 11], different on every rank.
inline torch::Tensor input(int q, std::int64_t n, torch::ScalarType dtype) {
  return (torch::arange(n, torch::kInt64).mul(7).add(q * 13).remainder(23).sub(11)).to(dtype);
}

inline torch::Tensor reduce_all(const std::vector<torch::Tensor>& per_rank, reduce op) {
  const auto s = torch::stack(per_rank);
  switch (op) {
    case reduce::max: return std::get<0>(s.max(0));
    case reduce::min: return std::get<0>(s.min(0));
    case reduce::mean: return s.sum(0).div(static_cast<double>(per_rank.size()));  // exact: sums of multiples of N
    default: return s.sum(0);
  }
}

inline const char* name(reduce op) {
  switch (op) {
    case reduce::sum: return "sum";
    case reduce::mean: return "mean";
    case reduce::max: return "max";
    default: return "min";
  }
}

// The laws one rank checks; each failure is a line of text for the test process to report.
template <class B>
class rank_laws {
 public:
  /// `big`: the size of the large case (see the header's comment).
  rank_laws(typename B::communicator& comm, torch::Device device, int rank, int world, std::int64_t big)
      : comm_(comm), device_(device), rank_(rank), world_(world), big_(big) {}

  std::vector<std::string> run() {
    expect(comm_.rank() == rank_, "rank() is " + std::to_string(comm_.rank()) + ", not " + std::to_string(rank_));
    expect(comm_.size() == world_, "size() is " + std::to_string(comm_.size()) + ", not " + std::to_string(world_));
    for (const std::int64_t n : {std::int64_t{7}, std::int64_t{4099}}) {
      for (const auto op : {reduce::sum, reduce::mean, reduce::max, reduce::min}) {
        allreduce(n, op, torch::kFloat);
        reduce_scatter(n, op);
      }
      allreduce(n, reduce::sum, torch::kDouble);
      for (int root = 0; root < world_; ++root) broadcast(n, root);
      allgather(n);
    }
    allreduce(big_, reduce::sum, torch::kFloat);
    allreduce(big_, reduce::mean, torch::kFloat);
    reduce_scatter(big_, reduce::sum);
    broadcast(big_, world_ - 1);
    allgather(big_);
    in_issue_order();
    return failures_;
  }

 private:
  void expect(bool ok, const std::string& what) {
    if (!ok) failures_.push_back("rank " + std::to_string(rank_) + ": " + what);
  }
  void expect_equal(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
    const auto g = got.cpu();
    if (g.sizes() != want.sizes() || !torch::equal(g, want)) {
      std::ostringstream s;
      s << what << " is not exact: max |got - want| = "
        << (g.sizes() == want.sizes() ? (g.to(torch::kDouble) - want.to(torch::kDouble)).abs().max().item<double>() : -1.0)
        << " over " << want.numel() << " values";
      expect(false, s.str());
    }
  }
  // A copy on the device (the collectives write into it; the inputs below are cached).
  torch::Tensor on_device(const torch::Tensor& t) const { return t.to(device_, /*non_blocking=*/false, /*copy=*/true); }
  // Rank q's input, made once per size and dtype (a million values take a while on one thread).
  const torch::Tensor& input(int q, std::int64_t n, torch::ScalarType dtype) {
    auto& t = inputs_[{q, n, static_cast<int>(dtype)}];
    if (!t.defined()) t = detail::input(q, n, dtype);
    return t;
  }
  // The input of rank q for `op`: scaled by N for mean, so that the mean is an integer.
  torch::Tensor input_for(int q, std::int64_t n, reduce op, torch::ScalarType dtype) {
    const auto& t = input(q, n, dtype);
    return op == reduce::mean ? t.mul(world_) : t;
  }
  std::vector<torch::Tensor> inputs(std::int64_t n, reduce op, torch::ScalarType dtype) {
    std::vector<torch::Tensor> all;
    for (int q = 0; q < world_; ++q) all.push_back(input_for(q, n, op, dtype));
    return all;
  }

  void allreduce(std::int64_t n, reduce op, torch::ScalarType dtype) {
    auto t = on_device(input_for(rank_, n, op, dtype));
    comm_.allreduce(t, op).wait();
    expect_equal(t, reduce_all(inputs(n, op, dtype), op),
                 std::string("allreduce(") + name(op) + ") of " + std::to_string(n) + " " + c10::toString(dtype));
  }

  void broadcast(std::int64_t n, int root) {
    auto t = on_device(input(rank_, n, torch::kFloat));
    comm_.broadcast(t, root).wait();
    expect_equal(t, input(root, n, torch::kFloat), "broadcast from rank " + std::to_string(root) + " of " + std::to_string(n));
  }

  void allgather(std::int64_t n) {
    auto out = on_device(torch::full({n * world_}, -99.0f));
    comm_.allgather(out, on_device(input(rank_, n, torch::kFloat))).wait();
    expect_equal(out, torch::cat(inputs(n, reduce::sum, torch::kFloat)), "allgather of " + std::to_string(n));
  }

  void reduce_scatter(std::int64_t n, reduce op) {
    auto in = on_device(input_for(rank_, n * world_, op, torch::kFloat));
    auto out = on_device(torch::full({n}, -99.0f));
    comm_.reduce_scatter(out, in, op).wait();
    expect_equal(out, reduce_all(inputs(n * world_, op, torch::kFloat), op).narrow(0, rank_ * n, n),
                 std::string("reduce_scatter(") + name(op) + ") of " + std::to_string(n) + " per rank");
  }

  // Three collectives in flight at once, waited for last to first.
  void in_issue_order() {
    const std::int64_t n = 4099;
    auto a = on_device(input(rank_, n, torch::kFloat));
    auto b = on_device(input(rank_, n, torch::kFloat));
    auto c = on_device(torch::full({n * world_}, -99.0f));
    const auto c_in = on_device(input(rank_ + 1, n, torch::kFloat));
    auto wa = comm_.allreduce(a, reduce::sum);
    auto wb = comm_.broadcast(b, world_ - 1);
    auto wc = comm_.allgather(c, c_in);
    wc.wait();
    wb.wait();
    wa.wait();
    std::vector<torch::Tensor> shifted;
    for (int q = 0; q < world_; ++q) shifted.push_back(input(q + 1, n, torch::kFloat));
    expect_equal(a, reduce_all(inputs(n, reduce::sum, torch::kFloat), reduce::sum), "allreduce issued first, waited last");
    expect_equal(b, input(world_ - 1, n, torch::kFloat), "broadcast issued second");
    expect_equal(c, torch::cat(shifted), "allgather issued third, waited first");
  }

  typename B::communicator& comm_;
  torch::Device device_;
  int rank_, world_;
  std::int64_t big_;
  std::map<std::tuple<int, std::int64_t, int>, torch::Tensor> inputs_;
  std::vector<std::string> failures_;
};

inline std::int64_t now_ns() {
  // steady_clock is CLOCK_MONOTONIC on Linux: one clock for every process of the host.
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline std::string key(const std::string& what, int rank) { return "laws/" + what + "/" + std::to_string(rank); }

// One rank's process: joins the group, checks the laws, leaves its failures and its barrier times
// in the store, and ends with status 0 (checked, whatever the outcome) or 1 (it could not check).
template <class B>
[[noreturn]] void run_rank(int port, int rank, int world, placement where, std::chrono::milliseconds timeout) {
  torch::set_num_threads(1);  // a fork must not enter the parent's OpenMP pool
  c10::intrusive_ptr<c10d::Store> store;
  int status = 0;
  try {
    dtrain::launch::WorkerIdentity who;
    who.rank = rank;
    who.world_size = world;
    who.local_rank = where == placement::one_host ? rank : 0;
    who.local_world_size = where == placement::one_host ? world : 1;
    who.node_rank = where == placement::one_host ? 0 : rank;
    who.master_addr = "127.0.0.1";
    who.master_port = port;
    who.store_on_driver = true;
    store = dtrain::launch::connect_store(who, timeout);
    typename B::communicator comm(store, who, timeout);
    // Just over 4 MiB of floats on one host: more than one round of gloo's shared-memory slot;
    // 256 KiB between hosts, where Gloo's TCP pairs move about 10 MB/s on a busy 2-core machine.
    const std::int64_t big = where == placement::one_host ? (1 << 20) + 3 : (1 << 16) + 3;
    auto failures = rank_laws<B>(comm, B::device(who.local_rank), rank, world, big).run();
    // The last rank enters the barrier late; nobody may leave before it entered.
    if (rank == world - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    store->set(key("enter", rank), dtrain::launch::to_bytes(std::to_string(now_ns())));
    comm.barrier();
    store->set(key("leave", rank), dtrain::launch::to_bytes(std::to_string(now_ns())));
    std::string text;
    for (const auto& f : failures) text += f + "\n";
    store->set(key("failures", rank), dtrain::launch::to_bytes(text));
    comm.barrier();  // every rank done before any communicator goes away
  } catch (const std::exception& e) {
    status = 1;
    const std::string what = std::string("rank ") + std::to_string(rank) + " could not run the laws: " + e.what();
    std::fprintf(stderr, "%s\n", what.c_str());
    try {
      if (store) store->set(key("failures", rank), dtrain::launch::to_bytes(what + "\n"));
    } catch (...) {
    }
  }
  std::fflush(nullptr);
  std::_Exit(status);  // skip static destructors: Gloo's threads may still hold peers
}

}  // namespace detail

inline const char* name(placement p) { return p == placement::one_host ? "one host" : "a host per rank"; }

/// Checks every law above for the Backend policy B on `world` processes placed as `where`.
template <class B>
void check(int world, placement where, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  static_assert(dtrain::BackendPolicy<B>, "the backend law checker takes a model of dtrain::BackendPolicy");
  INFO("world size " << world << ", " << name(where));
  auto store = dtrain::launch::host_store("127.0.0.1", 0, timeout);
  const int port = store->getPort();
  {
    dtrain::launch::WorkerGroup group;
    for (int r = 0; r < world; ++r)
      group.start_fork([&, r] { detail::run_rank<B>(port, r, world, where, timeout); });
    const auto deadline = std::chrono::steady_clock::now() + 3 * timeout;
    std::vector<std::string> ends;
    while (group.running_count() > 0 && std::chrono::steady_clock::now() < deadline) {
      if (auto ended = group.poll()) {
        if (!ended->ok()) ends.push_back("rank " + std::to_string(ended->rank) + " " + ended->describe());
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    INFO("ranks still running at the deadline: " << group.running_count());
    CHECK(group.running_count() == 0);
    for (const auto& e : ends) FAIL_CHECK(e);
  }  // the group kills and reaps any rank left
  std::vector<std::int64_t> enter, leave;
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    REQUIRE(store->check({detail::key("failures", r)}));
    const auto failures = dtrain::launch::to_string(store->get(detail::key("failures", r)));
    std::istringstream lines(failures);
    for (std::string line; std::getline(lines, line);) FAIL_CHECK(line);
    REQUIRE(store->check({detail::key("enter", r), detail::key("leave", r)}));
    enter.push_back(std::stoll(dtrain::launch::to_string(store->get(detail::key("enter", r)))));
    leave.push_back(std::stoll(dtrain::launch::to_string(store->get(detail::key("leave", r)))));
  }
  const auto last_in = *std::max_element(enter.begin(), enter.end());
  const auto first_out = *std::min_element(leave.begin(), leave.end());
  INFO("barrier: the last rank entered " << (last_in - first_out) / 1000 << " us after the first left");
  CHECK(first_out >= last_in);
}

}  // namespace dtrain_laws::backend
