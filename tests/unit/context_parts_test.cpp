// SPDX-License-Identifier: Apache-2.0
// The parts the worker context is built from: the group protocol, the epoch cursor, the run
// directory, the prepared-model registry, the progress meter, the shard view with a first batch
// and an observer (tests/laws/checkpointer.hpp lends its ranks-as-threads helpers).

#include "support.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <dtrain/dtrain.hpp>

#include "../laws/checkpointer.hpp"

namespace d = dtrain;
using dtrain_test::TempDir;
using dtrain_laws::group_of;
using dtrain_laws::on_ranks;

TEST_CASE("Group: a barrier waits for every rank and names what it waited at", "[context][group]") {
  const auto store = c10::make_intrusive<c10d::HashStore>();
  auto g = group_of(3, 0, store);
  std::atomic<int> passed{0};
  on_ranks(3, [&](int r) {
    g[static_cast<std::size_t>(r)].arrive("report/1", "report() call 1", 1);
    ++passed;
  });
  CHECK(passed == 3);
}

TEST_CASE("Group: a rank that left the loop with fewer reports fails the others' barrier at once", "[context][group]") {
  const auto store = c10::make_intrusive<c10d::HashStore>();
  auto g = group_of(2, 0, store);
  std::string error, rank1_error;
  on_ranks(2, [&](int r) {
    if (r == 1) {
      // Left after 0 reports; its finish waits for rank 0, whose failure then ends the wait.
      try {
        g[1].finish(0);
      } catch (const d::WorkerError& e) {
        rank1_error = e.what();
      }
      return;
    }
    try {
      g[0].arrive("report/1", "report() call 1", 1);
    } catch (const d::WorkerError& e) {
      error = e.what();
      store->add(g[0].key("errors"), 1);  // as a failed worker records it, which ends rank 1's wait
    }
  });
  CHECK_THAT(error, Catch::Contains("rank 1 returned from the train loop after 0 report() calls") &&
                        Catch::Contains("report() call 1"));
  CHECK_THAT(rank1_error, Catch::Contains("another rank failed"));
}

