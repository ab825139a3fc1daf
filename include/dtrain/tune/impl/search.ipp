// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of search.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tune/search.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tune {

DTRAIN_INLINE std::optional<Metrics> basic_search::suggest(const Space& space, std::size_t index, const SearchSettings& settings,
                                                           const std::vector<TrialResult>&) const {
  const std::size_t points = space.grid_size();
  if (index >= points * static_cast<std::size_t>(settings.num_samples)) return std::nullopt;
  Random random(trial_seed(settings.seed, index));
  return space.sample(index % points, random);
}
}  // namespace tune
DTRAIN_NAMESPACE_END
