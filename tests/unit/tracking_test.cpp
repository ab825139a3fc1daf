// SPDX-License-Identifier: Apache-2.0
#include "checkpoint_support.hpp"
#include "support.hpp"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <dtrain/checkpointer/directory.hpp>
#include <dtrain/launch/group.hpp>
#include <dtrain/run_directory.hpp>
#include <dtrain/evaluation/batch_predict.hpp>
#include <dtrain/evaluation/predictor.hpp>
#include <dtrain/tracker/mlflow.hpp>
#include <dtrain/tracker/none.hpp>
#include <dtrain/tracker/tensorboard.hpp>
#include <dtrain/tracking/progress.hpp>
#include <dtrain/tracking/report.hpp>
#include <dtrain/tracking/report_timing.hpp>
#include <dtrain/tracking/step_history.hpp>

namespace d = dtrain;
using dtrain_test::MessageContains;
using dtrain_test::TempDir;

namespace {

using dtrain_test::slurp;

// Everything written to a pipe's write end, read back once it is closed.
struct Pipe {
  int fds[2];
  Pipe() { REQUIRE(::pipe(fds) == 0); }
  std::string drain() {
    ::close(fds[1]);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    ::close(fds[0]);
    return out;
  }
};

// A run as the driver records it: 3 reports, one restart, a checkpoint index and an evaluation.
d::tracking::RunRecord sample_run(const std::filesystem::path& dir, const std::string& status) {
  d::tracking::RunRecord r;
  r.path = dir;
  std::filesystem::create_directories(dir);
  r.params = {{"format", 1}, {"scaling", {{"num_workers", 2}}}, {"train_loop_config", {{"lr", 0.001}, {"model", "mlp"}}}};
  for (int i = 1; i <= 3; ++i)
    r.history.push_back({{"iteration", i}, {"epoch", i - 1}, {"step", 10 * i}, {"timestamp", 1000.0 + i},
                         {"loss", 1.0 / i}, {"a<b", 0.5}, {"note", "text"}});
  r.outcome = {{"status", status}, {"start_time", 999.5}, {"end_time", 1004.0}, {"restarts", 1},
               {"failures", {{{"time", 1002.5}, {"cause", "rank 1 was killed by signal 9"}, {"resumed_step", 20}}}},
               {"error", status == "failed" ? nlohmann::json("training failed 2 times") : nlohmann::json(nullptr)}};
  r.checkpoints = {{"score_attribute", "loss"},
                   {"checkpoints", {{{"directory", "checkpoint_000003"}, {"iteration", 3}, {"step", 30},
                                     {"score", 0.33}, {"best", true}, {"latest", true}}}}};
  r.evaluations = nlohmann::json::array({d::tracking::evaluation_json(
      "test", {{"accuracy", 0.75}}, {"cat", "dog"}, {{2, 1}, {0, 1}}, "", 1004.0)});
  return r;
}

}  // namespace

TEST_CASE("the progress line's text", "[tracking][progress]") {
  d::tracking::ProgressSnapshot p{.epoch = 1, .epochs = 3, .step = 120, .total_steps = 938,
                                  .samples_per_s = 2451.26, .steps_per_s = 2.0, .loss = 0.41234};
  CHECK(d::tracking::format_progress(p) ==
        "epoch 2/3 | step 120/938 (12%) | 2451.3 samples/s | loss 0.4123 | ETA 06:49");
  // Unknown totals and loss are left out.
  CHECK(d::tracking::format_progress({.epoch = 0, .step = 5, .samples_per_s = 10}) == "epoch 1 | step 5 | 10.0 samples/s");
  CHECK(d::tracking::format_duration(3723) == "1:02:03");
  CHECK(d::tracking::format_duration(59.4) == "00:59");
  CHECK(d::tracking::format_duration(std::nan("")) == "--:--");
}

TEST_CASE("progress: redrawn in place on a terminal, a plain line otherwise, nothing when quiet", "[tracking][progress]") {
  const d::ProgressConfig config{.verbosity = d::Verbosity::verbose};
  const d::tracking::ProgressSnapshot p{.step = 3, .samples_per_s = 1};
  {
    Pipe pipe;
    {
      d::tracking::Progress term(config, true, pipe.fds[1], /*terminal=*/true);
      term.draw(p);
      term.note("report 1: loss=0.5");
      term.close();
    }
    CHECK(pipe.drain() == "\r" + d::tracking::format_progress(p) + "\033[K" + "\r\033[Kdtrain: report 1: loss=0.5\n" +
                              d::tracking::format_progress(p) + "\033[K\n");
  }
  {
    Pipe pipe;
    {
      d::tracking::Progress plain(config, true, pipe.fds[1], /*terminal=*/false);
      plain.draw(p);
      plain.close();
    }
    CHECK(pipe.drain() == "dtrain: " + d::tracking::format_progress(p) + "\n");
  }
  {
    Pipe pipe;
    {
      d::tracking::Progress quiet({.verbosity = d::Verbosity::quiet}, true, pipe.fds[1], true);
      d::tracking::Progress other_rank(config, /*enabled=*/false, pipe.fds[1], true);
      CHECK_FALSE(quiet.due());
      quiet.draw(p);
      other_rank.draw(p);
      other_rank.note("x");
    }
    CHECK(pipe.drain().empty());
  }
  ::setenv("DTRAIN_VERBOSITY", "quiet", 1);
  CHECK_FALSE(d::tracking::Progress(config, true, 2, false).enabled());
  ::setenv("DTRAIN_VERBOSITY", "loud", 1);
  CHECK_THROWS_MATCHES(d::tracking::Progress(config, true, 2, false), d::ConfigError,
                       MessageContains({"DTRAIN_VERBOSITY", "loud", "quiet, normal or verbose"}));
  ::unsetenv("DTRAIN_VERBOSITY");
}

