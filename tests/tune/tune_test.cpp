// SPDX-License-Identifier: Apache-2.0
// dtrain::tune as functions: the search space, grid and random search, the schedulers' decisions on
// results whose numbers are known, the shared scheduler log, the trials' GPU shares.

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "../dtrain_catch.hpp"

#include <dtrain/tune.hpp>

namespace d = dtrain;
namespace tune = dtrain::tune;
using Catch::Matchers::Contains;

namespace {

std::vector<d::Metrics> suggestions(const tune::Space& space, int samples, std::uint64_t seed) {
  std::vector<d::Metrics> out;
  const tune::basic_search search;
  for (std::size_t i = 0;; ++i) {
    auto c = search.suggest(space, i, {samples, seed}, {});
    if (!c) break;
    out.push_back(*c);
  }
  return out;
}

struct Model {
  std::int64_t width = 4;
  std::string act = "relu";
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Model, width, act)
struct Loop {
  double lr = 0.1;
  std::int64_t epochs = 3;
  Model model;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Loop, lr, epochs, model)

}  // namespace

TEST_CASE("A grid covers its space exactly once per sample, the sampled parameters drawn for each trial", "[tune]") {
  const tune::Space space{{"optimizer", tune::grid({"adam", "sgd", "adamw"})},
                          {"batch", tune::grid({32, 64})},
                          {"lr", tune::loguniform(1e-4, 1e-1)},
                          {"epochs", 5}};
  CHECK(space.grid_size() == 6);
  const auto once = suggestions(space, 1, 0);
  REQUIRE(once.size() == 6);
  std::set<std::pair<std::string, std::int64_t>> points;
  for (const auto& c : once) {
    points.emplace(c.at("optimizer").text(), static_cast<std::int64_t>(c.at("batch").number()));
    CHECK(c.at("epochs") == d::Metric(5));
  }
  CHECK(points.size() == 6);  // every point, none twice
  const auto twice = suggestions(space, 2, 0);
  REQUIRE(twice.size() == 12);
  std::map<std::pair<std::string, std::int64_t>, int> counts;
  for (const auto& c : twice) ++counts[{c.at("optimizer").text(), static_cast<std::int64_t>(c.at("batch").number())}];
  for (const auto& [point, n] : counts) CHECK(n == 2);
  // The first grid parameter varies slowest.
  CHECK(once[0].at("optimizer").text() == "adam");
  CHECK(once[1].at("optimizer").text() == "adam");
  CHECK(once[2].at("optimizer").text() == "sgd");
}

TEST_CASE("Random search is reproducible by seed, each draw within its domain", "[tune]") {
  const tune::Space space{{"lr", tune::loguniform(1e-4, 1e-1)},
                          {"dropout", tune::uniform(0.1, 0.5)},
                          {"layers", tune::randint(1, 4)},
                          {"act", tune::choice({"relu", "gelu"})},
                          {"model", tune::Space{{"width", tune::choice({64, 128})}}}};
  const auto a = suggestions(space, 50, 7), b = suggestions(space, 50, 7), c = suggestions(space, 50, 8);
  REQUIRE(a.size() == 50);
  CHECK(a == b);
  CHECK(a != c);
  std::set<std::int64_t> layers;
  std::set<std::string> acts;
  for (const auto& t : a) {
    CHECK(t.at("lr").number() >= 1e-4);
    CHECK(t.at("lr").number() < 1e-1);
    CHECK(t.at("dropout").number() >= 0.1);
    CHECK(t.at("dropout").number() < 0.5);
    CHECK(t.at("layers").is_integer());
    layers.insert(static_cast<std::int64_t>(t.at("layers").number()));
    acts.insert(t.at("act").text());
    CHECK((t.at("model.width") == d::Metric(64) || t.at("model.width") == d::Metric(128)));
  }
  CHECK(layers == std::set<std::int64_t>{1, 2, 3});  // high excluded, every value drawn in 50
  CHECK(acts.size() == 2);
  // A trial's draws depend on its index and the seed only: asked again alone, the same.
  CHECK(*tune::basic_search{}.suggest(space, 17, {50, 7}, {}) == a[17]);
  // Log-uniform: as many draws below the geometric middle as above, roughly.
  int low = 0;
  for (const auto& t : suggestions(space, 2000, 1)) low += t.at("lr").number() < std::sqrt(1e-4 * 1e-1);
  CHECK(low > 900);
  CHECK(low < 1100);
}

