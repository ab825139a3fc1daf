// SPDX-License-Identifier: Apache-2.0
// The parts of dtrain that need no tensors: samplers, metrics and their history, configuration.

#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/config.hpp>
#include <dtrain/detail/shm_allreduce.hpp>
#include <dtrain/error.hpp>
#include <dtrain/launch/elastic.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/process.hpp>
#include <dtrain/launch/restarts.hpp>
#include <dtrain/launch/worker_threads.hpp>
#include <dtrain/memory.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/result.hpp>
#include <dtrain/sampler/distributed.hpp>
#include <dtrain/sampler/sequential.hpp>

#include "support.hpp"

namespace fs = std::filesystem;
using dtrain_test::MessageContains;
using dtrain_test::TempDir;
using Indices = std::vector<std::int64_t>;

namespace {

Indices iota_indices(std::int64_t n) {
  Indices v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), std::int64_t{0});
  return v;
}

/// Every rank's indices for one epoch.
template <class Sampler>
std::vector<Indices> all_ranks(std::int64_t n, int world, std::int64_t epoch = 0) {
  std::vector<Indices> out;
  for (int r = 0; r < world; ++r) out.push_back(Sampler::indices(n, r, world, epoch));
  return out;
}

using dtrain_test::slurp;

}  // namespace

// ---------------------------------------------------------------------------------------------------
// sampler::distributed<>

TEST_CASE("distributed: the permutation is a function of (seed, epoch) alone", "[sampler]") {
  using S = dtrain::sampler::distributed<42>;
  const auto a = S::indices(1000, 0, 1, 3);
  CHECK(a == S::indices(1000, 0, 1, 3));

  // A permutation of 0..n-1, and a shuffled one.
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == iota_indices(1000));
  CHECK(a != iota_indices(1000));
}

TEST_CASE("distributed: the rest of an epoch dealt from an offset to another count covers it once", "[sampler][elastic]") {
  using S = dtrain::sampler::distributed<7>;
  const std::int64_t n = 1008;
  std::vector<int> seen(n, 0);
  // 6 global batches of 48 under 3 ranks, then 6 under 2, then the rest under 3.
  for (int r = 0; r < 3; ++r) {
    const auto mine = S::indices(n, r, 3, 4);
    for (std::int64_t k = 0; k < 6 * 16; ++k) ++seen[static_cast<std::size_t>(mine[static_cast<std::size_t>(k)])];
  }
  for (int r = 0; r < 2; ++r) {
    const auto mine = S::indices_from(288, n, r, 2, 4);
    REQUIRE(mine.size() == static_cast<std::size_t>((n - 288) / 2));
    for (std::int64_t k = 0; k < 6 * 24; ++k) ++seen[static_cast<std::size_t>(mine[static_cast<std::size_t>(k)])];
  }
  for (int r = 0; r < 3; ++r)
    for (const auto i : S::indices_from(576, n, r, 3, 4)) ++seen[static_cast<std::size_t>(i)];
  CHECK(std::count(seen.begin(), seen.end(), 1) == n);
  CHECK(S::indices_from(0, n, 1, 3, 4) == S::indices(n, 1, 3, 4));
  CHECK_THROWS_WITH(S::indices_from(n + 1, n, 0, 2, 4), Catch::Contains("sample offset 1009 is outside [0, 1008]"));
}

TEST_CASE("distributed: the permutation is the same in every run and standard library", "[sampler]") {
  // mt19937_64 and the Fisher-Yates loop are fully specified, so these values must never change:
  // a run resumed on another machine, or built with another compiler, must draw the same samples.
  using D = dtrain::sampler::distributed<>;
  CHECK(D::indices(10, 0, 1, 0) == Indices{7, 1, 0, 6, 4, 3, 2, 9, 8, 5});
  CHECK(D::indices(10, 0, 1, 1) == Indices{5, 7, 9, 6, 2, 3, 1, 8, 4, 0});
  CHECK(dtrain::sampler::distributed<7>::indices(10, 0, 1, 0) == Indices{6, 7, 0, 5, 8, 1, 4, 9, 2, 3});
}

TEST_CASE("distributed: a new permutation every epoch, and another for another seed", "[sampler]") {
  using S = dtrain::sampler::distributed<42>;
  std::set<Indices> epochs;
  for (std::int64_t e = 0; e < 10; ++e) epochs.insert(S::indices(1000, 0, 1, e));
  CHECK(epochs.size() == 10);

  for (std::int64_t e = 0; e < 3; ++e) {
    CHECK(dtrain::sampler::distributed<1>::indices(1000, 0, 1, e) !=
          dtrain::sampler::distributed<2>::indices(1000, 0, 1, e));
    // A rank's share changes too, not only the whole permutation.
    CHECK(S::indices(1000, 1, 4, e) != S::indices(1000, 1, 4, e + 1));
  }
}

TEST_CASE("distributed: rank r takes positions r, r + world, ... of the epoch's permutation",
          "[sampler]") {
  using S = dtrain::sampler::distributed<5, true, dtrain::sampler::tail::drop>;
  const auto whole = S::indices(24, 0, 1, 2);
  for (int r = 0; r < 3; ++r) {
    const auto mine = S::indices(24, r, 3, 2);
    REQUIRE(mine.size() == 8);
    for (std::size_t k = 0; k < mine.size(); ++k) CHECK(mine[k] == whole[k * 3 + r]);
  }
}