TEST_CASE("report.html: curves, restart markers, tables, confusion matrix, escaped names", "[tracking][report]") {
  TempDir dir;
  const auto html = d::tracking::render_report(sample_run(dir / "r", "failed"));
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("http://") == html.find("http://www.w3.org/2000/svg"));  // the SVG namespace only
  CHECK(html.find("data-metric=\"loss\"") != std::string::npos);
  CHECK(html.find("data-metric=\"a&lt;b\"") == std::string::npos);  // a constant is no curve,
  CHECK(html.find("<td>a&lt;b</td>") != std::string::npos);           // but a row of the table, escaped
  CHECK(html.find("data-metric=\"note\"") == std::string::npos);     // text is not a curve
  CHECK(html.find("data-metric=\"timestamp\"") == std::string::npos);
  CHECK(html.find("class=\"restart\"") != std::string::npos);
  CHECK(html.find("rank 1 was killed by signal 9") != std::string::npos);
  CHECK(html.find("class=\"status failed\"") != std::string::npos);
  CHECK(html.find("training failed 2 times") != std::string::npos);
  CHECK(html.find("<table id=\"final-metrics\">") != std::string::npos);
  CHECK(html.find("<table class=\"confusion-matrix\">") != std::string::npos);
  CHECK(html.find(">dog</th>") != std::string::npos);
  CHECK(html.find("id=\"throughput-chart\"") != std::string::npos);
  CHECK(html.find("train_loop_config.model") != std::string::npos);
  CHECK(html.find("checkpoint_000003") != std::string::npos);
}

// The attribute values of every `name="..."` in `html`, in order.
std::vector<std::string> attributes(const std::string& html, const std::string& name) {
  std::vector<std::string> out;
  const std::string key = " " + name + "=\"";
  for (auto at = html.find(key); at != std::string::npos; at = html.find(key, at + 1)) {
    const auto from = at + key.size();
    out.push_back(html.substr(from, html.find('"', from) - from));
  }
  return out;
}

TEST_CASE("report.html: the step history's curves, training beside validation, one-point series in the table", "[tracking][report]") {
  TempDir dir;
  auto run = sample_run(dir / "r", "finished");
  run.outcome["failures"] = nlohmann::json::array();
  run.checkpoints = nlohmann::json::object();
  run.history = {};
  for (int i = 1; i <= 3; ++i)  // one report per epoch, each with its training and validation loss
    run.history.push_back({{"iteration", i}, {"epoch", i - 1}, {"step", 100 * i}, {"timestamp", 1000.0 + 10 * i},
                           {"train_loss", 1.0 / i}, {"val_loss", 1.2 / i}, {"model_bytes", 1048576},
                           {"first_step_unix", 1795720000.25}, {"train_loop_s", 83.4 * i}});
  run.history.push_back({{"iteration", 4}, {"epoch", 2}, {"step", 300}, {"timestamp", 1031.0}, {"test_accuracy", 0.9}});
  run.params["run"] = {{"progress", {{"record_every", 10}}}};
  run.step_history.push_back({{"step", 0}, {"epoch", 0}, {"timestamp", 1000.0}, {"event", "start"}, {"world_size", 2}});
  for (int s = 4; s <= 300; s += 4) {
    if (s == 152)  // a later fit() resumed the run from its checkpoint at step 148
      run.step_history.push_back({{"step", 148}, {"epoch", 1}, {"timestamp", 1016.0}, {"event", "resume"}, {"world_size", 2}});
    run.step_history.push_back({{"step", s}, {"epoch", s / 100}, {"timestamp", 1000.0 + s / 10.0}, {"loss", 2.0 / s},
                                {"samples_per_s", 5000.0 + s}, {"lr", 0.001}});
  }
  const auto html = d::tracking::render_report(run);

  // One chart per quantity: the step history's loss, train_loss and val_loss together.
  CHECK(attributes(html, "data-metric") == std::vector<std::string>{"loss", "loop_s", "throughput"});
  CHECK(attributes(html, "data-series") ==
        std::vector<std::string>{"loss", "train_loss", "val_loss", "train_loop_s", "samples_per_s"});
  CHECK(attributes(html, "data-points") == std::vector<std::string>{"75", "3", "3", "3", "75"});
  CHECK(html.find("loss (every 10 steps, rank 0)") != std::string::npos);  // the legend says where from
  CHECK(html.find("val_loss (reports)") != std::string::npos);
  // 75 points are a line without dots; three get dots with their values.
  CHECK(html.find("<title>val_loss, step 300: 0.4</title>") != std::string::npos);
  CHECK(html.find("<title>loss, step") == std::string::npos);
  // The resume is marked on both axes: step 148 on the two step charts, 16 s after the start on
  // the time chart.
  const auto restart_lines = attributes(html, "class");
  CHECK(std::count(restart_lines.begin(), restart_lines.end(), "restart") == 3);
  CHECK(html.find("resumed from step 148 at ") != std::string::npos);
  CHECK(html.find(">seconds since the start<") != std::string::npos);
  // Constants (lr, model_bytes) and single values (test_accuracy) are no curves but table rows,
  // written as a person reads them.
  CHECK(html.find("data-series=\"lr\"") == std::string::npos);
  CHECK(html.find("<td>test_accuracy</td><td>0.9</td><td>300</td><td>1</td>") != std::string::npos);
  CHECK(html.find("<td>model_bytes</td><td>1 MiB (1048576 bytes)</td>") != std::string::npos);
  CHECK(html.find("<td>first_step_unix</td><td>2026-11-26 19:06:40 UTC</td>") != std::string::npos);
  CHECK(html.find("<td>train_loop_s</td><td>250.2 s (4:10)</td>") != std::string::npos);
  CHECK(html.find("e+09") == std::string::npos);
  // Nothing to show, no section: no restarts, no checkpoints.
  CHECK(html.find("<h2>Restarts</h2>") == std::string::npos);
  CHECK(html.find("<h2>Checkpoints</h2>") == std::string::npos);
  CHECK(html.find("<h2>Curves</h2>") != std::string::npos);
}

