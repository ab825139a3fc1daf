// SPDX-License-Identifier: Apache-2.0
#pragma once
// schedule::StepLR: the learning rate multiplied by gamma every step_size steps (PyTorch's
// torch.optim.lr_scheduler.StepLR, stepped once per epoch or once per optimizer step).

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <dtrain/schedule/schedule.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace schedule {

/// After t calls of step(), each group's learning rate is base * gamma^floor(t / step_size), base
/// being the group's learning rate when the schedule was built. Computed from t (not multiplied
/// step by step), so a resumed schedule sets bitwise the same rates as one never stopped.
class StepLR {
 public:
  static constexpr const char* kind = "StepLR";

  StepLR(torch::optim::Optimizer& optimizer, std::int64_t step_size, double gamma = 0.1);

  /// One step (an epoch, or an optimizer step, as the loop counts them): sets the learning rates.
  void step();

  std::vector<double> lrs() const { return lrs_; }
  std::int64_t steps() const { return steps_; }

  void save(torch::serialize::OutputArchive& a) const { detail::save_common(a, kind, steps_, base_, lrs_); }
  /// The steps taken, the base and current learning rates (set in the optimizer); step_size and
  /// gamma stay the constructor's.
  void load(torch::serialize::InputArchive& a) { detail::load_common(a, kind, *optimizer_, steps_, base_, lrs_); }

 private:
  torch::optim::Optimizer* optimizer_;
  std::int64_t step_size_;
  double gamma_;
  std::vector<double> base_, lrs_;
  std::int64_t steps_ = 0;
};

}  // namespace schedule

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/schedule/impl/step_lr.ipp>
#endif
