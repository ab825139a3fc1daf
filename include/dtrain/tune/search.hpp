// SPDX-License-Identifier: Apache-2.0
#pragma once
// Search algorithms: which config each trial of a Tuner runs (Ray Tune's Searcher). A search
// algorithm is a policy type: a user adds one (a Bayesian optimiser, say) by writing a type that
// models tune::SearchAlgorithm. dtrain's: basic_search, grid and seeded random search together.

#include <concepts>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/error.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/tune/result_grid.hpp>
#include <dtrain/tune/space.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tune {

/// What the search is asked for (TuneConfig's part).
struct SearchSettings {
  int num_samples = 1;
  std::uint64_t seed = 0;
};

/// The seed of trial `index`'s random draws in a search seeded with `seed` (recorded in its trial.json).
inline std::uint64_t trial_seed(std::uint64_t seed, std::size_t index) {
  return Random::of_trial(seed, index).next();
}

/// What a Tuner asks of a search algorithm: `name`, its parameters for tuner.json
/// (`describe()`), and `suggest(space, index, settings, so_far)`: the config of trial `index`
/// (0, 1, 2, ... in turn), or nothing when the search has no more trials. `so_far` holds the trials
/// created before it, with what they reported so far (an adaptive search learns from them). A
/// suggestion must depend only on its arguments: a resumed experiment asks again for the trials it
/// has not created yet.
template <class S>
concept SearchAlgorithm = std::copy_constructible<S> &&
    requires(const S& s, const Space& space, std::size_t i, const SearchSettings& c, const std::vector<TrialResult>& so_far) {
      { S::name } -> std::convertible_to<std::string_view>;
      { s.describe() } -> std::convertible_to<nlohmann::json>;
      { s.suggest(space, i, c, so_far) } -> std::same_as<std::optional<Metrics>>;
    };

/// Grid and random search (Ray Tune's BasicVariantGenerator): num_samples passes over the grid of
/// the space's grid() parameters, every point once per pass, the sampled parameters drawn anew for
/// each trial from its own seeded generator (trial_seed(seed, index)). A space without grid()
/// parameters is a random search of num_samples trials; one of only grid() parameters and
/// num_samples = 1 is a grid search that runs each point exactly once.
struct basic_search {
  static constexpr const char* name = "basic";
  nlohmann::json describe() const { return {{"name", name}}; }

  std::optional<Metrics> suggest(const Space& space, std::size_t index, const SearchSettings& settings,
                                 const std::vector<TrialResult>&) const;
};

}  // namespace tune

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tune/impl/search.ipp>
#endif