TEST_CASE("report.html: a run of one report has no chart but its values - a damaged steps.jsonl is passed over", "[tracking][report]") {
  TempDir dir;
  const auto run_dir = dir / "r";
  std::filesystem::create_directories(run_dir);
  d::MetricsHistory::append_jsonl(run_dir / "metrics.jsonl",
                                  {{"iteration", 1}, {"epoch", 0}, {"step", 469}, {"timestamp", 1000.0}, {"loss", 0.5}});
  { std::ofstream(run_dir / "steps.jsonl") << "{\"step\": 10, \"loss\": 0.7}\n{\"step\": 20, \"lo"; }
  const auto html = d::tracking::render_report(d::tracking::RunRecord::read(run_dir));
  CHECK(html.find("<svg") == std::string::npos);
  CHECK(html.find("<h2>Curves</h2>") == std::string::npos);
  CHECK(html.find("<td>loss</td><td>0.5</td><td>469</td><td>1</td>") != std::string::npos);
}

TEST_CASE("html: durations, dates, sizes and integers as a person reads them", "[tracking][report]") {
  namespace h = d::tracking::html;
  CHECK(h::duration(0.4213) == "0.421 s");
  CHECK(h::duration(59.0) == "59 s");
  CHECK(h::duration(83.41) == "83.41 s (1:23)");
  CHECK(h::duration(4000) == "4000 s (1:06:40)");
  CHECK(h::value_text("timestamp", 1795723421.02) == "2026-11-26 20:03:41 UTC");
  CHECK(h::value_text("first_step_unix", 0.0) == "-");
  CHECK(h::value_text("train_samples_per_s", 6661.66) == "6661.66");  // a rate, not a duration
  CHECK(h::value_text("train_loop_s", 9.007) == "9.007 s");
  CHECK(h::value_text("model_state_bytes", 6746272.0) == "6.434 MiB (6746272 bytes)");
  CHECK(h::value_text("model_state_bytes", 512) == "512");
  CHECK(h::value_text("steps", 469) == "469");
  CHECK(h::value_text("note", "text") == "text");
  CHECK(h::escape("<a href='x'>&</a>") == "&lt;a href=&#39;x&#39;&gt;&amp;&lt;/a&gt;");
  // Tick labels in plain digits: 110000 samples/s, not 1.1e+05; a step count of 200000 likewise.
  const auto chart = h::line_chart("c", "throughput", "step", {{"samples_per_s", {0, 200000}, {100000, 110000}}});
  CHECK(chart.find(">110000<") != std::string::npos);
  CHECK(chart.find(">200000<") != std::string::npos);
  CHECK(chart.find("e+0") == std::string::npos);
  CHECK(h::line_chart("c", "nothing", "step", {{"x", {1.0}, {std::nan("")}}}).empty());
}

