// SPDX-License-Identifier: Apache-2.0
#pragma once
// Laws of the Tracker concept (policy/concepts.hpp), checked for one model.
//
// Called directly, as the driver calls it (check_calls):
//   - start(run), heartbeat(run) (when the tracker has it) and end(run) do not throw for a
//     writable run directory, and end() does not throw without a start() before it (a driver that
//     crashed in between);
//   - a tracker writes only inside the run directory, and leaves no temporary file behind;
//   - what it writes of the run directory's own files (params.json, outcome.json) is what it was
//     last given: after start() the outcome is "running", after a heartbeat() the outcome with
//     its heartbeat_time, after end() the run's final outcome;
//   - nothing is written after end() returns: every file's contents and modification time are the
//     same a while later (no background writer outlives end()).
// Through a Trainer (check_driven): the driver calls start() once, before any worker reported,
// and end() exactly once, after the last report, for a finished run and for a failed one, and the
// run directory does not change after fit() returns.

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <dtrain/dtrain.hpp>

#include "../dtrain_catch.hpp"
#include "../unit/support.hpp"

namespace dtrain_laws::tracker {

namespace fs = std::filesystem;

/// Every file under `root`: its contents and modification time.
inline std::map<std::string, std::pair<std::string, fs::file_time_type>> files_under(const fs::path& root) {
  std::map<std::string, std::pair<std::string, fs::file_time_type>> out;
  if (!fs::exists(root)) return out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    out[fs::relative(e.path(), root).string()] = {std::move(text), fs::last_write_time(e.path())};
  }
  return out;
}

/// The run directory's shared files agree with `run` where the tracker wrote them.
inline void check_agrees(const fs::path& dir, const dtrain::tracking::RunRecord& run, bool params_too) {
  const auto read = dtrain::tracking::RunRecord::read(dir);
  if (!read.outcome.empty()) CHECK(read.outcome == run.outcome);
  if (params_too && !read.params.empty()) CHECK(read.params == run.params);
}

/// Waits, then checks that nothing under `storage` changed since `before`.
inline void check_still(const fs::path& storage,
                        const std::map<std::string, std::pair<std::string, fs::file_time_type>>& before) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto after = files_under(storage);
  CHECK(after.size() == before.size());
  for (const auto& [name, file] : after) {
    INFO(name << " after end()");
    REQUIRE(before.count(name));
    CHECK(before.at(name).first == file.first);
    CHECK(before.at(name).second == file.second);
  }
}

/// The direct-call laws for the Tracker policy T.
template <class T>
void check_calls() {
  dtrain_test::TempDir storage;
  const fs::path dir = storage / "run";
  fs::create_directories(dir);  // the driver creates it before start()
  dtrain::tracking::RunRecord run;
  run.path = dir;
  run.params = {{"format", 1}, {"scaling", {{"num_workers", 2}}}, {"train_loop_config", {{"lr", 0.1}}}};
  run.outcome = {{"format", 1}, {"status", "running"}, {"start_time", 1795311179.25}, {"end_time", nullptr},
                 {"restarts", 0}, {"failures", nlohmann::json::array()}, {"error", nullptr}};
  REQUIRE_NOTHROW(T::start(run));
  check_agrees(dir, run, true);
  // The driver's heartbeat, for a tracker that has one: it writes what it was given.
  if constexpr (requires { T::heartbeat(run); }) {
    run.outcome["heartbeat_time"] = 1795311179.4;
    run.outcome["heartbeat_interval_s"] = 10;
    REQUIRE_NOTHROW(T::heartbeat(run));
    check_agrees(dir, run, true);
  }
  // The workers' reports, as rank 0 writes them.
  {
    std::ofstream jsonl(dir / "metrics.jsonl");
    jsonl << R"({"iteration":1,"epoch":0,"step":10,"timestamp":1795311179.5,"loss":0.75})" "\n"
          << R"({"iteration":2,"epoch":1,"step":20,"timestamp":1795311179.75,"loss":0.5})" "\n";
  }
  auto ended = dtrain::tracking::RunRecord::read(dir);
  ended.params = run.params;
  ended.outcome = run.outcome;
  ended.outcome["status"] = "finished";
  ended.outcome["end_time"] = 1795311180.5;
  ended.outcome["reports"] = 2;
  REQUIRE_NOTHROW(T::end(ended));
  check_agrees(dir, ended, false);
  const auto after_end = files_under(storage.path());
  for (const auto& [name, file] : after_end) {
    INFO(name);
    // Inside the run directory, or the storage path's one MLflow store (RunDirectory::mlruns()).
    CHECK((name.rfind("run/", 0) == 0 || name.rfind("mlruns/", 0) == 0));
    CHECK(name.find(".tmp") == std::string::npos);
  }
  check_still(storage.path(), after_end);

  // end() alone, for a run that failed before the driver's start() was seen by anyone.
  const fs::path lone = storage / "lone";
  fs::create_directories(lone);
  dtrain::tracking::RunRecord failed;
  failed.path = lone;
  failed.outcome = {{"format", 1}, {"status", "failed"}, {"start_time", 1795311179.0}, {"end_time", 1795311179.5},
                    {"restarts", 0}, {"failures", nlohmann::json::array()}, {"error", "rank 1 was killed by signal 9"},
                    {"reports", 0}};
  REQUIRE_NOTHROW(T::end(failed));
  check_agrees(lone, failed, false);
  check_still(storage.path(), files_under(storage.path()));
}

