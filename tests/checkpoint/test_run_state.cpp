// SPDX-License-Identifier: Apache-2.0
// A run's state on disk after what a fault campaign does to it (issue 30). Each test runs the
// checkpoint scenarios program (a real driver with real workers over Gloo on loopback), does to
// the run's files or processes what a fault would, and reads what the run leaves.

#include "../dtrain_catch.hpp"
#include "../run_command.hpp"
#include "sandbox.hpp"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/result.hpp>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using dtrain_test::field;
using dtrain_test::reseal;
using dtrain_test::Run;
using dtrain_test::same_params;
using dtrain_test::Sandbox;

std::string text_of(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

json json_of(const fs::path& p) { return json::parse(text_of(p)); }

// ---- item 4: a full disk ----

// A tmpfs of `size` mounted at `where` for the test's life (needs root, as CI and the dev machines
// have; without it the test says so and checks nothing).
struct Tmpfs {
  fs::path where;
  bool mounted = false;
  Tmpfs(fs::path at, const std::string& size) : where(std::move(at)) {
    fs::create_directories(where);
    mounted = dtrain_test::run_command("mount -t tmpfs -o size=" + size + " tmpfs '" + where.string() + "'").status == 0;
  }
  bool resize(const std::string& size) const {
    return dtrain_test::run_command("mount -o remount,size=" + size + " '" + where.string() + "'").status == 0;
  }
  ~Tmpfs() {
    if (mounted) (void)dtrain_test::run_command("umount -l '" + where.string() + "'");
  }
};

// Writes `path` until the file system is full: what a write cut short by the disk leaves.
void fill_up(const fs::path& path) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  const std::string block(4096, 'x');
  for (int i = 0; i < (1 << 20) && out.write(block.data(), block.size()); ++i) {
  }
}

std::vector<std::string> leftovers(const fs::path& run) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(run))
    if (e.path().filename().string().rfind(".tmp", 0) == 0 || e.path().extension() == ".tmp")
      out.push_back(e.path().filename().string());
  return out;
}

}  // namespace

TEST_CASE("enospc_resume_needs_no_hand_cleanup: a checkpoint write that fills the disk is recorded, and the run "
          "resumes once space is freed") {
  Sandbox box;
  auto ref = box.scenario("--name ref --steps 40 --every 5 --out ref.pt");
  INFO(ref.output);
  REQUIRE(ref.status == 0);
  // About 64 KB a checkpoint in 4 KB pages (the optimizer's state once): 380 KB hold the run's
  // files and five of its eight checkpoints; the sixth's write fills the disk, and its removal
  // leaves room to record the failure.
  Tmpfs disk(box.file("small_disk"), "380k");
  if (!disk.mounted) {
    WARN("cannot mount a tmpfs here (not root?): the ENOSPC scenario was not run");
    return;
  }
  const std::string args = "--storage '" + disk.where.string() + "' --name full --steps 40 --every 5 --out full.pt";
  const auto run = disk.where / "full";

  // 1. The disk fills within a checkpoint write: the run fails, and says so in outcome.json.
  auto first = box.scenario(args);
  INFO(first.output);
  CHECK(first.status == 3);
  CHECK_THAT(first.output, Catch::Contains("No space left on device"));
  const auto failed = json_of(run / "outcome.json");
  INFO(failed.dump(2));
  CHECK(failed["status"] == "failed");
  CHECK_THAT(failed["error"].is_string() ? failed["error"].get<std::string>() : "", Catch::Contains("No space left on device"));
  CHECK(leftovers(run).empty());  // the unfinished write's space was given back

  // 2. Space is freed (the volume grows), but a driver killed within a write left its temporary
  //    directory, and it fills the disk again: the same command removes it before it writes
  //    anything, resumes and finishes. No hand cleanup.
  REQUIRE(disk.resize("4m"));
  fill_up(run / ".tmp_checkpoint_000099" / "model.pt");
  auto second = box.scenario(args);
  INFO(second.output);
  REQUIRE(second.status == 0);
  CHECK_THAT(second.output, !Catch::Contains("params.json.tmp") &&
                                Catch::Contains("RESUMED " + (run / "checkpoint_000005").string() + " steps=25"));
  CHECK(same_params(box.file("ref.pt"), box.file("full.pt")));
  CHECK(json_of(run / "outcome.json")["status"] == "finished");
  CHECK(leftovers(run).empty());
  CHECK(field(second.output, "rows") == "8");
}

