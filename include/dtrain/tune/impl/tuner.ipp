// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of tuner.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tune/tuner.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tune {

DTRAIN_INLINE void TuneConfig::validate() const {
  if (metric.empty())
    throw ConfigError("TuneConfig::metric is empty: name the reported metric that compares trials (\"val_loss\")");
  if (!mode)
    throw ConfigError("TuneConfig::mode is unset: say whether a lower (dtrain::tune::Mode::min, a loss) or a "
                      "higher (Mode::max, an accuracy) \"" + metric + "\" is better");
  if (num_samples < 1)
    throw ConfigError("TuneConfig::num_samples is " + std::to_string(num_samples) + "; it must be at least 1");
  if (max_concurrent_trials < 0)
    throw ConfigError("TuneConfig::max_concurrent_trials is " + std::to_string(max_concurrent_trials) +
                      "; use 0 (as many as the machine holds) or a positive count");
  if (time_attr.empty()) throw ConfigError("TuneConfig::time_attr is empty: use \"iteration\", \"epoch\" or \"step\"");
}
}  // namespace tune
DTRAIN_NAMESPACE_END