/// Wraps the Tracker T: forwards start() and end() and logs each call with what the run
/// directory held then, for check_driven.
template <class T>
struct observed : T {
  struct call {
    std::string what;
    std::string status;
    bool had_reports;
  };
  static std::vector<call>& log() {
    static std::vector<call> calls;
    return calls;
  }
  static void start(const dtrain::tracking::RunRecord& run) {
    log().push_back({"start", run.outcome.value("status", ""), fs::exists(run.path / "metrics.jsonl")});
    T::start(run);
  }
  static void end(const dtrain::tracking::RunRecord& run) {
    log().push_back({"end", run.outcome.value("status", ""), fs::exists(run.path / "metrics.jsonl")});
    T::end(run);
  }
};

/// The driver's side: start() once before any report, end() exactly once after the last, for a
/// run that finishes and for one whose worker throws; nothing changes after fit() returns.
template <class T>
void check_driven() {
  using Tracked = observed<T>;
  using Trainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset, Tracked>;
  dtrain_test::TempDir storage;
  const dtrain::data::TensorDataset data{torch::randn({64, 4}), torch::randint(0, 2, {64})};
  for (const bool fail : {false, true}) {
    INFO((fail ? "a run whose worker throws" : "a run that finishes"));
    Tracked::log().clear();
    Trainer trainer({.num_workers = 2},
                    {.storage_path = storage.path(), .name = fail ? "fails" : "finishes",
                     .rendezvous_timeout = std::chrono::seconds(30), .collective_timeout = std::chrono::seconds(30)});
    auto loop = [&](typename Trainer::context& ctx) {
      auto model = ctx.prepare_model(torch::nn::Sequential(torch::nn::Linear(4, 2)));
      torch::optim::SGD sgd(model->parameters(), 0.1);
      for (auto epoch : ctx.epochs(2)) {
        for (auto batch : ctx.shard(data, 16)) {
          sgd.zero_grad();
          ctx.backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
          ctx.step(sgd);
        }
        if (fail && epoch == 1 && ctx.world_rank() == 1) throw std::runtime_error("the law checker's planned failure");
        ctx.report({{"epoch", epoch}});
      }
    };
    if (fail) CHECK_THROWS_AS(trainer.fit(loop), dtrain::WorkerError);
    else CHECK_NOTHROW(trainer.fit(loop));
    const auto& calls = Tracked::log();
    REQUIRE(calls.size() == 2);
    CHECK(calls[0].what == "start");
    CHECK(calls[0].status == "running");
    CHECK_FALSE(calls[0].had_reports);  // before any worker reported
    CHECK(calls[1].what == "end");
    CHECK(calls[1].status == (fail ? "failed" : "finished"));
    CHECK(calls[1].had_reports);  // after the reports
    check_still(storage.path(), files_under(storage.path()));
  }
}

}  // namespace dtrain_laws::tracker