TEST_CASE("A space refuses bad domains and names, saying what to change", "[tune]") {
  CHECK_THROWS_MATCHES(tune::uniform(1, 1), d::ConfigError, Catch::Matchers::Message(
      "tune::uniform(1.000000, 1.000000): the bounds must be finite with low < high"));
  CHECK_THROWS_WITH(tune::loguniform(0, 1), Contains("must be positive"));
  CHECK_THROWS_WITH(tune::randint(3, 3), Contains("high is excluded"));
  CHECK_THROWS_WITH(tune::choice({}), Contains("at least one value"));
  CHECK_THROWS_WITH(tune::grid({}), Contains("at least one value"));
  CHECK_THROWS_WITH((tune::Space{{"lr", 0.1}, {"lr", 0.2}}), Contains("\"lr\" is given twice"));
  CHECK_THROWS_WITH((tune::Space{{"model.width", 4}}), Contains("nest a tune::Space"));
  CHECK_THROWS_WITH(tune::TuneConfig{.metric = "val_loss"}.validate(), Contains("TuneConfig::mode is unset"));
  CHECK_THROWS_WITH(tune::TuneConfig{}.validate(), Contains("TuneConfig::metric is empty"));
  CHECK_THROWS_WITH((tune::asha{.max_t = 1, .grace_period = 2}.validate()), Contains("grace_period <= max_t"));
}

TEST_CASE("tune::config reads a trial's flat config into the loop's nested struct, its defaults kept", "[tune]") {
  const d::Metrics flat{{"lr", 0.01}, {"model.width", 128}, {"unrelated", "x"}};
  const auto c = tune::config<Loop>(flat);
  CHECK(c.lr == 0.01);
  CHECK(c.epochs == 3);
  CHECK(c.model.width == 128);
  CHECK(c.model.act == "relu");
  CHECK(tune::unflatten(flat) == nlohmann::json{{"lr", 0.01}, {"model", {{"width", 128}}}, {"unrelated", "x"}});
  CHECK_THROWS_WITH(tune::config<Loop>(d::Metrics{{"model.width", "wide"}}), Contains("does not convert"));
  CHECK_THROWS_WITH(tune::unflatten(d::Metrics{{"model", 1}, {"model.width", 2}}), Contains("both \"model\""));
}

TEST_CASE("ASHA stops a trial below its rung's cutoff, once per rung, and every trial at max_t", "[tune]") {
  const tune::asha asha{.max_t = 8, .grace_period = 1, .reduction_factor = 2};
  CHECK(asha.rungs() == std::vector<double>{1, 2, 4, 8});
  tune::Histories h;
  // The first trial at a rung has nothing to be compared with.
  CHECK_FALSE(asha.on_result(h, "a", {1, -1.4}).stop);
  h["a"] = {{1, -1.4}, {2, -0.9}, {3, -0.73}, {4, -0.65}};
  CHECK_FALSE(asha.on_result(h, "b", {1, -1.1}).stop);  // above a's -1.4
  h["b"] = {{1, -1.1}, {2, -0.6}, {3, -0.43}, {4, -0.35}};
  // The median of -1.4 and -1.1 is -1.25: -1.3 is below it.
  const auto stopped = asha.on_result(h, "c", {1, -1.3});
  CHECK(stopped.stop);
  CHECK_THAT(stopped.why, Contains("rung 1") && Contains("cutoff -1.25"));
  h["c"] = {{1, -1.3}};
  CHECK_FALSE(asha.on_result(h, "d", {1, -1.2}).stop);  // median of -1.4, -1.1, -1.3 is -1.3
  h["d"] = {{1, -1.2}};
  // Between rungs the trial is not judged again; at the next rung it is, against those there.
  CHECK_FALSE(asha.on_result(h, "d", {1.5, -5}).stop);
  CHECK(asha.on_result(h, "d", {2, -0.8}).stop);  // below the median -0.75 of a (-0.9) and b (-0.6)
  CHECK_FALSE(asha.on_result(h, "d", {2, -0.7}).stop);
  // max_t ends every trial.
  CHECK_THAT(asha.on_result(h, "a", {8, 0}).why, Contains("max_t"));
}

