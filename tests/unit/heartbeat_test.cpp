// SPDX-License-Identifier: Apache-2.0
// Heartbeats and progress (launch/heartbeat.hpp, progress_mark.hpp) over a real TCPStore in this
// process: each Heartbeat is one rank's publisher; the progress counter is the process's, so a
// "stuck" rank here is one whose heartbeat sees no mark, and a waiting one calls watch().

#include "support.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include <dtrain/launch/heartbeat.hpp>
#include <dtrain/launch/rendezvous.hpp>
#include <dtrain/progress_mark.hpp>

namespace d = dtrain;
using namespace std::chrono_literals;

namespace {
d::launch::WorkerIdentity rank_of(int rank, int world, int port) {
  d::launch::WorkerIdentity w;
  w.rank = w.local_rank = rank;
  w.world_size = w.local_world_size = world;
  w.master_port = port;
  w.store_on_driver = true;
  return w;
}

std::string this_host() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return std::string(host) + " (pid " + std::to_string(::getpid()) + ")";
}

// Calls rank 0's watch() every 20 ms (as a rank waiting in a collective does) until it throws or
// `limit` passes; the error's text, if any, and how long it took.
std::pair<std::optional<std::string>, std::chrono::milliseconds> watch_until_thrown(
    d::launch::Heartbeat& waiter, c10d::Store& store, std::chrono::milliseconds limit) {
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < limit) {
    try {
      waiter.watch(store, "a collective");
    } catch (const d::WorkerError& e) {
      return {e.what(), std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start)};
    }
    std::this_thread::sleep_for(20ms);
  }
  return {std::nullopt, limit};
}
}  // namespace

TEST_CASE("mark_progress: the last point with its number and the collectives after it", "[heartbeat][progress]") {
  d::mark_progress("batch # of an epoch (ctx.shard)", 12);
  const auto p = d::last_progress();
  CHECK(p.describe() == "batch #12 of an epoch (ctx.shard)");
  d::detail::note_progress();
  d::detail::note_progress();
  CHECK(d::last_progress().count == p.count + 2);
  CHECK(d::last_progress().describe() == "batch #12 of an epoch (ctx.shard), then 2 collectives issued or completed");
  d::mark_progress("the start of the train loop");
  CHECK(d::last_progress().describe() == "the start of the train loop");
}

TEST_CASE("mark_progress costs nanoseconds - no store write per step", "[heartbeat][progress]") {
  constexpr int n = 10'000'000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) d::mark_progress("batch # of an epoch (ctx.shard)", i);
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / n;
  std::printf("mark_progress: %.1f ns per mark\n", ns);
  CHECK(d::last_progress().number == n - 1);
  CHECK(ns < 200);  // a step of the smallest model trained here takes about a millisecond
}

TEST_CASE("Heartbeat: a waiting rank names a peer that beats but makes no progress", "[heartbeat][progress]") {
  auto store = d::launch::host_store("127.0.0.1", 0, 10s);
  const int port = store->getPort();
  const auto timeout = 600ms;
  d::launch::Heartbeat waiter(rank_of(0, 2, port), *store, 10s, timeout);
  d::launch::Heartbeat peer(rank_of(1, 2, port), *store, 10s, timeout);

  SECTION("a peer that keeps marking progress is never named") {
    std::atomic<bool> done{false};
    std::thread training([&] {
      for (std::int64_t b = 0; !done; ++b) {
        d::mark_progress("batch # of an epoch (ctx.shard)", b);
        std::this_thread::sleep_for(50ms);
      }
    });
    const auto [error, took] = watch_until_thrown(waiter, *store, 2500ms);
    done = true;
    training.join();
    CHECK_FALSE(error);
  }
  SECTION("a peer whose progress stands still is named with its host and last point after the timeout") {
    d::mark_progress("report() call #", 7);  // the peer's last sign of progress
    const auto [error, took] = watch_until_thrown(waiter, *store, 5s);
    REQUIRE(error);
    CHECK_THAT(*error, Catch::Contains("rank 1 on " + this_host() + " made no progress for ") &&
                           Catch::Contains("while rank 0 waits at a collective: last progress at report() call #7") &&
                           Catch::Contains("its heartbeat goes on, so it is alive but stuck") &&
                           Catch::Contains("FailureConfig::progress_timeout is 600 ms"));
    CHECK(took >= timeout);
    CHECK(took < timeout + 2s);  // a quarter of the timeout between reads, a fifth between beats
  }
}