TEST_CASE("distributed: when world divides n, the ranks partition the dataset", "[sampler]") {
  using namespace dtrain::sampler;
  auto check_partition = [](const std::vector<Indices>& ranks, std::int64_t n) {
    Indices all;
    for (const auto& r : ranks) {
      CHECK(static_cast<std::int64_t>(r.size()) == n / static_cast<std::int64_t>(ranks.size()));
      all.insert(all.end(), r.begin(), r.end());
    }
    std::sort(all.begin(), all.end());
    CHECK(all == iota_indices(n));  // disjoint (no duplicate) and covering (every index)
  };
  for (std::int64_t epoch : {0, 1, 7}) {
    check_partition(all_ranks<distributed<3, true, tail::drop>>(100, 4, epoch), 100);
    check_partition(all_ranks<distributed<3, true, tail::pad>>(100, 4, epoch), 100);
    check_partition(all_ranks<distributed<3, true, tail::drop>>(60, 6, epoch), 60);
  }
}

TEST_CASE("distributed<tail::pad>: ceil(n / world) each, every sample at least once", "[sampler]") {
  using S = dtrain::sampler::distributed<9, true, dtrain::sampler::tail::pad>;
  for (auto [n, world] : {std::pair{10, 4}, {101, 4}, {7, 3}, {3, 8}}) {
    CAPTURE(n, world);
    const std::int64_t per_rank = (n + world - 1) / world;
    CHECK(S::samples_per_rank(n, world) == per_rank);
    std::vector<int> seen(static_cast<std::size_t>(n), 0);
    for (const auto& r : all_ranks<S>(n, world, 1)) {
      CHECK(static_cast<std::int64_t>(r.size()) == per_rank);
      for (auto i : r) {
        REQUIRE((i >= 0 && i < n));
        ++seen[static_cast<std::size_t>(i)];
      }
    }
    const auto [least, most] = std::minmax_element(seen.begin(), seen.end());
    CHECK(*least >= 1);
    // The padding wraps around the permutation, so no sample is repeated more than another.
    CHECK(*most - *least <= 1);
  }
}

TEST_CASE("distributed<tail::drop>: floor(n / world) each, no sample twice", "[sampler]") {
  using S = dtrain::sampler::distributed<9, true, dtrain::sampler::tail::drop>;
  for (auto [n, world] : {std::pair{10, 4}, {101, 4}, {7, 3}, {3, 8}}) {
    CAPTURE(n, world);
    CHECK(S::samples_per_rank(n, world) == n / world);
    std::set<std::int64_t> seen;
    std::size_t total = 0;
    for (const auto& r : all_ranks<S>(n, world, 1)) {
      CHECK(static_cast<std::int64_t>(r.size()) == n / world);
      seen.insert(r.begin(), r.end());
      total += r.size();
    }
    CHECK(seen.size() == total);
    CHECK(static_cast<std::int64_t>(total) == n - n % world);
  }
}

TEST_CASE("distributed<Seed, false>: no shuffle, the dataset's order strided over ranks", "[sampler]") {
  using namespace dtrain::sampler;
  using Drop = distributed<42, false, tail::drop>;
  using Pad = distributed<42, false, tail::pad>;
  for (std::int64_t epoch : {0, 5}) {
    CHECK(Drop::indices(10, 0, 1, epoch) == iota_indices(10));
    CHECK(Drop::indices(10, 0, 3, epoch) == Indices{0, 3, 6});
    CHECK(Drop::indices(10, 1, 3, epoch) == Indices{1, 4, 7});
    CHECK(Drop::indices(10, 2, 3, epoch) == Indices{2, 5, 8});
    // Padding repeats the start of the order, as PyTorch's DistributedSampler does.
    CHECK(Pad::indices(10, 1, 3, epoch) == Indices{1, 4, 7, 0});
    CHECK(Pad::indices(10, 2, 3, epoch) == Indices{2, 5, 8, 1});
  }
}

TEST_CASE("distributed: a rank below 0 or not below world_size is a ConfigError", "[sampler][error]") {
  using S = dtrain::sampler::distributed<>;
  REQUIRE_THROWS_MATCHES(S::indices(10, 4, 4, 0), dtrain::ConfigError,
                         MessageContains({"rank 4", "world_size = 4"}));
  REQUIRE_THROWS_MATCHES(S::indices(10, -1, 4, 0), dtrain::ConfigError, MessageContains({"rank -1"}));
  REQUIRE_THROWS_AS(S::indices(10, 0, 0, 0), dtrain::ConfigError);
  REQUIRE_THROWS_AS(S::samples_per_rank(10, 0), dtrain::ConfigError);
}

// ---------------------------------------------------------------------------------------------------
// sampler::sequential

