// SPDX-License-Identifier: Apache-2.0
#pragma once
// A checkpoint written as checkpointer::directory<> writes it, for tests that read one back
// (the Predictor, preprocessors saved beside the model).

#include <chrono>
#include <filesystem>
#include <functional>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <dtrain/checkpointer/directory.hpp>
#include <dtrain/launch/group.hpp>
#include <dtrain/run_directory.hpp>

namespace dtrain_test {

/// `model` (with an SGD optimizer's state), and whatever `add` puts into the snapshot (objects such
/// as preprocessors), saved by one worker's group over an in-memory store as a run's rank 0 does:
/// returns run_dir's checkpoint_000001.
inline std::filesystem::path save_checkpoint(const std::filesystem::path& run_dir, torch::nn::Module& model,
                                             const std::function<void(dtrain::checkpointer::Snapshot&)>& add = {}) {
  namespace cd = dtrain::checkpointer::detail;
  torch::optim::SGD sgd(model.parameters(), 0.1);
  dtrain::checkpointer::Snapshot s;
  s.has_model = true;
  s.model = cd::named_state(model, true);
  s.optimizer = cd::optimizer_bytes(sgd);
  s.generator = cd::default_generator_state();
  if (add) add(s);
  const dtrain::launch::Group group({}, c10::make_intrusive<c10d::HashStore>(), std::chrono::seconds(10));
  dtrain::checkpointer::directory<false>::state checkpoints(
      group, {.storage_path = run_dir.parent_path(), .name = run_dir.filename().string()});
  checkpoints.save(std::move(s), 1, {{"score", 1.0}});
  checkpoints.wait();
  return dtrain::RunDirectory(run_dir).checkpoint(1);
}

}  // namespace dtrain_test