// ---- item 5: state files with a valid checksum and wrong content ----

namespace {

// One edit of a checkpoint's JSON file: the value at `pointer` replaced (or removed, or the whole
// file replaced by `raw`). `bad`: the checkpoint must then be reported damaged, naming `file` and
// `key`, and passed over; otherwise it must still be resumed from.
struct Mutation {
  std::string file, pointer;
  std::optional<json> value;  // nothing: remove the key
  bool bad = true;
  std::optional<std::string> raw;  // the whole file's text instead
  std::string describe() const {
    return file + (raw ? " := " + *raw : pointer + (value ? " = " + value->dump() : " removed"));
  }
  std::string key() const {
    if (raw) return "";
    auto k = pointer.substr(pointer.rfind('/') + 1);
    return k.find_first_not_of("0123456789") == std::string::npos ? "" : k;
  }
};

// The values no integer field may hold: other types, negatives, what overflows or loses precision.
std::vector<json> bad_integers() {
  return {json("5"), json(5.5), json::array(), json::object(), json(nullptr), json(true), json(-1),
          json(std::int64_t{9223372036854775807}), json(std::int64_t{9007199254740993}), json(1e308),
          json(std::uint64_t{18446744073709551615ull})};
}

void add_integer_field(std::vector<Mutation>& m, const std::string& file, const std::string& key) {
  m.push_back({file, "/" + key, std::nullopt});
  for (const auto& v : bad_integers()) m.push_back({file, "/" + key, v});
}

// Applies `m` to `ck`'s file, and re-seals the manifest over it (as a tool rewriting it would).
void apply(const fs::path& ck, const Mutation& m) {
  const auto path = ck / m.file;
  if (m.raw) {
    std::ofstream(path, std::ios::trunc) << *m.raw;
  } else {
    auto doc = json_of(path);
    const json::json_pointer p(m.pointer);
    if (m.value) doc[p] = *m.value;
    else doc[p.parent_pointer()].erase(p.back());
    std::ofstream(path, std::ios::trunc) << doc.dump();
  }
  if (m.file != "manifest.json") reseal(ck, m.file);
}

// Each mutation on a copy of a 10-step run (checkpoints at steps 5 and 10, the edit in the second).
// Every one is opened as the driver opens a checkpoint to choose the one to resume from
// (Checkpoint::open, what latest_valid calls): a bad edit must be refused with a reason naming the
// file and the field, a harmless one opened. Then runs continue to 15 steps end to end, for the
// first edit of each field (and of each whole-file replacement), every harmless edit and every bad
// one that open() lets through (the workers must catch those): a bad edit must be named and passed
// over (resumed from the first checkpoint, parameters bitwise equal to an uninterrupted run), a
// harmless one resumed from. The other values of a field open() refuses take the same path as its
// first; a run each (about 0.5 s) made these tests two minutes of CI's 2 cores.
void fuzz(const Sandbox& box, const std::vector<Mutation>& mutations, const std::string& tag) {
  auto base = box.scenario("--name " + tag + "_base --steps 10 --every 5");
  INFO(base.output);
  REQUIRE(base.status == 0);
  auto ref = box.scenario("--name " + tag + "_ref --steps 15 --every 5 --out " + tag + "_ref.pt");
  REQUIRE(ref.status == 0);
  std::vector<std::string> unnamed, accepted, refused, diverged;
  std::set<std::string> fields_run;
  std::size_t runs = 0;
  for (std::size_t i = 0; i < mutations.size(); ++i) {
    const auto& m = mutations[i];
    const std::string name = tag + std::to_string(i);
    fs::copy(box.run(tag + "_base"), box.run(name), fs::copy_options::recursive);
    const auto ck = box.run(name) / "checkpoint_000002";
    apply(ck, m);
    std::string why;
    const bool opened = dtrain::checkpointer::Checkpoint::open(ck, &why).has_value();
    if (m.bad && !opened && (why.find(m.file) == std::string::npos || why.find(m.key()) == std::string::npos))
      unnamed.push_back(m.describe() + "\nCheckpoint::open: " + why);
    if (!m.bad && !opened) refused.push_back(m.describe() + "\nCheckpoint::open: " + why);
    const bool first_of_field = fields_run.insert(m.file + (m.raw ? " :=" : m.pointer)).second;
    if (m.bad && !opened && !first_of_field) {  // refused as its field's first edit was
      fs::remove_all(box.run(name));
      continue;
    }
    ++runs;
    auto r = box.scenario("--name " + name + " --steps 15 --every 5 --out " + name + ".pt");
    const std::string what = m.describe() + "\n" + r.output;
    const auto warned = r.output.find("checkpoint " + ck.string() + " is damaged (");
    const std::string reason = warned == std::string::npos ? "" : r.output.substr(warned, r.output.find('\n', warned) - warned);
    if (r.status != 0) {
      unnamed.push_back(what);  // an error instead of a fallback
      continue;
    }
    if (m.bad) {
      if (warned == std::string::npos) accepted.push_back(what);
      else if (reason.find(m.file) == std::string::npos || reason.find(m.key()) == std::string::npos) unnamed.push_back(what);
      else if (r.output.find("RESUMED " + (box.run(name) / "checkpoint_000001").string() + " steps=5") == std::string::npos)
        diverged.push_back(what);
    } else if (r.output.find("RESUMED " + ck.string() + " steps=10") == std::string::npos) {
      refused.push_back(what);
    }
    if (!same_params(box.file(tag + "_ref.pt"), box.file(name + ".pt"))) diverged.push_back("parameters differ: " + what);
    fs::remove_all(box.run(name));
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += "\n---- " + x;
    return s;
  };
  INFO(mutations.size() << " mutations, " << runs << " of them run end to end");
  INFO("errors or warnings that name no file and field:" << list(unnamed));
  INFO("out-of-range values accepted silently:" << list(accepted));
  INFO("harmless edits refused:" << list(refused));
  INFO("not resumed from the older checkpoint, or other parameters:" << list(diverged));
  CHECK(unnamed.size() == 0);
  CHECK(accepted.size() == 0);
  CHECK(refused.size() == 0);
  CHECK(diverged.size() == 0);
}

}  // namespace