TEST_CASE("sequential: contiguous blocks whose concatenation is 0..n-1 in order", "[sampler]") {
  using S = dtrain::sampler::sequential;
  for (auto [n, world] : {std::pair{10, 3}, {12, 4}, {2, 4}, {101, 7}, {0, 2}, {5, 1}}) {
    CAPTURE(n, world);
    Indices concatenated;
    std::size_t smallest = std::numeric_limits<std::size_t>::max(), largest = 0;
    for (int r = 0; r < world; ++r) {
      const auto mine = S::indices(n, r, world, /*epoch=*/3);
      CHECK(static_cast<std::int64_t>(mine.size()) == S::samples_per_rank(n, world, r));
      smallest = std::min(smallest, mine.size());
      largest = std::max(largest, mine.size());
      concatenated.insert(concatenated.end(), mine.begin(), mine.end());
    }
    CHECK(concatenated == iota_indices(n));
    CHECK(largest - smallest <= 1);
  }
  // The first n % world ranks hold the extra sample.
  CHECK(S::indices(10, 0, 3, 0) == Indices{0, 1, 2, 3});
  CHECK(S::indices(10, 1, 3, 0) == Indices{4, 5, 6});
  CHECK(S::indices(10, 2, 3, 0) == Indices{7, 8, 9});
  // No shuffling: every epoch is the same.
  CHECK(S::indices(10, 1, 3, 0) == S::indices(10, 1, 3, 9));
}

TEST_CASE("sequential: a rank below 0 or not below world_size is a ConfigError", "[sampler][error]") {
  using S = dtrain::sampler::sequential;
  REQUIRE_THROWS_MATCHES(S::indices(10, 3, 3, 0), dtrain::ConfigError, MessageContains({"rank 3"}));
  REQUIRE_THROWS_AS(S::indices(10, -1, 3, 0), dtrain::ConfigError);
  REQUIRE_THROWS_AS(S::samples_per_rank(10, 0), dtrain::ConfigError);
}

// ---------------------------------------------------------------------------------------------------
// Metric

TEST_CASE("Metric keeps the kind and the value it was built from", "[metrics]") {
  using dtrain::Metric;
  SECTION("integers stay exact int64") {
    const Metric i = 3, s = std::size_t{7}, big = std::int64_t{1} << 62 | 1, b = true, f = false;
    for (const auto* m : {&i, &s, &big, &b, &f}) {
      CHECK(m->is_number());
      CHECK(m->is_integer());
    }
    CHECK(std::get<std::int64_t>(i.value()) == 3);
    CHECK(std::get<std::int64_t>(s.value()) == 7);
    CHECK(std::get<std::int64_t>(big.value()) == (std::int64_t{1} << 62 | 1));
    CHECK(b.number() == 1.0);
    CHECK(f.number() == 0.0);
  }
  SECTION("floating point becomes double") {
    const Metric f = 0.25f, d = 0.1;
    for (const auto* m : {&f, &d}) {
      CHECK(m->is_number());
      CHECK_FALSE(m->is_integer());
    }
    CHECK(f.number() == 0.25);
    CHECK(std::get<double>(d.value()) == 0.1);
  }
  SECTION("text stays text, and number() refuses it") {
    const Metric c = "adam", s = std::string("sgd, momentum");
    for (const auto* m : {&c, &s}) {
      CHECK_FALSE(m->is_number());
      CHECK_FALSE(m->is_integer());
    }
    CHECK(c.text() == "adam");
    CHECK(std::get<std::string>(s.value()) == "sgd, momentum");
    REQUIRE_THROWS_MATCHES(c.number(), dtrain::ConfigError, MessageContains({"adam", "not a number"}));
  }
  SECTION("a Metrics map takes mixed values without casts") {
    const int epoch = 2;
    const float loss = 0.5f;
    const dtrain::Metrics m = {{"epoch", epoch}, {"loss", loss}, {"optimizer", "adam"}};
    CHECK(m.at("epoch").is_integer());
    CHECK(m.at("loss").number() == 0.5);
    CHECK(m.at("optimizer").text() == "adam");
  }
}

TEST_CASE("Metric and Metrics round-trip through JSON", "[metrics][json]") {
  const dtrain::Metrics row = {{"epoch", 4},
                               {"loss", 0.1},
                               {"big", std::int64_t{1} << 62 | 1},
                               {"neg", -7},
                               {"name", "run \"a\", b"}};
  const std::string text = nlohmann::json(row).dump();
  const auto back = nlohmann::json::parse(text).get<dtrain::Metrics>();
  CHECK(back == row);
  // Kinds survive: an integer is not read back as a real.
  CHECK(back.at("epoch").is_integer());
  CHECK_FALSE(back.at("loss").is_integer());
  CHECK_FALSE(back.at("name").is_number());
}

TEST_CASE("Metric: NaN is written as JSON null and read back as NaN", "[metrics][json]") {
  const dtrain::Metric nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(nlohmann::json(nan).dump() == "null");
  const auto back = nlohmann::json::parse("null").get<dtrain::Metric>();
  CHECK(back.is_number());
  CHECK_FALSE(back.is_integer());
  CHECK(std::isnan(back.number()));

  const auto row = nlohmann::json::parse(nlohmann::json(dtrain::Metrics{{"loss", nan}}).dump())
                       .get<dtrain::Metrics>();
  CHECK(std::isnan(row.at("loss").number()));
}

TEST_CASE("Metric: JSON values that are neither number nor text are a ConfigError", "[metrics][json]") {
  REQUIRE_THROWS_AS(nlohmann::json::parse("true").get<dtrain::Metric>(), dtrain::ConfigError);
  REQUIRE_THROWS_AS(nlohmann::json::parse("[1, 2]").get<dtrain::Metric>(), dtrain::ConfigError);
}