TEST_CASE("Group: finish compares every rank's report count", "[context][group]") {
  const auto store = c10::make_intrusive<c10d::HashStore>();
  auto g = group_of(2, 0, store);
  std::vector<std::string> errors(2);
  on_ranks(2, [&](int r) {
    try {
      g[static_cast<std::size_t>(r)].finish(r == 0 ? 2 : 3);
    } catch (const d::WorkerError& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  CHECK_THAT(errors[0], Catch::Contains("rank 1 called report() 3 times and rank 0 2 times"));
  CHECK_THAT(errors[1], Catch::Contains("every rank must call report() equally often"));
}

TEST_CASE("Group: rank 0 decides for every rank and its error reaches them", "[context][group]") {
  const auto store = c10::make_intrusive<c10d::HashStore>();
  auto g = group_of(3, 0, store);
  std::vector<std::string> answers(3);
  on_ranks(3, [&](int r) { answers[static_cast<std::size_t>(r)] = g[static_cast<std::size_t>(r)].decide("x", [] { return std::string("42"); }); });
  CHECK(answers == std::vector<std::string>{"42", "42", "42"});
  std::vector<std::string> errors(3);
  on_ranks(3, [&](int r) {
    try {
      g[static_cast<std::size_t>(r)].decide("y", []() -> std::string { throw d::ConfigError("no disk"); });
    } catch (const d::Error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  CHECK(errors[0] == "no disk");
  CHECK_THAT(errors[2], Catch::Contains("rank 0 could not decide y: no disk"));
}

TEST_CASE("Group: an empty decision reaches every rank and is never stored as an empty value", "[context][group]") {
  // LibTorch 1.13's TCPStore leaves a socket corked (40-250 ms) after writing an empty value.
  const auto store = c10::make_intrusive<c10d::HashStore>();
  auto g = group_of(2, 0, store);
  std::vector<std::string> answers(2, "unset");
  on_ranks(2, [&](int r) { answers[static_cast<std::size_t>(r)] = g[static_cast<std::size_t>(r)].decide("fresh", [] { return std::string(); }); });
  CHECK(answers == std::vector<std::string>{"", ""});
  CHECK_FALSE(store->get(g[0].key("fresh")).empty());
}

TEST_CASE("EpochCursor: a resumed epoch skips its trained batches once and rolls over at its end", "[context][cursor]") {
  d::sampler::EpochCursor c;
  c.resume(2, 3);
  CHECK(c.first_epoch() == 2);
  c.begin_epoch(2);
  const auto first = c.open(320);
  CHECK(c.begin_shard(first, 10) == 3);  // the resumed shard skips 3
  c.reached(first, 3);
  c.trained();
  CHECK(c.position() == 4);
  CHECK(c.resume_point() == std::pair<std::int64_t, std::int64_t>{2, 4});
  const auto second = c.open(320);
  CHECK(c.begin_shard(second, 10) == 0);  // a second shard in the same epoch starts over
  c.reached(second, 9);
  c.trained();
  CHECK(c.resume_point() == std::pair<std::int64_t, std::int64_t>{3, 0});  // after the last batch
  c.begin_epoch(3);
  CHECK(c.position() == 0);
  CHECK(c.begin_shard(c.open(320), 10) == 0);
}

// issue 18: `--max-steps 100` then `--resume` skipped a batch: the view had advanced the position
// to the batch the loop broke out on before training it.
TEST_CASE("EpochCursor: a batch the loop breaks out on before training it is not counted as trained", "[context][cursor]") {
  d::sampler::EpochCursor c;
  c.begin_epoch(0);
  const auto s = c.open(60000);
  CHECK(c.begin_shard(s, 469) == 0);
  for (std::int64_t b = 0; b < 100; ++b) {
    c.reached(s, b);
    c.trained();
  }
  c.reached(s, 100);  // handed out, then `if (done()) break;`
  CHECK(c.resume_point() == std::pair<std::int64_t, std::int64_t>{0, 100});
  c.reached(s, 101);  // taking the next batch of the training shard finishes the last
  CHECK(c.position() == 101);
}

TEST_CASE("EpochCursor: a loop that trains with a plain backward and step keeps its first shard's position", "[context][cursor]") {
  // No ctx.backward or ctx.step names the training shard: the epoch's first is taken for it, so an
  // evaluation after it moves nothing (taking a batch finishes the ones before it).
  d::sampler::EpochCursor c;
  c.begin_epoch(1);
  const auto train = c.open(640);
  c.begin_shard(train, 10);
  for (std::int64_t b = 0; b < 10; ++b) c.reached(train, b);
  const auto eval = c.open(64);
  c.begin_shard(eval, 2);
  c.reached(eval, 0);
  CHECK(c.position() == 9);
  CHECK(c.resume_samples() == 640);
  CHECK(c.resume_point() == std::pair<std::int64_t, std::int64_t>{1, 9});
}

TEST_CASE("EpochCursor: ctx.end_epoch() makes a checkpoint resume at the next epoch", "[context][cursor]") {
  d::sampler::EpochCursor c;
  c.begin_epoch(4);
  const auto s = c.open(100);
  c.begin_shard(s, 10);
  c.reached(s, 2);
  c.trained();
  c.end_epoch();
  CHECK(c.resume_point() == std::pair<std::int64_t, std::int64_t>{5, 0});
  c.begin_epoch(5);
  CHECK_FALSE(c.ended());
  CHECK(c.resume_point() == std::pair<std::int64_t, std::int64_t>{5, 0});
}

TEST_CASE("EpochCursor: another worker count continues the epoch from its global sample offset", "[context][cursor][elastic]") {
  d::sampler::EpochCursor c;
  c.begin_epoch(0);
  const auto s = c.open(1008);
  CHECK_FALSE(c.continue_from(s, 48).has_value());  // a fresh epoch
  c.begin_shard(s, 21);
  for (std::int64_t b = 0; b < 6; ++b) {
    c.reached(s, b);
    c.trained();
  }
  CHECK(c.resume_offset() == 6 * 48);
  // Resumed by 2 workers (the checkpoint was 3 workers'): the rest of the epoch is dealt from 288.
  d::sampler::EpochCursor two;
  two.resume(0, 6, 288, /*redeal=*/true, 1008);
  two.begin_epoch(0);
  const auto t = two.open(1008);
  CHECK(two.continue_from(t, 48) == std::optional<std::int64_t>(288));
  CHECK(two.begin_shard(t, 15) == 0);  // the re-dealt shard skips nothing
  for (std::int64_t b = 0; b < 6; ++b) {
    two.reached(t, b);
    two.trained();
  }
  CHECK(two.resume_point() == std::pair<std::int64_t, std::int64_t>{0, 6});
  CHECK(two.resume_offset() == 288 + 6 * 48);
  // The same count again from that checkpoint: its position is the re-dealt shard's, so the
  // offset (not the position) says where the epoch stands.
  d::sampler::EpochCursor again;
  again.resume(0, 6, 576, /*redeal=*/false);
  again.begin_epoch(0);
  CHECK(again.continue_from(again.open(1008), 48) == std::optional<std::int64_t>(576));
  // A checkpoint of the same count whose offset is its position's: batches are skipped as before.
  d::sampler::EpochCursor same;
  same.resume(0, 6, 288, /*redeal=*/false);
  same.begin_epoch(0);
  const auto u = same.open(1008);
  CHECK_FALSE(same.continue_from(u, 48).has_value());
  CHECK(same.begin_shard(u, 21) == 6);
  // At the epoch's end the offset is the next epoch's start.
  for (std::int64_t b = 6; b < 21; ++b) {
    same.reached(u, b);
    same.trained();
  }
  CHECK(same.resume_offset() == 0);
}

// An evaluation with the Trainer's Sampler between the training shard and ctx.checkpoint() saved
// its own position: a restart re-trained the epoch, and the resumed position cut the next evaluation.
TEST_CASE("EpochCursor: each shard keeps its own position, and the one trained on is saved and resumed", "[context][cursor]") {
  d::sampler::EpochCursor c;
  c.begin_epoch(0);
  const auto train = c.open(1000);
  c.continue_from(train, 10);
  CHECK(c.begin_shard(train, 100) == 0);
  for (std::int64_t b = 0; b < 40; ++b) {
    c.reached(train, b);
    c.trained();
  }
  const auto eval = c.open(140);  // evaluated mid-epoch: batches handed out, none trained
  c.continue_from(eval, 10);
  CHECK(c.begin_shard(eval, 14) == 0);
  for (std::int64_t b = 0; b < 14; ++b) c.reached(eval, b);
  CHECK(c.position() == 40);
  CHECK(c.epoch_batches() == 100);
  CHECK(c.resume_point() == std::pair<std::int64_t, std::int64_t>{0, 40});
  CHECK(c.resume_offset() == 400);
  CHECK(c.resume_samples() == 1000);

  // Resumed: an evaluation first (another size) runs whole; the training shard skips 40.
  d::sampler::EpochCursor r;
  r.resume(0, 40, 400, false, 1000);
  r.begin_epoch(0);
  CHECK(r.resume_point() == std::pair<std::int64_t, std::int64_t>{0, 40});  // nothing begun yet
  const auto e = r.open(140);
  CHECK_FALSE(r.continue_from(e, 10).has_value());
  CHECK(r.begin_shard(e, 14) == 0);
  for (std::int64_t b = 0; b < 14; ++b) r.reached(e, b);
  CHECK(r.resume_point() == std::pair<std::int64_t, std::int64_t>{0, 40});
  const auto t = r.open(1000);
  CHECK_FALSE(r.continue_from(t, 10).has_value());
  CHECK(r.begin_shard(t, 100) == 40);
  r.reached(t, 40);
  r.trained();
  CHECK(r.resume_point() == std::pair<std::int64_t, std::int64_t>{0, 41});
  // At the epoch's end, an evaluation then a checkpoint: the next epoch's start.
  for (std::int64_t b = 41; b < 100; ++b) {
    r.reached(t, b);
    r.trained();
  }
  const auto last = r.open(140);
  r.begin_shard(last, 14);
  r.reached(last, 0);
  CHECK(r.resume_point() == std::pair<std::int64_t, std::int64_t>{1, 0});
  CHECK(r.resume_offset() == 0);
  // A loop that checkpoints before it trains in an epoch saves the epoch's start.
  r.begin_epoch(1);
  const auto early = r.open(140);
  r.begin_shard(early, 14);
  r.reached(early, 5);
  CHECK(r.resume_point() == std::pair<std::int64_t, std::int64_t>{1, 0});
}

TEST_CASE("EpochCursor: a resumed position that an evaluation of the same size took is refused at the first step", "[context][cursor]") {
  d::sampler::EpochCursor c;
  c.resume(3, 22, 704, false, 1024);
  c.begin_epoch(3);
  const auto eval = c.open(1024);  // the same size: it takes the position
  CHECK(c.begin_shard(eval, 32) == 22);
  for (std::int64_t b = 22; b < 32; ++b) c.reached(eval, b);
  const auto train = c.open(1024);
  CHECK(c.begin_shard(train, 32) == 0);
  c.reached(train, 0);
  CHECK_THROWS_WITH(c.trained(), Catch::Contains("22 batches into epoch 3 of a split of 1024 samples") &&
                                     Catch::Contains("dtrain::sampler::sequential{}"));
  // A training split of another size than the checkpoint's: no shard matched, refused too.
  d::sampler::EpochCursor other;
  other.resume(0, 5, 50, false, 1024);
  other.begin_epoch(0);
  const auto s = other.open(512);
  CHECK(other.begin_shard(s, 16) == 0);
  other.reached(s, 0);
  CHECK_THROWS_WITH(other.trained(), Catch::Contains("no shard of this epoch matched it"));
}

TEST_CASE("RunDirectory: names - the checkpoint listing newest first and a path that cannot be one", "[context][run_directory]") {
  TempDir tmp;
  const d::RunDirectory dir(tmp / "run");
  dir.create();
  CHECK(d::RunDirectory::checkpoint_name(42) == "checkpoint_000042");
  CHECK(d::RunDirectory::iteration_of("checkpoint_000042") == 42);
  CHECK_FALSE(d::RunDirectory::iteration_of("checkpoint_x"));
  CHECK_FALSE(d::RunDirectory::iteration_of(".tmp_checkpoint_000001"));
  for (int i : {2, 10, 1}) std::filesystem::create_directories(dir.checkpoint(i));
  std::filesystem::create_directories(dir.temporary_checkpoint(11));
  std::vector<std::int64_t> order;
  for (const auto& [it, p] : dir.checkpoints()) order.push_back(it);
  CHECK(order == std::vector<std::int64_t>{10, 2, 1});
  dir.remove_unfinished_checkpoints();
  CHECK_FALSE(std::filesystem::exists(dir.temporary_checkpoint(11)));
  CHECK(dir.history() == tmp / "run" / "metrics.jsonl");
  std::ofstream(tmp / "file") << "x";
  CHECK_THROWS_WITH(d::RunDirectory(tmp / "file").create(),
                    Catch::Contains("cannot be created") && Catch::Contains("RunConfig::storage_path"));
}

namespace {
struct counting_state {
  int syncs_off = 0;
  counting_state(torch::nn::Module&, int&) {}
  void set_sync(bool on) { syncs_off += on ? 0 : 1; }
};
}  // namespace

TEST_CASE("PreparedModels: finds the state of a prepared model and names the call for any other", "[context][models]") {
  d::PreparedModels<counting_state> models;
  torch::nn::Linear a(2, 2), b(2, 2);
  int comm = 0;
  models.add(*a, comm);
  CHECK(models.find(a) == &models.at(0));
  CHECK(models.find(b) == nullptr);
  CHECK_THROWS_WITH(models.of(b, "ctx.forward(model, ...)"),
                    Catch::Contains("ctx.forward(model, ...)") && Catch::Contains("ctx.prepare_model"));
  torch::optim::SGD sgd(a->parameters(), 0.1);
  CHECK(models.first_sight(sgd));
  CHECK_FALSE(models.first_sight(sgd));
}

TEST_CASE("ProgressMeter: rates from the group's first step - drawn when due and a final line", "[context][progress]") {
  TempDir tmp;
  const auto path = tmp / "progress.txt";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  {
    d::ProgressConfig config;
    config.interval = std::chrono::milliseconds(1);
    d::tracking::ProgressMeter meter(config, true, fd, /*terminal=*/false);
    meter.set_epochs(2);
    meter.on_backward(torch::tensor(0.5));
    for (int s = 1; s <= 3; ++s) {
      meter.add_samples(64);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      meter.on_step(s, 0, 10);
    }
    meter.close(3, 0, 10, /*finished=*/false);
  }
  ::close(fd);
  std::ifstream in(path);
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  CHECK_THAT(text, Catch::Contains("epoch 1/2 | step 3/20 (15%)") && Catch::Contains("loss 0.5000"));
}

// Issue 30: a per-epoch step cap (ctx.end_epoch(); break;) left the total at the full epochs, and a
// finished run's last line read "step 120/2814 (4%) ... ETA 13:57".
TEST_CASE("ProgressMeter: a per-epoch step cap counts the epochs as capped - a finished run ends at 100%", "[context][progress]") {
  TempDir tmp;
  const auto path = tmp / "progress.txt";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  {
    d::ProgressConfig config;
    config.interval = std::chrono::milliseconds(1);
    d::tracking::ProgressMeter meter(config, true, fd, /*terminal=*/false);
    meter.set_epochs(3);
    std::int64_t steps = 0;
    for (std::int64_t epoch = 0; epoch < 3; ++epoch) {  // 938 batches an epoch, 4 steps of each
      meter.begin_epoch(steps);
      for (int b = 0; b < 4; ++b) {
        meter.add_samples(64);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        meter.on_step(++steps, epoch, 938);
      }
      meter.end_epoch_early(steps);
    }
    meter.close(steps, 2, 938, /*finished=*/true);
  }
  ::close(fd);
  std::ifstream in(path);
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  INFO(text);
  CHECK_THAT(text, Catch::Contains("epoch 1/3 | step 3/2814") && Catch::Contains("epoch 2/3 | step 6/12 (50%)") &&
                       Catch::Contains("epoch 3/3 | step 12/12 (100%)") && Catch::EndsWith("ETA 00:00\n"));
  CHECK_THAT(text, !Catch::Contains("step 12/2814"));
}

TEST_CASE("ProgressMeter: a run cut short by a stop keeps its total", "[context][progress]") {
  TempDir tmp;
  const auto path = tmp / "progress.txt";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  {
    d::ProgressConfig config;
    config.interval = std::chrono::hours(1);  // only the final line
    d::tracking::ProgressMeter meter(config, true, fd, /*terminal=*/false);
    meter.set_epochs(2);
    meter.begin_epoch(0);
    for (int s = 1; s <= 5; ++s) meter.on_step(s, 0, 10);
    meter.close(5, 0, 10, /*finished=*/false);
  }
  ::close(fd);
  std::ifstream in(path);
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  CHECK_THAT(text, Catch::Contains("epoch 1/2 | step 5/20 (25%)"));
}

TEST_CASE("data::batches from a first batch tells its observer each batch gathered", "[context][shard]") {
  d::data::TensorDataset ds(torch::arange(10).unsqueeze(1), torch::arange(10));
  std::vector<std::pair<std::int64_t, std::int64_t>> seen;
  std::vector<std::int64_t> firsts;
  for (const auto& b : d::data::batches(ds, {9, 8, 7, 6, 5, 4, 3}, 3, 1, [&](std::int64_t i, std::int64_t n) { seen.emplace_back(i, n); }))
    firsts.push_back(b.target[0].item<std::int64_t>());
  CHECK(firsts == std::vector<std::int64_t>{6, 3});
  CHECK(seen == std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 3}, {2, 1}});
}

TEST_CASE("Trainer::uses_gpu is the backend's choice", "[context][config]") {
  using Cpu = d::Trainer<torch::nn::Sequential, d::data::TensorDataset>;
  STATIC_REQUIRE_FALSE(Cpu::uses_gpu);
  const auto params = d::tracking::params_json<Cpu::policies>({.num_workers = 2}, {});
  CHECK(params["scaling"]["use_gpu"] == false);
}

TEST_CASE("MetricsHistory::truncate_jsonl keeps the rows up to a resumed iteration - intact", "[context][history]") {
  TempDir tmp;
  const auto path = tmp / "metrics.jsonl";
  for (int i = 1; i <= 4; ++i) d::MetricsHistory::append_jsonl(path, {{"iteration", i}, {"epoch", 0}, {"loss", 1.0 / i}});
  const auto before = d::MetricsHistory::read_jsonl(path);
  d::MetricsHistory::truncate_jsonl(path, "iteration", 3);
  const auto after = d::MetricsHistory::read_jsonl(path);
  REQUIRE(after.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(after[i] == before[i]);
  std::int64_t iterations = 0;
  for (const auto& row : after) iterations += static_cast<std::int64_t>(row.at("iteration").number());
  CHECK(iterations == 1 + 2 + 3);  // a range-for over the rows, in report order
  d::MetricsHistory::truncate_jsonl(path, "iteration", 0);  // a fresh start
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("A worker's signal handlers turn a write to a closed peer into EPIPE, not a death by SIGPIPE", "[launch]") {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // the worker: its handlers, then a write into a pipe nobody reads any more
    ::signal(SIGPIPE, SIG_DFL);  // whatever this test's parent left: the handlers must ignore it
    dtrain::launch::install_worker_signal_handlers();
    int fds[2];
    if (::pipe(fds) != 0) ::_exit(3);
    ::close(fds[0]);
    const auto written = ::write(fds[1], "x", 1);
    ::_exit(written < 0 && errno == EPIPE ? 0 : 2);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO("signalled " << WIFSIGNALED(status) << ", signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0));
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