TEST_CASE("state_json_fuzz_names_the_field_and_falls_back: state.json edited under a valid CRC") {
  Sandbox box;
  const std::string f = "state.json";
  std::vector<Mutation> m;
  for (const char* key : {"iteration", "epoch", "position", "steps", "world_size"}) add_integer_field(m, f, key);
  // Values in range that disagree with the run: the directory's iteration, the rank files' sampler
  // state, the manifest's world size.
  m.push_back({f, "/iteration", json(0)});
  m.push_back({f, "/iteration", json(3)});
  m.push_back({f, "/epoch", json(1)});
  m.push_back({f, "/position", json(7)});
  m.push_back({f, "/world_size", json(1)});
  m.push_back({f, "/world_size", json(3)});
  for (const char* key : {"metrics", "extras"}) {
    m.push_back({f, std::string("/") + key, std::nullopt});
    for (const auto& v : {json::array(), json("x"), json(5), json(nullptr)}) m.push_back({f, std::string("/") + key, v});
  }
  for (const auto& v : {json::array({1}), json(true), json::object({{"a", 1}})}) m.push_back({f, "/metrics/loss", v});
  m.push_back({f, "/extras/extra_steps", json::array()});
  for (const char* raw : {"{", "[]", "", "{\"iteration\": 2}"}) m.push_back({f, "", std::nullopt, true, std::string(raw)});
  // Harmless: another metric value, a key this version does not know.
  m.push_back({f, "/metrics/loss", json(1.5), false});
  m.push_back({f, "/note", json("copied by hand"), false});
  m.push_back({f, "/extras/extra_steps", json(11), false});
  fuzz(box, m, "state");
}