// ---------------------------------------------------------------------------------------------------
// MetricsHistory

TEST_CASE("MetricsHistory: append_jsonl then read_jsonl gives the rows back", "[metrics][result]") {
  TempDir dir;
  const auto path = dir / "metrics.jsonl";
  const std::vector<dtrain::Metrics> rows = {
      {{"epoch", 0}, {"loss", 2.5}},
      {{"epoch", 1}, {"loss", 1.25}, {"accuracy", 0.5}},
      {{"note", "done, \"ok\""}, {"loss", std::numeric_limits<double>::quiet_NaN()}},
  };
  for (const auto& r : rows) dtrain::MetricsHistory::append_jsonl(path, r);

  const auto h = dtrain::MetricsHistory::read_jsonl(path);
  REQUIRE(h.size() == 3);
  CHECK(h[0] == rows[0]);
  CHECK(h[1] == rows[1]);
  CHECK(h[2].at("note") == rows[2].at("note"));
  CHECK(std::isnan(h[2].at("loss").number()));

  CHECK(h.columns() == std::vector<std::string>{"accuracy", "epoch", "loss", "note"});
  const auto acc = h.column("accuracy");
  REQUIRE(acc.size() == 3);
  CHECK(std::isnan(acc[0]));
  CHECK(acc[1] == 0.5);
  CHECK(std::isnan(acc[2]));
  // Text in a column reads as NaN, not as an error.
  CHECK(std::isnan(h.column("note")[2]));
}

TEST_CASE("MetricsHistory::read_jsonl: a missing file is an empty history", "[metrics][result]") {
  TempDir dir;
  const auto h = dtrain::MetricsHistory::read_jsonl(dir / "never-written.jsonl");
  CHECK(h.empty());
  CHECK(h.columns().empty());
}

TEST_CASE("MetricsHistory::read_jsonl: a malformed line is an Error naming the path and line",
          "[metrics][result][error]") {
  TempDir dir;
  const auto path = dir / "metrics.jsonl";
  SECTION("not JSON") {
    // Line 3 is bad; the blank line 2 still counts.
    std::ofstream(path) << "{\"epoch\": 0}\n\n{\"epoch\": 1,\n{\"epoch\": 2}\n";
    REQUIRE_THROWS_MATCHES(dtrain::MetricsHistory::read_jsonl(path), dtrain::Error,
                           MessageContains({path.string() + ":3:", "not a metrics row"}));
  }
  SECTION("JSON, but not an object") {
    std::ofstream(path) << "{\"epoch\": 0}\n[1, 2]\n";
    REQUIRE_THROWS_MATCHES(dtrain::MetricsHistory::read_jsonl(path), dtrain::Error,
                           MessageContains({path.string() + ":2:", "not a metrics row"}));
  }
}

TEST_CASE("MetricsHistory::read_jsonl: a row with a non-metric value names the path and line",
          "[metrics][result][error]") {
  TempDir dir;
  const auto path = dir / "metrics.jsonl";
  std::ofstream(path) << "{\"epoch\": 0}\n{\"done\": true}\n";
  REQUIRE_THROWS_MATCHES(dtrain::MetricsHistory::read_jsonl(path), dtrain::Error,
                         MessageContains({path.string() + ":2:"}));
}

TEST_CASE("MetricsHistory::write_csv: sorted union of columns, empty cells, quoted text",
          "[metrics][result]") {
  TempDir dir;
  const auto path = dir / "metrics.csv";
  const dtrain::MetricsHistory h({
      {{"loss", 0.5}, {"epoch", 0}},
      {{"epoch", 1}, {"accuracy", 0.9}, {"note", "a,b"}},
      {{"note", "say \"hi\""}},
      {{"note", "two\nlines"}, {"epoch", 2}},
  });
  h.write_csv(path);
  CHECK(slurp(path) ==
        "accuracy,epoch,loss,note\n"
        ",0,0.5,\n"
        "0.9,1,,\"a,b\"\n"
        ",,,\"say \"\"hi\"\"\"\n"
        ",2,,\"two\nlines\"\n");

  // Writing again replaces the file rather than appending to it.
  h.write_csv(path);
  const auto again = slurp(path);
  CHECK(std::count(again.begin(), again.end(), '\n') == 6);
}

// ---------------------------------------------------------------------------------------------------
// ScalingConfig and RunConfig

TEST_CASE("ScalingConfig::validate rejects fewer than one worker or thread", "[config][error]") {
  CHECK_NOTHROW(dtrain::ScalingConfig{}.validate());
  CHECK_NOTHROW(dtrain::ScalingConfig{4, 2}.validate());

  REQUIRE_THROWS_MATCHES((dtrain::ScalingConfig{0, 1}.validate()), dtrain::ConfigError,
                         MessageContains({"num_workers", "0", "at least 1"}));
  REQUIRE_THROWS_MATCHES((dtrain::ScalingConfig{-2, 1}.validate()), dtrain::ConfigError,
                         MessageContains({"num_workers", "-2"}));
  REQUIRE_THROWS_MATCHES((dtrain::ScalingConfig{1, 0}.validate()), dtrain::ConfigError,
                         MessageContains({"threads_per_worker", "0", "at least 1"}));
}

