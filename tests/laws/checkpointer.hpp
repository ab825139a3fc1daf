// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Checkpointer laws (concept/checkpointer.hpp), for any model of the concept: ranks are threads
// of this process sharing an in-memory store, each with its own checkpointer state, as the workers
// of one group would be.

#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/retention.hpp>
#include <dtrain/concept/checkpointer.hpp>
#include <dtrain/launch/group.hpp>
#include <dtrain/run_directory.hpp>

#include "../dtrain_catch.hpp"

namespace dtrain_laws {

/// Runs f(rank) on `world` threads at once and rethrows the first exception.
inline void on_ranks(int world, const std::function<void(int)>& f) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        f(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// One group of `world` ranks over `store`, restarted `attempt` times before.
inline std::vector<dtrain::launch::Group> group_of(int world, int attempt, const c10::intrusive_ptr<c10d::Store>& store) {
  std::vector<dtrain::launch::Group> g;
  for (int r = 0; r < world; ++r) {
    dtrain::launch::WorkerIdentity who;
    who.rank = r;
    who.world_size = world;
    who.attempt = attempt;
    g.emplace_back(who, store, std::chrono::seconds(20));
  }
  return g;
}

/// Rank `rank`'s snapshot at `step`: a small model's state on rank 0, its own position everywhere.
inline dtrain::checkpointer::Snapshot snapshot_at(int rank, std::int64_t step) {
  dtrain::checkpointer::Snapshot s;
  torch::manual_seed(step);
  torch::nn::Linear model(3, 2);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  s.has_model = rank == 0;
  if (rank == 0) {
    s.model = dtrain::checkpointer::detail::named_state(*model, true);
    s.optimizer = dtrain::checkpointer::detail::optimizer_bytes(sgd);
  }
  s.generator = dtrain::checkpointer::detail::default_generator_state();
  s.epoch = step / 10;
  s.position = step % 10;  // a group steps in lockstep: every rank at the same position
  s.offset = s.position * 8;
  s.steps = step;
  s.extras = {{"step_extra", step}};
  return s;
}

/// Saves checkpoints of `iterations` (scores from `score`) with one group, then starts a second
/// group, as a restart would, and returns every rank's resumed() checkpoint path ("" for none).
template <class Policy>
std::vector<std::string> save_then_resume(const std::filesystem::path& storage, int world,
                                          const std::vector<std::int64_t>& iterations,
                                          const std::function<double(std::int64_t)>& score,
                                          const dtrain::CheckpointConfig& config = {}) {
  using state = typename Policy::state;
  const auto store = c10::make_intrusive<c10d::HashStore>();
  const dtrain::RunConfig run{.storage_path = storage, .name = "laws", .checkpoint = config};
  auto first = group_of(world, 0, store);
  on_ranks(world, [&](int r) {
    state s(first[static_cast<std::size_t>(r)], run);
    for (const auto it : iterations) {
      s.wait();
      s.save(snapshot_at(r, it * 5), it, {{"score", score(it)}, {"iteration", it}});
    }
    s.finish();
  });
  std::vector<std::string> resumed(static_cast<std::size_t>(world));
  auto second = group_of(world, 1, store);
  on_ranks(world, [&](int r) {
    state s(second[static_cast<std::size_t>(r)], run);
    if (s.resumed()) resumed[static_cast<std::size_t>(r)] = s.resumed()->path().string();
  });
  return resumed;
}

/// The laws for a Checkpointer that persists.
template <class Policy>
void check_persisting_checkpointer(const std::filesystem::path& storage) {
  static_assert(dtrain::CheckpointerPolicy<Policy>);
  static_assert(Policy::state::persists);
  for (int world : {1, 2, 3}) {
    const auto root = storage / ("world" + std::to_string(world));
    SECTION("round trip, atomic, same answer on every rank: world size " + std::to_string(world)) {
      const auto resumed = save_then_resume<Policy>(root, world, {1, 2, 3}, [](std::int64_t) { return 0.0; });
      const dtrain::RunDirectory dir(root / "laws");
      for (const auto& p : resumed) CHECK(p == dir.checkpoint(3).string());
      const auto ck = dtrain::checkpointer::Checkpoint::open(dir.checkpoint(3));
      REQUIRE(ck);
      CHECK(ck->iteration() == 3);
      CHECK(ck->steps() == 15);
      CHECK(ck->epoch() == 1);
      CHECK(ck->world_size() == world);
      CHECK(ck->metrics().at("score").number() == 0.0);
      CHECK(ck->extras().at("step_extra").number() == 15.0);
      for (int r = 0; r < world; ++r) {
        CHECK(ck->sampler_state(r) == std::pair<std::int64_t, std::int64_t>{1, 5});
        CHECK(ck->sample_offset(r) == 40);
      }
      for (const auto& [it, path] : dir.checkpoints()) CHECK(dtrain::checkpointer::Checkpoint::verify(path).empty());
      for (const auto& e : std::filesystem::directory_iterator(dir.path()))
        CHECK(e.path().filename().string().rfind(".tmp", 0) != 0);
    }
    SECTION("retention keeps the latest and the best: world size " + std::to_string(world)) {
      const dtrain::CheckpointConfig keep_one{.num_to_keep = 1, .score_attribute = "score",
                                              .score_order = dtrain::ScoreOrder::max};
      const std::vector<double> scores{0, 3, 9, 1, 2};  // by iteration: 2 is the best, 4 the latest
      save_then_resume<Policy>(root, world, {1, 2, 3, 4}, [&](std::int64_t it) { return scores[it]; }, keep_one);
      std::vector<std::int64_t> kept;
      for (const auto& [it, path] : dtrain::RunDirectory(root / "laws").checkpoints()) kept.push_back(it);
      CHECK(kept == std::vector<std::int64_t>{4, 2});
    }
  }
}

/// The laws for a Checkpointer that does not persist: nothing to resume, nothing to save.
template <class Policy>
void check_non_persisting_checkpointer(const std::filesystem::path& storage) {
  static_assert(dtrain::CheckpointerPolicy<Policy>);
  static_assert(!Policy::state::persists);
  const auto store = c10::make_intrusive<c10d::HashStore>();
  auto g = group_of(1, 0, store);
  typename Policy::state s(g[0], dtrain::RunConfig{.storage_path = storage, .name = "laws"});
  CHECK_FALSE(s.resumed());
  CHECK_FALSE(s.best());
  CHECK_THROWS_AS(s.save(snapshot_at(0, 5), 1, {}), dtrain::ConfigError);
  s.wait();
  s.finish();
  CHECK(s.stats().written == 0);
}

}  // namespace dtrain_laws
