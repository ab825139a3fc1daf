// SPDX-License-Identifier: Apache-2.0
#pragma once
// A test-only Checkpointer: checkpointer::directory<> whose rank 0, in the first worker group, dies
// halfway through writing model.pt of one checkpoint (what a crash in the middle of a write leaves
// on disk). The product has no such hook; tests that need the crash name this policy.

#include <unistd.h>

#include <cstdint>

#include <torch/csrc/jit/serialization/pickle.h>

#include <dtrain/checkpointer/directory.hpp>

namespace dtrain_test {

/// The iteration whose write rank 0 of attempt 0 does not survive; -1: none.
inline std::int64_t crash_at_iteration = -1;

struct crashing_directory {
  using category = dtrain::category::checkpointer;
  static constexpr const char* name = "crashing_directory";

  class state : public dtrain::checkpointer::directory<>::state {
    using base = dtrain::checkpointer::directory<>::state;

   public:
    state(const dtrain::launch::Group& group, const dtrain::RunConfig& run)
        : base(group, run), group_(group), dir_(run.path()) {}

    void save(dtrain::checkpointer::Snapshot&& s, std::int64_t iteration, dtrain::Metrics reported) {
      if (iteration == crash_at_iteration && group_.rank() == 0 && group_.identity().attempt == 0) {
        wait();  // the previous checkpoint is complete, as it would be
        const auto tmp = dir_.temporary_checkpoint(iteration);
        std::filesystem::create_directories(tmp);
        dtrain::checkpointer::detail::write_rank_file(tmp, 0, s);
        const auto model = torch::jit::pickle_save(c10::IValue(s.model));
        dtrain::checkpointer::detail::write_file(tmp / dtrain::checkpointer::files::model, model.data(), model.size() / 2);
        std::_Exit(9);
      }
      base::save(std::move(s), iteration, std::move(reported));
    }

   private:
    const dtrain::launch::Group& group_;
    dtrain::RunDirectory dir_;
  };
};

}  // namespace dtrain_test