TEST_CASE("The median stopping rule compares a trial's best score with the others' mean scores", "[tune]") {
  const tune::median_stopping rule{.grace_period = 2, .min_samples_required = 2};
  tune::Histories h{{"a", {{1, -1}, {2, -0.5}, {3, -0.4}}}, {"b", {{1, -2}, {2, -1}, {3, -0.9}}}};
  CHECK_FALSE(rule.on_result(h, "c", {1, -9}).stop);  // within the grace period
  // At time 2 the others' means are -0.75 and -1.5: the median -1.125.
  CHECK_FALSE(rule.on_result(h, "c", {2, -1.1}).stop);
  CHECK(rule.on_result(h, "c", {2, -1.2}).stop);
  h["c"] = {{1, -0.1}};  // an earlier best counts
  CHECK_FALSE(rule.on_result(h, "c", {2, -1.2}).stop);
  // Too few trials reached the time: no decision.
  CHECK_FALSE(rule.on_result(h, "c", {4, -9}).stop);
}

TEST_CASE("The scheduler log: each trial sees the others' results, a resumed trial's replaces its own", "[tune]") {
  const auto dir = std::filesystem::temp_directory_path() / ("dtrain_tune_log_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const tune::ExperimentDirectory exp(dir);
  const tune::asha asha{.max_t = 8, .grace_period = 1, .reduction_factor = 2};
  CHECK_FALSE(tune::SchedulerLog::record(exp, asha, "a", {1, -1.4}).stop);
  CHECK_FALSE(tune::SchedulerLog::record(exp, asha, "a", {2, -0.9}).stop);
  CHECK_FALSE(tune::SchedulerLog::record(exp, asha, "b", {1, -1.1}).stop);
  const auto stop = tune::SchedulerLog::record(exp, asha, "c", {1, -1.3});
  CHECK(stop.stop);
  auto log = tune::SchedulerLog::read(exp);
  CHECK(log.results.at("a").size() == 2);
  CHECK(log.results.at("c").size() == 1);  // the result that stopped it counts at its rung
  CHECK(log.stops.empty());  // a stop is recorded once it cut the trial's loop short
  tune::SchedulerLog::record_stop(exp, "c", 1, stop.why);
  log = tune::SchedulerLog::read(exp);
  CHECK(log.stops.at("c").at("time") == 1.0);
  CHECK_THAT(log.stops.at("c").at("why").get<std::string>(), Contains("cutoff"));
  // "a" resumed from its checkpoint at time 1 reports time 2 again: replaced, not doubled.
  CHECK_FALSE(tune::SchedulerLog::record(exp, asha, "a", {2, -0.95}).stop);
  log = tune::SchedulerLog::read(exp);
  REQUIRE(log.results.at("a").size() == 2);
  CHECK(log.results.at("a")[1].score == -0.95);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Each concurrent GPU trial gets GPUs of its own", "[tune]") {
  CHECK(tune::slot_gpus(0, 2, "", 4) == "0,1");
  CHECK(tune::slot_gpus(1, 2, "", 4) == "2,3");
  CHECK(tune::slot_gpus(1, 1, "3,5,7", 3) == "5");
  CHECK_THROWS_WITH(tune::slot_gpus(2, 2, "", 4), Contains("lower TuneConfig::max_concurrent_trials"));
}