TEST_CASE("rank_json_fuzz_names_the_field_and_falls_back: rank_00001.json edited under a valid CRC") {
  Sandbox box;
  const std::string f = "rank_00001.json";
  std::vector<Mutation> m;
  for (const char* key : {"rank", "epoch", "position"}) add_integer_field(m, f, key);
  for (const auto& v : bad_integers())
    if (v != json(-1)) m.push_back({f, "/offset", v});
  m.push_back({f, "/offset", json(-2)});
  m.push_back({f, "/offset", json(100)});           // another rank's offset than rank 0's
  m.push_back({f, "/offset", std::nullopt});        // rank 0 saved one
  m.push_back({f, "/rank", json(0)});               // rank 1's file says rank 0
  m.push_back({f, "/epoch", json(1)});              // another epoch than state.json's
  m.push_back({f, "/position", json(3)});           // another position than state.json's
  m.push_back({f, "/rng", std::nullopt});
  for (const auto& v : {json(5), json(nullptr), json::array(), json("zz"), json("abc"), json("00"), json("")})
    m.push_back({f, "/rng", v});
  for (const auto& v : {json(5), json("zz"), json("abc")}) m.push_back({f, "/cuda_rng", v});
  for (const char* raw : {"{", "[]", ""}) m.push_back({f, "", std::nullopt, true, std::string(raw)});
  m.push_back({f, "/note", json("copied by hand"), false});
  fuzz(box, m, "rank");
}

TEST_CASE("manifest_fuzz_names_the_field_and_falls_back: manifest.json edited") {
  Sandbox box;
  const std::string f = "manifest.json";
  std::vector<Mutation> m;
  m.push_back({f, "/format", std::nullopt});
  for (const auto& v : {json(2), json(0), json("1"), json(1.5), json(nullptr)}) m.push_back({f, "/format", v});
  m.push_back({f, "/iteration", std::nullopt});
  for (const auto& v : {json(3), json("2"), json(2.5), json(-1)}) m.push_back({f, "/iteration", v});
  m.push_back({f, "/world_size", std::nullopt});
  for (const auto& v : {json(3), json(1), json(0), json("2"), json(2.5)}) m.push_back({f, "/world_size", v});
  m.push_back({f, "/files", std::nullopt});
  for (const auto& v : {json::object(), json("x"), json::array()}) m.push_back({f, "/files", v});
  for (const char* key : {"name", "size", "crc32"}) m.push_back({f, std::string("/files/0/") + key, std::nullopt});
  for (const auto& v : {json(5), json("../model.pt"), json("/etc/hostname"), json("")}) m.push_back({f, "/files/0/name", v});
  for (const auto& v : {json(-1), json("9879"), json(1.5), json(std::uint64_t{18446744073709551615ull})})
    m.push_back({f, "/files/0/size", v});
  for (const auto& v : {json(-1), json(std::int64_t{4294967296}), json("x"), json(1.5)}) m.push_back({f, "/files/0/crc32", v});
  for (const char* raw : {"{", "[]", ""}) m.push_back({f, "", std::nullopt, true, std::string(raw)});
  m.push_back({f, "/note", json("copied by hand"), false});
  fuzz(box, m, "manifest");
}

// ---- item 6: outcome.json agrees with itself ----