TEST_CASE("StepHistory: a row every N steps with the mean loss and samples/s, group starts, cut back on resume", "[tracking][steps]") {
  TempDir dir;
  const auto path = dir / "steps.jsonl";
  {
    d::tracking::StepHistory h(path, 3);
    h.group_started(0, 0, /*attempt=*/0, /*world_size=*/2);
    std::int64_t samples = 0;
    for (int step = 1; step <= 7; ++step) {
      h.on_backward(torch::tensor(static_cast<float>(step)));
      if (step == 5) h.log({{"lr", 0.5}, {"note", "warm"}});
      if (step == 6) h.log({{"lr", 0.25}});  // the last value before the row wins
      samples += 64;
      h.on_step(step, 0, samples);
    }
  }
  auto rows = d::MetricsHistory::read_jsonl(path);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].at("event").text() == "start");
  CHECK(rows[0].at("world_size").number() == 2);
  CHECK(rows[0].at("step").number() == 0);
  CHECK(rows[1].at("step").number() == 3);
  CHECK(rows[1].at("loss").number() == 2.0);  // steps 1-3 (the group's first step starts the clock, its loss counts)
  CHECK(rows[1].at("samples_per_s").number() > 0);
  CHECK_FALSE(rows[1].count("lr"));
  CHECK(rows[2].at("step").number() == 6);
  CHECK(rows[2].at("loss").number() == 5.0);  // steps 4-6
  CHECK(rows[2].at("lr").number() == 0.25);
  CHECK(rows[2].at("note").text() == "warm");
  // A restarted group from the checkpoint at step 3: the rows after it go, the restart is recorded.
  d::tracking::StepHistory(path, 3).group_started(3, 0, /*attempt=*/1, 2);
  rows = d::MetricsHistory::read_jsonl(path);
  REQUIRE(rows.size() == 3);
  CHECK(rows[1].at("step").number() == 3);
  CHECK(rows[2].at("event").text() == "restart");
  d::tracking::StepHistory(path, 3).group_started(3, 0, /*attempt=*/0, 2);  // a later fit()
  CHECK(d::MetricsHistory::read_jsonl(path)[3].at("event").text() == "resume");
  // A long interval: the losses are folded into a partial sum as they come (every 256), same mean.
  const auto long_path = dir / "long.jsonl";
  d::tracking::StepHistory every600(long_path, 600);
  for (int step = 1; step <= 600; ++step) {
    every600.on_backward(torch::tensor(static_cast<float>(step)));
    every600.on_step(step, 0, 64 * step);
  }
  rows = d::MetricsHistory::read_jsonl(long_path);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].at("loss").number() == 300.5);
  // record_every = 0, and every rank but 0: nothing.
  d::tracking::StepHistory off(dir / "off.jsonl", 0);
  off.group_started(0, 0, 0, 1);
  off.on_step(10, 0, 640);
  CHECK_FALSE(std::filesystem::exists(dir / "off.jsonl"));
}

TEST_CASE("StepHistory: a file that cannot be written costs a warning, never the training", "[tracking][steps]") {
  TempDir dir;
  std::filesystem::create_directories(dir / "steps.jsonl");  // a directory where the file should be,
  std::ofstream(dir / "steps.jsonl" / "keep") << "x";         // not empty, so not removed
  d::tracking::StepHistory h(dir / "steps.jsonl", 1);
  CHECK_NOTHROW(h.group_started(0, 0, 0, 1));
  CHECK_FALSE(h.enabled());
  CHECK_NOTHROW(h.on_step(1, 0, 1));
  CHECK_NOTHROW(h.on_step(2, 0, 2));
}