TEST_CASE("ScalingConfig::min_workers must lie in 1..num_workers", "[config][error][elastic]") {
  CHECK_FALSE(dtrain::ScalingConfig{.num_workers = 3}.elastic());
  CHECK(dtrain::ScalingConfig{.num_workers = 3}.minimum_workers() == 3);
  CHECK(dtrain::ScalingConfig{.num_workers = 3, .min_workers = 2}.elastic());
  CHECK_NOTHROW(dtrain::ScalingConfig{.num_workers = 3, .min_workers = 3}.validate());
  REQUIRE_THROWS_MATCHES((dtrain::ScalingConfig{.num_workers = 2, .min_workers = 3}.validate()), dtrain::ConfigError,
                         MessageContains({"min_workers is 3 with num_workers 2", "1 <= min_workers <= num_workers"}));
  REQUIRE_THROWS_MATCHES((dtrain::ScalingConfig{.num_workers = 2, .min_workers = 0}.validate()), dtrain::ConfigError,
                         MessageContains({"min_workers is 0"}));
  REQUIRE_THROWS_MATCHES((dtrain::ScalingConfig{.num_workers = 2, .regrow_after_checkpoints = 0}.validate()),
                         dtrain::ConfigError, MessageContains({"regrow_after_checkpoints is 0", "at least 1"}));
  // An elastic range needs checkpoints, and optimizer state that is whole or that the Strategy
  // re-shards (fsdp<> does: both flags).
  const dtrain::ScalingConfig elastic{.num_workers = 3, .min_workers = 2};
  CHECK_NOTHROW(dtrain::launch::check_elastic(dtrain::ScalingConfig{.num_workers = 3}, false, true));
  REQUIRE_THROWS_MATCHES(dtrain::launch::check_elastic(elastic, false, false), dtrain::ConfigError,
                         MessageContains({"checkpointer::directory<>"}));
  REQUIRE_THROWS_MATCHES(dtrain::launch::check_elastic(elastic, true, true), dtrain::ConfigError,
                         MessageContains({"cannot re-shard", "strategy::ddp<>", "strategy::fsdp<>"}));
  CHECK_NOTHROW(dtrain::launch::check_elastic(elastic, true, true, true));
  CHECK_NOTHROW(dtrain::launch::check_elastic(elastic, true, false));
}

TEST_CASE("ElasticSize: the same rank failing twice with no newer checkpoint shrinks the group to min_workers at most", "[elastic]") {
  dtrain::launch::ElasticSize sizes(dtrain::ScalingConfig{.num_workers = 4, .min_workers = 2});
  CHECK(sizes.size() == 4);
  CHECK(sizes.after_failure(3, 10) == "restart");  // a first failure: restart at the same size
  CHECK(sizes.after_failure(1, 10) == "restart");  // another rank: not the same worker
  CHECK(sizes.after_failure(1, 20) == "restart");  // a newer checkpoint between: it came back
  CHECK(sizes.after_failure(1, 20) == "shrink");
  CHECK(sizes.size() == 3);
  CHECK(sizes.after_failure(2, 20) == "restart");  // the smaller group counts afresh
  CHECK(sizes.after_failure(2, 20) == "shrink");
  CHECK(sizes.size() == 2);
  CHECK(sizes.after_failure(0, 20) == "restart");
  CHECK(sizes.after_failure(0, 20) == "restart");  // at min_workers: restarts at that size
  CHECK(sizes.size() == 2);
  CHECK(sizes.after_regroup() == "grow");
  CHECK(sizes.size() == 4);
  dtrain::launch::ElasticSize fixed(dtrain::ScalingConfig{.num_workers = 2});
  CHECK(fixed.after_failure(1, 0) == "restart");
  CHECK(fixed.after_failure(1, 0) == "restart");
  CHECK(fixed.size() == 2);
}

namespace {
long threads_of_this_process() {
  long n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}
}  // namespace

TEST_CASE("A worker forked under BlasThreadsForWorkers starts no OpenBLAS threads of its own", "[threads]") {
  using namespace dtrain::launch;
  if (blas_threads() == 0) {
    WARN("LibTorch does not use OpenBLAS here: nothing to check");
    return;
  }
  const int before_all = blas_threads();
  set_blas_threads(2);  // the driver's pool, as without OPENBLAS_NUM_THREADS on 2 cores
  const auto a = torch::rand({256, 256});
  (void)torch::mm(a, a);
  for (const bool guarded : {true, false}) {
    INFO("guarded " << guarded);
    std::optional<BlasThreadsForWorkers> blas;
    if (guarded) blas.emplace(1);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // the worker: its threads before and after set_worker_threads and a matmul
      const long before = threads_of_this_process();
      set_worker_threads(1);
      (void)torch::mm(a, a);
      const long started = threads_of_this_process() - before;
      ::_exit(static_cast<int>(std::min(started, 9L)) * 10 + blas_threads());
    }
    blas.reset();
    CHECK(blas_threads() == 2);  // the driver's count is back
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) % 10 == 1);  // the worker's count is 1 either way
    // Unguarded, OpenBLAS re-creates its pool in the forked worker (the threads that spin ~0.1 s
    // at start); guarded, no thread starts.
    if (guarded) CHECK(WEXITSTATUS(status) / 10 == 0);
    else CHECK(WEXITSTATUS(status) / 10 > 0);
  }
  set_blas_threads(before_all);
}