TEST_CASE("ProgressWatchdog: the driver names the stuck ranks - not the ones that wait for them", "[heartbeat][progress]") {
  auto store = d::launch::host_store("127.0.0.1", 0, 10s);
  const int port = store->getPort();
  const auto timeout = 600ms;
  d::launch::Heartbeat rank0(rank_of(0, 2, port), *store, 10s, timeout);
  d::launch::Heartbeat rank1(rank_of(1, 2, port), *store, 10s, timeout);
  d::launch::ProgressWatchdog watchdog(*store, /*attempt=*/0, 2, timeout);
  auto all_running = [](int) { return true; };
  // Before either rank reaches its train loop (no mark yet) nothing is stuck.
  const auto before = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - before < 1500ms) {
    REQUIRE_FALSE(watchdog.check(all_running));
    std::this_thread::sleep_for(20ms);
  }
  d::mark_progress("batch # of an epoch (ctx.shard)", 3);

  auto stuck_within = [&](std::chrono::milliseconds limit, bool rank0_waits) -> std::optional<d::launch::Stuck> {
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < limit) {
      if (rank0_waits) try {
          rank0.watch(*store, "a collective");  // rank 0 waits for rank 1: it counts as progressing
        } catch (const d::WorkerError&) {       // and names rank 1 itself; the driver's view is tested here
        }
      if (auto s = watchdog.check(all_running)) return s;
      std::this_thread::sleep_for(20ms);
    }
    return std::nullopt;
  };
  SECTION("rank 1 stuck while rank 0 waits for it") {
    const auto stuck = stuck_within(4s, true);
    REQUIRE(stuck);
    CHECK(stuck->rank == 1);
    CHECK_THAT(stuck->cause, Catch::StartsWith("training failed: rank 1 on " + this_host() + " made no progress for ") &&
                                 Catch::Contains("; the driver stopped the group; first error: rank 1 made no progress: "
                                                 "last progress at batch #3 of an epoch (ctx.shard); its heartbeat goes on"));
    CHECK_THAT(stuck->cause, !Catch::Contains("(and rank 0"));
  }
  SECTION("every rank stuck: both named, rank 0 first") {
    const auto stuck = stuck_within(4s, false);
    REQUIRE(stuck);
    CHECK(stuck->rank == 0);
    CHECK_THAT(stuck->cause, Catch::Contains("(and rank 1 on " + this_host() + " for "));
  }
  SECTION("a rank that has ended is not watched") {
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < 3500ms) {  // past the timeout and its margin
      REQUIRE_FALSE(watchdog.check([](int) { return false; }));
      std::this_thread::sleep_for(20ms);
    }
    CHECK(stuck_within(1500ms, false));  // while running, the same ranks are found
  }
}

TEST_CASE("Heartbeat and ProgressWatchdog: a progress_timeout of 0 watches nothing", "[heartbeat][progress]") {
  auto store = d::launch::host_store("127.0.0.1", 0, 10s);
  d::launch::Heartbeat waiter(rank_of(0, 2, store->getPort()), *store, 0ms, 0ms);
  d::launch::ProgressWatchdog watchdog(*store, 0, 2, 0ms);
  d::mark_progress("report() call #", 1);
  const auto [error, took] = watch_until_thrown(waiter, *store, 300ms);
  CHECK_FALSE(error);
  CHECK_FALSE(watchdog.check([](int) { return true; }));
}