namespace {

// outcome.json's counts agree: every group after the first but a grow-back is a restart, each
// restart has its failure, and each failure's resumed step is its group's step.
void check_consistent(const json& outcome) {
  INFO(outcome.dump(2));
  const auto& groups = outcome.at("groups");
  const auto& failures = outcome.at("failures");
  int restarted = 0;
  std::vector<std::int64_t> restart_steps, resumed_steps;
  for (std::size_t i = 1; i < groups.size(); ++i)
    if (groups[i]["reason"] != "grow") {
      ++restarted;
      restart_steps.push_back(groups[i]["step"].get<std::int64_t>());
    }
  for (const auto& f : failures)
    if (!f["resumed_step"].is_null()) resumed_steps.push_back(f["resumed_step"].get<std::int64_t>());
  CHECK(outcome["restarts"] == restarted);
  CHECK(resumed_steps == restart_steps);
}

}  // namespace

TEST_CASE("outcome_agrees_with_itself_after_a_checkpoint_load_restart: restarts, failures and groups say the same") {
  Sandbox box;
  REQUIRE(box.scenario("--name other --steps 10 --every 5 --hidden 48").status == 0);
  REQUIRE(box.scenario("--name mix --steps 10 --every 5").status == 0);
  // The latest checkpoint holds another model's weights under a manifest that verifies: the group
  // fails to load it and restarts from checkpoint 1 (step 5).
  const auto ck = box.run("mix") / "checkpoint_000002";
  fs::copy_file(box.run("other") / "checkpoint_000002" / "model.pt", ck / "model.pt", fs::copy_options::overwrite_existing);
  reseal(ck, "model.pt");
  auto r = box.scenario("--name mix --steps 20 --every 5");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains("checkpoint_000001 steps=5"));
  const auto outcome = json_of(box.run("mix") / "outcome.json");
  INFO(outcome.dump(2));
  CHECK(outcome["status"] == "finished");
  CHECK(outcome["restarts"] == 1);
  REQUIRE(outcome["failures"].size() == 1);
  CHECK_THAT(outcome["failures"][0]["cause"].get<std::string>(), Catch::Contains("cannot be loaded into this run"));
  CHECK(outcome["failures"][0]["resumed_step"] == 5);
  CHECK(outcome["failures"][0]["resumed_iteration"] == 1);
  CHECK(outcome["failures"][0]["counted"] == false);  // not against max_failures (0 here)
  REQUIRE(outcome["groups"].size() == 2);
  CHECK(outcome["groups"][1]["step"] == 5);
  CHECK(outcome["groups"][1]["reason"] == "restart");
  check_consistent(outcome);
  // The Result says the same.
  CHECK(field(r.output, "restarts") == "1");
  CHECK_THAT(r.output, Catch::Contains("groups=2@10:start;2@5:restart;"));
  const auto back = dtrain::Result::from_path(box.run("mix"));
  CHECK(back.restarts == 1);

  // A worker killed mid-run: the same agreement.
  auto k = box.scenario("--name kill --steps 40 --every 5 --kill-step 23 --max-failures 1");
  INFO(k.output);
  REQUIRE(k.status == 0);
  check_consistent(json_of(box.run("kill") / "outcome.json"));
}

// ---- item 7: a killed driver ----

namespace {

// The processes whose command line holds `tag`.
std::vector<pid_t> tagged(const std::string& tag) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto cmdline = text_of(e.path() / "cmdline");
    for (auto& c : cmdline)
      if (c == '\0') c = ' ';
    if (cmdline.find(tag) != std::string::npos && cmdline.find("checkpoint_scenarios") != std::string::npos)
      out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

}  // namespace