TEST_CASE("OpenBLAS's generic kernel on a CPU with AVX2 or AVX-512 gets the OPENBLAS_CORETYPE that fixes it", "[threads]") {
  using dtrain::launch::blas_kernel_fix;
  CHECK(blas_kernel_fix("Prescott", false, true, true) == "SkylakeX");
  CHECK(blas_kernel_fix("Prescott", false, false, true) == "Haswell");
  CHECK(blas_kernel_fix("Prescott", false, false, false).empty());  // an old CPU: Prescott is its kernel
  CHECK(blas_kernel_fix("Prescott", true, true, true).empty());     // the user chose it
  CHECK(blas_kernel_fix("SkylakeX", false, true, true).empty());
  CHECK(blas_kernel_fix("Haswell", false, true, true).empty());
  CHECK(blas_kernel_fix("", false, true, true).empty());  // no OpenBLAS
  // Where the test binary's LibTorch calls Debian's OpenBLAS (libblas.so.3 of openblas-pthread,
  // scripts/install-deps), its kernel has a name; PyPI's LibTorch brings a BLAS of its own.
  std::ifstream maps("/proc/self/maps");
  const std::string mapped{std::istreambuf_iterator<char>(maps), std::istreambuf_iterator<char>()};
  const auto kernel = dtrain::launch::blas_kernel();
  INFO("OpenBLAS kernel " << kernel);
  if (mapped.find("openblas") != std::string::npos) CHECK_FALSE(kernel.empty());
}

TEST_CASE("Restarts: max_failures and max_repeated_failures decide which failed group ends the run", "[restarts]") {
  using resumed = std::optional<std::pair<std::int64_t, std::int64_t>>;
  const auto cause = [](int rank) {
    return "training failed: rank " + std::to_string(rank) + " exited with status 1; first error: rank " +
           std::to_string(rank) + ": boom";
  };
  nlohmann::json past = nlohmann::json::array();
  dtrain::launch::Restarts two({.max_failures = 2, .max_repeated_failures = 3});
  CHECK_FALSE(two.failed(past, cause(1), 0, resumed({1, 10}), false));
  CHECK_FALSE(two.failed(past, cause(0), 1, resumed({1, 10}), false));  // another rank, the same failure
  const auto third = two.failed(past, "training failed: rank 1 was killed by signal 9", 2, resumed({2, 20}), false);
  REQUIRE(third);
  CHECK_THAT(*third, Catch::Contains("training failed 3 times") && Catch::Contains("attempt 0: ") &&
                         Catch::Contains("attempt 2: ") && Catch::Contains("max_failures = 2"));
  REQUIRE(past.size() == 3);
  CHECK(past[0]["resumed_step"] == 10);
  CHECK(past[0]["attempt"] == 0);
  CHECK(past[2]["resumed_step"].is_null());  // no group resumed after the last one

  past = nlohmann::json::array();
  dtrain::launch::Restarts unlimited({.max_failures = -1, .max_repeated_failures = 3});
  CHECK_FALSE(unlimited.failed(past, cause(0), 0, resumed({1, 10}), false));
  CHECK_FALSE(unlimited.failed(past, cause(1), 1, resumed({1, 10}), false));
  CHECK_FALSE(unlimited.failed(past, cause(0), 2, resumed({2, 20}), false));  // progress: counts afresh
  CHECK_FALSE(unlimited.failed(past, cause(0), 3, resumed({2, 20}), false));
  const auto stuck = unlimited.failed(past, cause(1), 4, resumed({2, 20}), false);
  REQUIRE(stuck);
  CHECK_THAT(*stuck, Catch::Contains("the same failure from the same checkpoint step 3 times") &&
                         Catch::Contains("max_repeated_failures = 3"));

  past = nlohmann::json::array();
  dtrain::launch::Restarts config({.max_failures = 5});
  const auto bad = config.failed(past, cause(0), 0, std::nullopt, /*config_error=*/true);
  REQUIRE(bad);
  CHECK_THAT(*bad, Catch::Contains("boom") && Catch::Contains("not restarted: a configuration error"));
  CHECK(config.count() == 1);
}

TEST_CASE("RunConfig::validate wants a single non-empty directory name", "[config][error]") {
  dtrain::RunConfig c;
  CHECK_NOTHROW(c.validate());
  c.storage_path = "/tmp/runs";
  c.name = "exp-1";
  CHECK_NOTHROW(c.validate());
  CHECK(c.path() == fs::path("/tmp/runs/exp-1"));

  for (const std::string bad : {"", "a/b", "/abs", "trailing/", ".", ".."}) {
    CAPTURE(bad);
    c.name = bad;
    REQUIRE_THROWS_MATCHES(c.validate(), dtrain::ConfigError,
                           MessageContains({"RunConfig::name", "\"" + bad + "\"", "'/'"}));
  }
}

TEST_CASE("RunConfig::validate wants positive timeouts", "[config][error]") {
  dtrain::RunConfig c;
  c.rendezvous_timeout = std::chrono::milliseconds(0);
  REQUIRE_THROWS_MATCHES(c.validate(), dtrain::ConfigError, MessageContains({"rendezvous_timeout"}));
  c = {};
  c.collective_timeout = std::chrono::milliseconds(-1);
  REQUIRE_THROWS_MATCHES(c.validate(), dtrain::ConfigError, MessageContains({"collective_timeout"}));
}