TEST_CASE("tracker::mlflow<>: a failed run's meta.yaml, metrics, params and tags", "[tracking][mlflow]") {
  TempDir dir;
  const auto run = sample_run(dir / "r", "failed");
  using mlflow = d::tracker::mlflow<>;
  mlflow::start(run);
  const auto rdir = mlflow::run_directory(run);
  CHECK(slurp(rdir / "meta.yaml").find("status: 1\n") != std::string::npos);  // RUNNING
  CHECK(slurp(rdir / "meta.yaml").find("end_time: null\n") != std::string::npos);
  mlflow::end(run);
  const auto meta = slurp(rdir / "meta.yaml");
  CHECK(meta.find("status: 4\n") != std::string::npos);  // FAILED
  CHECK(meta.find("end_time: 1004000\n") != std::string::npos);
  CHECK(meta.find("start_time: 999500\n") != std::string::npos);
  CHECK(meta.find("run_id: " + rdir.filename().string() + "\n") != std::string::npos);
  CHECK(rdir.filename().string().size() == 32);
  CHECK(slurp(rdir / "metrics" / "loss") == "1001000 1.0 10\n1002000 0.5 20\n1003000 0.33333333333333331 30\n");
  CHECK(slurp(rdir / "metrics" / "a_b") == "1001000 0.5 10\n1002000 0.5 20\n1003000 0.5 30\n");  // '<' is not allowed
  CHECK_FALSE(std::filesystem::exists(rdir / "metrics" / "note"));  // text is not a metric
  CHECK_FALSE(std::filesystem::exists(rdir / "metrics" / "timestamp"));
  CHECK(slurp(rdir / "metrics" / "test" / "accuracy") == "1004000 0.75 30\n");
  CHECK(slurp(rdir / "params" / "train_loop_config.lr") == "0.001");
  CHECK(slurp(rdir / "params" / "train_loop_config.model") == "mlp");
  CHECK(slurp(rdir / "tags" / "mlflow.runName") == "r");
  CHECK(slurp(rdir / "tags" / "dtrain.outcome") == "failed");
  CHECK(slurp(rdir / "tags" / "mlflow.note.content") == "failed: training failed 2 times");
  // One store per storage path, the experiment named after the run, its id stable.
  const auto experiment = d::tracker::mlflow_detail::experiment_id("r");
  CHECK(rdir.parent_path() == dir / "mlruns" / experiment);
  CHECK(slurp(dir / "mlruns" / experiment / "meta.yaml").find("name: 'r'\n") != std::string::npos);
  CHECK(slurp(dir / "mlruns" / experiment / "meta.yaml").find("experiment_id: '" + experiment + "'\n") != std::string::npos);
  CHECK(slurp(dir / "mlruns" / experiment / "tags" / "mlflow.experimentKind") == "custom_model_development");
  CHECK_FALSE(std::filesystem::exists(dir / "r" / "mlruns"));
  CHECK(std::filesystem::exists(rdir / "artifacts" / "report.html"));
  CHECK(slurp(dir / "r" / "outcome.json").find("\"status\": \"failed\"") != std::string::npos);
  // Names MLflow would reject are made valid.
  CHECK(d::tracker::mlflow_detail::key("/a/../b c") == "a/__/b c");
  CHECK(d::tracker::mlflow_detail::key("val:loss") == "val_loss");  // ':' fails MLflow before mid-2024
  CHECK(d::tracker::mlflow_detail::value_text(2) == "2.0");
  CHECK(d::tracker::mlflow_detail::value_text(std::nan("")) == "nan");
}

TEST_CASE("tracker::mlflow<>: report() appends each row's lines while the run goes", "[tracking][mlflow]") {
  TempDir dir;
  auto run = sample_run(dir / "live", "running");
  run.history = {};
  using mlflow = d::tracker::mlflow<>;
  // Before start() there is no MLflow run to append to (a worker under an external launcher).
  mlflow::report(run, {{"loss", 2.0}, {"step", 1}, {"timestamp", 1000.0}});
  CHECK_FALSE(std::filesystem::exists(mlflow::run_directory(run) / "metrics" / "loss"));
  mlflow::start(run);
  const auto metrics = mlflow::run_directory(run) / "metrics";
  mlflow::report(run, {{"loss", 2.0}, {"val:acc", 0.5}, {"step", 10}, {"iteration", 1}, {"timestamp", 1001.0}});
  CHECK(slurp(metrics / "loss") == "1001000 2.0 10\n");
  mlflow::report(run, {{"loss", 1.0}, {"val:acc", 0.75}, {"step", 20}, {"iteration", 2}, {"timestamp", 1002.0}});
  CHECK(slurp(metrics / "loss") == "1001000 2.0 10\n1002000 1.0 20\n");
  CHECK(slurp(metrics / "val_acc") == "1001000 0.5 10\n1002000 0.75 20\n");
  CHECK_FALSE(std::filesystem::exists(metrics / "iteration"));
}

TEST_CASE("tracker::mlflow<>: runs of one storage path side by side in one store", "[tracking][mlflow]") {
  TempDir dir;
  using mlflow = d::tracker::mlflow<>;
  auto a = sample_run(dir / "a", "finished"), b = sample_run(dir / "b", "finished"), a2 = sample_run(dir / "a", "finished");
  a2.outcome["start_time"] = 2000.0;  // the same name run again: a second MLflow run of its experiment
  for (const auto* r : {&a, &b, &a2}) {
    mlflow::start(*r);
    mlflow::end(*r);
  }
  CHECK(mlflow::store(a.path) == dir / "mlruns");
  CHECK(mlflow::run_directory(a).parent_path() == mlflow::run_directory(a2).parent_path());
  CHECK(mlflow::run_directory(a) != mlflow::run_directory(a2));
  CHECK(mlflow::run_directory(a).parent_path() != mlflow::run_directory(b).parent_path());
  int experiments = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "mlruns")) experiments += e.path().filename() != ".trash";
  CHECK(experiments == 2);
  // Fixed ids: the same name, the same experiment, in any process.
  CHECK(d::tracker::mlflow_detail::experiment_id("a") == d::tracker::mlflow_detail::experiment_id("a"));
  CHECK(d::tracker::mlflow_detail::experiment_id("a") != d::tracker::mlflow_detail::experiment_id("b"));
  CHECK(d::tracker::mlflow<0>::experiment(a) == "0");
}