TEST_CASE("killed_driver_reads_interrupted: a run whose driver was killed by SIGKILL is interrupted, not running") {
  Sandbox box;
  const auto run = box.run("killed");
  const std::string tag = "killed_driver_" + std::to_string(getpid());
  // A long run in the background: ( ... exec ... ) & makes $! the driver's own pid.
  const std::string start = "( cd '" + box.dir.string() + "' && exec '" + SCENARIOS_BIN + "' --storage '" +
                            box.storage().string() + "' --name killed --steps 100000000 --every 100 --keep 2 --tag " +
                            tag + " > driver.log 2>&1 ) & echo $! > '" + box.file("driver.pid").string() + "'";
  REQUIRE(std::system(start.c_str()) == 0);
  const pid_t driver = static_cast<pid_t>(std::stol(text_of(box.file("driver.pid"))));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (dtrain::MetricsHistory::read_jsonl(run / "metrics.jsonl").size() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  INFO(text_of(box.file("driver.log")));
  REQUIRE(dtrain::MetricsHistory::read_jsonl(run / "metrics.jsonl").size() >= 2);

  // Alive: running, and outcome.json says who records it.
  const auto live = dtrain::Result::from_path(run);
  CHECK(live.status == "running");
  CHECK_FALSE(live.error);
  const auto outcome = json_of(run / "outcome.json");
  INFO(outcome.dump(2));
  CHECK(outcome["driver"]["pid"] == driver);
  std::string boot = text_of("/proc/sys/kernel/random/boot_id");
  boot.erase(boot.find_last_not_of("\n") + 1);
  CHECK(outcome["driver"]["boot_id"] == boot);
  CHECK(outcome["heartbeat_time"].get<double>() >= outcome["start_time"].get<double>());

  REQUIRE(::kill(driver, SIGKILL) == 0);
  // Its workers follow it (PR_SET_PDEATHSIG); none is left behind.
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::vector<pid_t> left;
  while (!(left = tagged(tag)).empty() && std::chrono::steady_clock::now() < gone_by) {
    // The killed driver may stay a zombie until its new parent reaps it: it counts as gone.
    bool only_zombies = true;
    for (const auto pid : left) {
      const auto stat = text_of("/proc/" + std::to_string(pid) + "/stat");
      const auto close = stat.rfind(')');
      if (close == std::string::npos || stat.size() < close + 3 || stat[close + 2] != 'Z') only_zombies = false;
    }
    if (only_zombies) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (const auto pid : left) ::kill(pid, SIGKILL);

  const auto dead = dtrain::Result::from_path(run);
  CHECK(dead.status == "interrupted");
  REQUIRE(dead.error);
  CHECK(dead.error->status == "interrupted");
  CHECK_THAT(dead.error->message, Catch::Contains("pid " + std::to_string(driver)) && Catch::Contains("again"));
  CHECK(json_of(run / "outcome.json")["status"] == "running");  // reading changes nothing

  // Read from another machine, only the heartbeat can tell: a recent one is running, an old one not.
  const auto copy = box.file("elsewhere");
  fs::create_directories(copy);
  auto other = outcome;
  other["driver"]["host"] = "another-host";
  other["driver"]["boot_id"] = "another-boot";
  other["heartbeat_time"] = dtrain::unix_now();
  std::ofstream(copy / "outcome.json") << other.dump();
  CHECK(dtrain::Result::from_path(copy).status == "running");
  other["heartbeat_time"] = dtrain::unix_now() - 3600;
  std::ofstream(copy / "outcome.json", std::ios::trunc) << other.dump();
  CHECK(dtrain::Result::from_path(copy).status == "interrupted");

  // Run again: it resumes from the latest checkpoint and finishes.
  REQUIRE(dead.latest_checkpoint());
  const auto steps = dead.latest_checkpoint()->steps();
  auto again = box.scenario("--name killed --every 100 --keep 2 --steps " + std::to_string(steps + 10));
  INFO(again.output);
  REQUIRE(again.status == 0);
  CHECK_THAT(again.output, Catch::Contains("RESUMED") && Catch::Contains("steps=" + std::to_string(steps)));
  CHECK(dtrain::Result::from_path(run).status == "finished");
}