TEST_CASE("FailureConfig::validate takes progress_timeout 0 (off) or positive and names it otherwise", "[config][error][progress]") {
  dtrain::FailureConfig f;
  CHECK(f.progress_timeout == std::chrono::milliseconds(0));  // off unless set: see docs/multi-host.md
  f.progress_timeout = std::chrono::minutes(10);
  CHECK_NOTHROW(f.validate());
  f.progress_timeout = std::chrono::milliseconds(-1);
  REQUIRE_THROWS_MATCHES(f.validate(), dtrain::ConfigError,
                         MessageContains({"FailureConfig::progress_timeout is -1 ms", "use 0 (off) or a positive time"}));
  dtrain::RunConfig run;  // RunConfig::validate checks its FailureConfig
  run.failure.progress_timeout = std::chrono::milliseconds(-5);
  REQUIRE_THROWS_MATCHES(run.validate(), dtrain::ConfigError, MessageContains({"progress_timeout is -5 ms"}));
}

TEST_CASE("process_start_unix gives a new process's start within 50 ms", "[launch]") {
  // startup_s (the example's and the benchmarks') counts from this moment, so a whole-second
  // boot time (/proc/stat's btime) would add up to a second to it.
  auto unix_now = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const double before = unix_now();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const double start = dtrain::launch::process_start_unix();
    (void)!write(fds[1], &start, sizeof start);
    _exit(0);
  }
  double start = 0;
  REQUIRE(read(fds[0], &start, sizeof start) == static_cast<ssize_t>(sizeof start));
  const double after = unix_now();
  waitpid(child, nullptr, 0);
  close(fds[0]);
  close(fds[1]);
  INFO("before " << before << " start " << start << " after " << after);
  CHECK(start >= before - 0.05);  // the kernel's start time has 10 ms ticks
  CHECK(start <= after + 0.05);
}

namespace {
// In a forked child: glibc's default thresholds, then `setup`; then a 24 MiB block allocated,
// written and freed 5 times, as an evaluation batch's activations are. Returns the page faults of
// the last 4 rounds (the first may fault wherever the block lands).
template <class Setup>
long faults_of_reallocating(Setup setup) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::mallopt(M_MMAP_THRESHOLD, 128 * 1024);  // glibc's defaults, fixed, whatever this process did
    ::mallopt(M_TRIM_THRESHOLD, 128 * 1024);
    setup();
    constexpr std::size_t size = 24u << 20;
    long before = 0;
    for (int round = 0; round < 5; ++round) {
      if (round == 1) {
        rusage u{};
        getrusage(RUSAGE_SELF, &u);
        before = u.ru_minflt;
      }
      auto* block = static_cast<volatile char*>(std::malloc(size));
      for (std::size_t i = 0; i < size; i += 4096) block[i] = 1;
      std::free(const_cast<char*>(block));
    }
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    const long faults = u.ru_minflt - before;
    (void)!write(fds[1], &faults, sizeof faults);
    _exit(0);
  }
  long faults = -1;
  REQUIRE(read(fds[0], &faults, sizeof faults) == static_cast<ssize_t>(sizeof faults));
  waitpid(child, nullptr, 0);
  close(fds[0]);
  close(fds[1]);
  return faults;
}
}  // namespace

TEST_CASE("retain_freed_memory keeps a freed block for the next batch - fit()'s default yields to the user's choice",
          "[launch]") {
  const long pages = 4 * ((24 << 20) / 4096);  // what 4 rounds fault when each maps the block anew
  const long defaults = faults_of_reallocating([] {});
  // In the child a failed call ends it without an answer, which the parent's REQUIRE on the pipe reports.
  const long retained = faults_of_reallocating([] {
    if (!dtrain::retain_freed_memory()) _exit(3);
  });
  const long fit_default = faults_of_reallocating([] { dtrain::retain_freed_memory_by_default(); });
  const long tunables_set = faults_of_reallocating([] {
    setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=131072", 1);
    dtrain::retain_freed_memory_by_default();
  });
  const long called_before = faults_of_reallocating([] {
    dtrain::retain_freed_memory(128 * 1024, 128 * 1024);  // the program's own values (glibc's defaults)
    dtrain::retain_freed_memory_by_default();
  });
  INFO("page faults over 4 rounds: glibc's defaults " << defaults << ", retained " << retained << ", fit()'s default "
                                                       << fit_default << ", GLIBC_TUNABLES set " << tunables_set
                                                       << ", the program's call first " << called_before
                                                       << " (a round is " << pages / 4 << " pages)");
  CHECK(defaults > pages * 9 / 10);
  CHECK(retained < pages / 10);
  CHECK(fit_default < pages / 10);
  CHECK(tunables_set > pages * 9 / 10);   // the user's setting is left alone
  CHECK(called_before > pages * 9 / 10);  // and so are the program's own values
}