TEST_CASE("tracker::mlflow<>: the user from USER, LOGNAME, then the password database", "[tracking][mlflow]") {
  const char* user = std::getenv("USER");
  const char* logname = std::getenv("LOGNAME");
  const std::string saved_user = user ? user : "", saved_logname = logname ? logname : "";
  ::setenv("USER", "alice", 1);
  CHECK(d::tracker::mlflow_detail::user() == "alice");
  ::unsetenv("USER");
  ::setenv("LOGNAME", "bob", 1);
  CHECK(d::tracker::mlflow_detail::user() == "bob");
  ::unsetenv("LOGNAME");
  const passwd* pw = ::getpwuid(::getuid());
  CHECK(d::tracker::mlflow_detail::user() == (pw ? std::string(pw->pw_name) : std::string("unknown")));
  if (user) ::setenv("USER", saved_user.c_str(), 1);
  if (logname) ::setenv("LOGNAME", saved_logname.c_str(), 1);
}

TEST_CASE("Result::from_path reads a stopped run back and names what is not a run", "[tracking][result]") {
  TempDir dir;
  CHECK_THROWS_MATCHES(d::Result::from_path(dir / "nothing"), d::Error, MessageContains({"outcome.json is missing", "not a run directory"}));
  auto run = sample_run(dir / "s", "stopped");
  run.outcome["error"] = "stopped by SIGTERM to the driver";
  run.outcome["error_rank"] = nullptr;
  d::tracker::directory::start(run);
  for (const auto& row : run.history.rows()) d::MetricsHistory::append_jsonl(run.directory().history(), row);
  d::tracking::record_evaluation(run.directory(), run.evaluations.at(0));
  d::tracker::directory::end(run);
  const auto r = d::Result::from_path(dir / "s");
  CHECK(r.status == "stopped");
  REQUIRE(r.error);
  CHECK(r.error->status == "stopped");
  CHECK(r.error->rank == -1);
  CHECK(r.error->message == "stopped by SIGTERM to the driver");
  CHECK(r.restarts == 1);
  CHECK(r.metrics_history.size() == 3);
  CHECK(r.metrics.at("iteration").number() == 3);
  CHECK(r.best_checkpoints().empty());
  CHECK(r.evaluations.size() == 1);
}

TEST_CASE("tracker::none writes nothing", "[tracking]") {
  TempDir dir;
  const auto run = sample_run(dir / "r", "finished");
  d::tracker::none::start(run);
  d::tracker::none::end(run);
  CHECK(std::filesystem::is_empty(dir / "r"));
}

namespace {

torch::nn::Sequential tiny(std::int64_t hidden = 8) {
  return torch::nn::Sequential(torch::nn::Linear(4, hidden), torch::nn::Tanh(), torch::nn::Linear(hidden, 3));
}


}  // namespace

TEST_CASE("Predictor: class names and probabilities of every class, from a checkpoint", "[evaluation][predictor]") {
  TempDir dir;
  torch::manual_seed(1);
  auto trained = tiny();
  const auto path = dtrain_test::save_checkpoint(dir / "run", *trained);
  const auto x = torch::randn({5, 4});
  const auto expected = torch::softmax(trained->forward(x), 1);

  torch::manual_seed(2);  // other weights: the checkpoint must replace them
  auto p = d::evaluation::Predictor<torch::nn::Sequential>::from_checkpoint(path, tiny(), {"cat", "dog", "bird"});
  const auto out = p.predict(x);
  REQUIRE(out.size() == 5);
  CHECK(torch::allclose(out.probabilities(), expected, 1e-6, 1e-6));
  for (std::int64_t i = 0; i < out.size(); ++i) {
    const auto one = out[i];
    REQUIRE(one.probabilities.size() == 3);
    CHECK(one.probabilities[0] + one.probabilities[1] + one.probabilities[2] == Approx(1.0));
    CHECK(one.label == std::vector<std::string>{"cat", "dog", "bird"}[static_cast<std::size_t>(one.class_index)]);
    CHECK(one.class_index == expected[i].argmax().item<std::int64_t>());
  }
  // The best of a run directory, and a dataset predicted batch by batch into a confusion matrix.
  auto best = d::evaluation::Predictor<torch::nn::Sequential>::best(dir / "run", {.score_attribute = "score"}, tiny());
  d::evaluation::ConfusionMatrix cm(3);
  const auto all = best.predict(d::data::TensorDataset(x, torch::tensor({0, 1, 2, 0, 1})), 2, &cm);
  CHECK(torch::allclose(all.probabilities(), expected, 1e-6, 1e-6));
  CHECK(cm.total() == 5);
  CHECK(all[0].label == std::to_string(all[0].class_index));  // no names given: the index
}