TEST_CASE("Slurm's per-node task list gives each node its count", "[launch]") {
  using dtrain::launch::detail::slurm_tasks_on_node;
  CHECK(slurm_tasks_on_node("2(x2)", 0) == 2);
  CHECK(slurm_tasks_on_node("2(x2)", 1) == 2);
  CHECK(slurm_tasks_on_node("4", 0) == 4);
  CHECK(slurm_tasks_on_node("3(x2),1", 1) == 3);
  CHECK(slurm_tasks_on_node("3(x2),1", 2) == 1);
  CHECK(slurm_tasks_on_node("1,2,3", 2) == 3);
  CHECK_THROWS_WITH(slurm_tasks_on_node("2(x2)", 2), Catch::Contains("no task count for node 2"));
  CHECK_THROWS_AS(slurm_tasks_on_node("", 0), dtrain::ConfigError);
}


TEST_CASE("shared-memory barrier: the spin is long only when every rank's threads have a core", "[collective]") {
  using dtrain::detail::shm_channel;
  unsetenv("DTRAIN_SHM_SPIN_US");
  torch::set_num_threads(1);
  CHECK(shm_channel::spin_budget(1) == std::chrono::milliseconds(1));
  // More ranks than this process has CPUs: a spinning rank would take a core its peer needs.
  CHECK(shm_channel::spin_budget(1 << 20) == std::chrono::nanoseconds(0));

  setenv("DTRAIN_SHM_SPIN_US", "250", 1);
  CHECK(shm_channel::spin_budget(1 << 20) == std::chrono::microseconds(250));
  for (const char* bad : {"abc", "-1", "12us", "10000001", "99999999999999999999999"}) {
    setenv("DTRAIN_SHM_SPIN_US", bad, 1);
    CHECK_THROWS_MATCHES(shm_channel::spin_budget(2), dtrain::ConfigError,
                         MessageContains({"DTRAIN_SHM_SPIN_US=\"" + std::string(bad) + "\"", "microseconds from 0 to 10000000"}));
  }
  unsetenv("DTRAIN_SHM_SPIN_US");
}

TEST_CASE("serial_tasks: a task submitted without waking the thread runs on the thread that waits for it - in order", "[collective]") {
  using dtrain::detail::serial_tasks;
  serial_tasks tasks;
  const auto me = std::this_thread::get_id();
  std::vector<int> order;
  std::thread::id woken_ran_on, unwoken_ran_on;

  // Woken: the executor's own thread runs it, while this thread does not wait.
  auto woken = tasks.submit([&] { woken_ran_on = std::this_thread::get_id(); order.push_back(1); });
  REQUIRE(woken.done.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  CHECK(woken_ran_on != me);

  // Not woken (runs::by_waiter): once the thread sleeps, nothing runs it until this thread waits,
  // then this thread does. (Submitted while the thread is still awake, it may run there.)
  for (int i = 0; i < 30000 && !tasks.idle(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(tasks.idle());
  auto unwoken = tasks.submit([&] { unwoken_ran_on = std::this_thread::get_id(); order.push_back(2); }, false);
  CHECK(unwoken.done.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout);
  unwoken.help();
  REQUIRE(unwoken.done.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
  CHECK(unwoken_ran_on == me);

  // Behind a woken task still running, an unwoken one keeps its place: the executor runs both.
  std::atomic<bool> release{false};
  auto slow = tasks.submit([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    order.push_back(3);
  });
  auto behind = tasks.submit([&] { order.push_back(4); }, false);
  release = true;
  REQUIRE(behind.done.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  slow.done.get();
  CHECK(order == std::vector<int>{1, 2, 3, 4});

  // stop() runs what is queued, woken or not, before the thread ends.
  bool ran = false;
  auto last = tasks.submit([&] { ran = true; }, false);
  tasks.stop();
  CHECK(ran);
  CHECK(last.done.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
}

TEST_CASE("serial_tasks: a waiter's task wakes the other threads that wait for it, and a stop() that waits for it", "[collective]") {
  using namespace std::chrono_literals;
  constexpr auto ready = std::future_status::ready;
  // A task submitted unwoken, which a waiter (`runner`) runs and holds until released.
  struct held {
    dtrain::detail::serial_tasks tasks;
    std::atomic<bool> taken{false}, release{false};
    dtrain::detail::pending_task task = tasks.submit(
        [this] {
          taken = true;
          while (!release) std::this_thread::sleep_for(1ms);
        },
        false);
    std::future<void> runner = std::async(std::launch::async, [this] { task.help(); });
    held() {
      while (!taken) std::this_thread::sleep_for(1ms);
    }
  };

  SECTION("a second thread waiting for the same task") {
    held h;
    auto second = std::async(std::launch::async, [&] { h.task.help(); });  // waits while the runner holds it
    std::this_thread::sleep_for(50ms);
    h.release = true;
    CHECK(h.runner.wait_for(30s) == ready);
    const bool returned = second.wait_for(30s) == ready;
    CHECK(returned);
    if (!returned) h.tasks.submit([] {}).done.wait();  // wakes it, so that a failure does not hang
  }

  SECTION("stop() called while a waiter runs the last task") {
    held h;
    auto stopping = std::async(std::launch::async, [&] { h.tasks.stop(); });
    std::this_thread::sleep_for(50ms);
    h.release = true;
    CHECK(h.runner.wait_for(30s) == ready);
    const bool stopped = stopping.wait_for(30s) == ready;
    CHECK(stopped);
    if (!stopped) h.tasks.submit([] {});  // wakes the thread, so that a failure does not hang
  }
}