TEST_CASE("Predictor: a missing, damaged or mismatched checkpoint gets a clear error", "[evaluation][predictor]") {
  using P = d::evaluation::Predictor<torch::nn::Sequential>;
  TempDir dir;
  CHECK_THROWS_MATCHES(P::from_checkpoint(dir / "nowhere", tiny()), d::ConfigError,
                       MessageContains({"no checkpoint at", "nowhere", "Result::best_checkpoint()"}));
  std::filesystem::create_directories(dir / "empty");
  CHECK_THROWS_MATCHES(P::from_checkpoint(dir / "empty", tiny()), d::ConfigError,
                       MessageContains({"is not a usable checkpoint", "no manifest.json"}));
  CHECK_THROWS_MATCHES(P::best(dir / "empty", {}, tiny()), d::ConfigError, MessageContains({"holds no valid checkpoint"}));
  CHECK_THROWS_MATCHES(P::best(dir / "no_run", {}, tiny()), d::ConfigError, MessageContains({"no run directory at"}));

  auto model = tiny();
  const auto path = dtrain_test::save_checkpoint(dir / "run", *model);
  // Damaged: a byte of the model file flipped.
  std::filesystem::copy(path, dir / "damaged", std::filesystem::copy_options::recursive);
  {
    std::fstream f(dir / "damaged" / "model.pt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  CHECK_THROWS_MATCHES(P::from_checkpoint(dir / "damaged", tiny()), d::ConfigError,
                       MessageContains({"is not a usable checkpoint", "CRC-32"}));
  // Another architecture.
  CHECK_THROWS_MATCHES(P::from_checkpoint(path, tiny(16)), d::ConfigError,
                       MessageContains({"does not fit the model", "shape"}));
  // Names that do not match the classes.
  auto p = P::from_checkpoint(path, tiny(), {"a", "b"});
  CHECK_THROWS_MATCHES(p.predict(torch::randn({2, 4})), d::ConfigError,
                       MessageContains({"3 scores per sample but 2 class names"}));
}

TEST_CASE("Every report carries Ray's timing columns, time_total_s counted on from a resumed checkpoint", "[tracking]") {
  d::tracking::ReportTiming timing;
  timing.start({{"time_total_s", 100.0}, {"loss", 0.5}});
  timing.add_samples(30);
  timing.add_samples(34);
  CHECK(timing.take_samples() == 64);
  CHECK(timing.take_samples() == 0);  // counting starts again at each report
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  d::Metrics row;
  const double iter = timing.fill_times(row);
  d::tracking::ReportTiming::fill_rate(row, 128.0, iter);
  CHECK(row.at("time_this_iter_s").number() == iter);
  CHECK(iter >= 0.02);
  CHECK(row.at("time_total_s").number() >= 100.02);
  CHECK(row.at("time_total_s").number() < 101);
  CHECK(row.at("samples_per_s").number() == Approx(128.0 / iter));
  d::Metrics own{{"samples_per_s", 7.0}};  // the loop's own value wins
  d::tracking::ReportTiming::fill_rate(own, 128.0, timing.fill_times(own));
  CHECK(own.at("samples_per_s").number() == 7.0);
  d::tracking::ReportTiming fresh;
  fresh.start();
  d::Metrics first;
  fresh.fill_times(first);
  CHECK(first.at("time_total_s").number() < 1);
}

TEST_CASE("BatchPredictConfig: bad values are clear errors before any worker starts", "[evaluation][predictor]") {
  using C = d::evaluation::BatchPredictConfig;
  CHECK_NOTHROW(C{.output = "out"}.validate());
  CHECK_THROWS_MATCHES(C{}.validate(), d::ConfigError, MessageContains({"output is empty"}));
  CHECK_THROWS_MATCHES((C{.output = "out", .batch = 0}).validate(), d::ConfigError, MessageContains({"batch must be at least 1"}));
  CHECK_THROWS_MATCHES((C{.output = "out", .batch = 7, .part_size = 50}).validate(), d::ConfigError,
                       MessageContains({"part_size must be a positive multiple of batch (7), got 50", "e.g. 49",
                                        "leave it 0 (the default)"}));
  CHECK_THROWS_MATCHES((C{.output = "out", .batch = 8, .part_size = -8}).validate(), d::ConfigError,
                       MessageContains({"part_size must be a positive multiple of batch (8), got -8"}));
  CHECK(C{.output = "o", .batch = 7, .part_size = 49}.part_samples() == 49);
  CHECK(C{.output = "o", .format = d::evaluation::PredictionFormat::jsonl}.extension() == ".jsonl");
}

// The default part size was 4096 whatever the batch: a batch of 40 was refused, after training.
TEST_CASE("BatchPredictConfig: the default part size fits any batch", "[evaluation][predictor]") {
  using C = d::evaluation::BatchPredictConfig;
  CHECK_NOTHROW(C{.output = "out", .batch = 40}.validate());
  CHECK(C{.output = "out", .batch = 40}.part_samples() == 4080);  // 102 batches
  CHECK(C{.output = "out"}.part_samples() == 4096);               // batch 256: 16 batches, as before
  CHECK(C{.output = "out", .batch = 5000}.part_samples() == 5000);  // one batch a part
  CHECK_NOTHROW(C{.output = "out", .batch = 5000}.validate());
}

namespace {

/// The records of a TFRecord file, each checked: its length's and its data's masked CRC32C.
std::vector<std::string> tf_records(const std::filesystem::path& file) {
  namespace td = d::tracker::tensorboard_detail;
  const std::string bytes = slurp(file);
  std::vector<std::string> out;
  auto little = [&](std::size_t at, int n) {  // n bytes, little endian
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(bytes.at(at + i));
    return v;
  };
  auto u64 = [&](std::size_t at) { return little(at, 8); };
  auto u32 = [&](std::size_t at) { return static_cast<std::uint32_t>(little(at, 4)); };
  for (std::size_t at = 0; at < bytes.size();) {
    REQUIRE(at + 12 <= bytes.size());
    const auto n = u64(at);
    REQUIRE(u32(at + 8) == td::masked_crc(bytes.substr(at, 8)));
    REQUIRE(at + 12 + n + 4 <= bytes.size());
    out.push_back(bytes.substr(at + 12, n));
    REQUIRE(u32(at + 12 + n) == td::masked_crc(out.back()));
    at += 12 + n + 4;
  }
  return out;
}

}  // namespace

TEST_CASE("tracker::tensorboard<>: CRC32C, the protobuf encoding and TFRecord framing", "[tracking][tensorboard]") {
  namespace td = d::tracker::tensorboard_detail;
  CHECK(td::crc32c("123456789") == 0xE3069283u);  // the CRC-32C check value
  CHECK(td::crc32c("") == 0u);
  CHECK(td::varint(0) == std::string(1, '\0'));
  CHECK(td::varint(300) == "\xAC\x02");
  CHECK(td::int_field(2, -1).size() == 11);  // a negative int64 is 10 bytes after its key
  CHECK(td::double_field(1, 1.0) == std::string("\x09\x00\x00\x00\x00\x00\x00\xF0\x3F", 9));
  CHECK(td::float_field(2, 1.0f) == std::string("\x15\x00\x00\x80\x3F", 5));
  CHECK(td::bytes_field(3, "ab") == "\x1A\x02" "ab");
  const auto rec = td::record("xyz");
  CHECK(rec.size() == 8 + 4 + 3 + 4);
}

TEST_CASE("tracker::tensorboard<>: the event file of a run, live and at its end", "[tracking][tensorboard]") {
  namespace td = d::tracker::tensorboard_detail;
  TempDir dir;
  auto run = sample_run(dir / "r", "finished");
  const auto history = run.history;
  run.history = {};
  using tb = d::tracker::tensorboard<>;
  // Before start() there is no event file to append to (a worker under an external launcher).
  tb::report(run, history.rows().front());
  CHECK_FALSE(std::filesystem::exists(dir / "r" / "tensorboard"));
  tb::start(run);
  CHECK(std::filesystem::exists(dir / "r" / "params.json"));  // tracker::directory's files too
  const auto file = tb::event_file(run);
  REQUIRE_FALSE(file.empty());
  CHECK(file.parent_path() == dir / "r" / "tensorboard");
  CHECK(file.filename().string().rfind("events.out.tfevents.999.", 0) == 0);
  CHECK(file.filename().string().size() > 4);
  CHECK(file.filename().string().substr(file.filename().string().size() - 4) == ".500");
  auto records = tf_records(file);
  REQUIRE(records.size() == 2);
  CHECK(records[0] == td::double_field(1, 999.5) + td::int_field(2, 0) + td::bytes_field(3, "brain.Event:2"));
  CHECK(records[1].find("| train_loop_config.model | mlp |") != std::string::npos);
  for (const auto& row : history.rows()) tb::report(run, row);
  records = tf_records(file);
  REQUIRE(records.size() == 5);
  // The first report: wall time 1001, step 10; scalars a<b, epoch, loss (not iteration, note, step, timestamp).
  CHECK(records[2] == td::double_field(1, 1001.0) + td::int_field(2, 10) +
                          td::bytes_field(5, td::bytes_field(1, td::scalar_value("a<b", 0.5)) +
                                                 td::bytes_field(1, td::scalar_value("epoch", 0)) +
                                                 td::bytes_field(1, td::scalar_value("loss", 1.0))));
  run.history = history;
  tb::end(run);
  const auto final_records = tf_records(file);
  REQUIRE(final_records.size() == 6);  // version, params, 3 reports, the evaluation
  CHECK(std::vector<std::string>(final_records.begin(), final_records.begin() + 5) == records);
  CHECK(final_records[5].find(td::scalar_value("test/accuracy", 0.75)) != std::string::npos);
  CHECK(final_records[5].find(td::int_field(2, 30)) != std::string::npos);  // at the last step
  CHECK(std::distance(std::filesystem::directory_iterator(dir / "r" / "tensorboard"), {}) == 1);  // no .tmp left
}

TEST_CASE("tracker::tensorboard<>: a run directory where the event files cannot go", "[tracking][tensorboard]") {
  TempDir dir;
  const auto run = sample_run(dir / "r", "running");
  std::ofstream(dir / "r" / "tensorboard") << "a file in the way";
  CHECK_THROWS_MATCHES(d::tracker::tensorboard<>::start(run), d::Error,
                       MessageContains({"tracker::tensorboard", "tensorboard cannot be made a directory",
                                        "Check that the run directory is writable"}));
}
