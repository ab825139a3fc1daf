// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of scheduler.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tune/scheduler.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tune {
namespace detail {

DTRAIN_INLINE double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double rank = q / 100.0 * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank)), hi = static_cast<std::size_t>(std::ceil(rank));
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}
}  // namespace detail

DTRAIN_INLINE void asha::validate() const {
  if (!(grace_period > 0) || !(max_t >= grace_period) || !(reduction_factor > 1))
    throw ConfigError("tune::asha{max_t " + detail::number(max_t) + ", grace_period " + detail::number(grace_period) +
                      ", reduction_factor " + detail::number(reduction_factor) +
                      "}: need 0 < grace_period <= max_t and reduction_factor > 1");
}

DTRAIN_INLINE std::vector<double> asha::rungs() const {
  std::vector<double> out;
  for (double m = grace_period; m <= max_t * (1 + 1e-12); m *= reduction_factor) out.push_back(m);
  return out;
}

DTRAIN_INLINE Decision asha::on_result(const Histories& histories, const std::string& trial, Point p) const {
  validate();
  const auto own = histories.find(trial);
  auto reached_before = [&](const std::vector<Point>& points, double milestone, double before) {
    return std::any_of(points.begin(), points.end(),
                       [&](const Point& q) { return q.time >= milestone && q.time < before; });
  };
  const auto ladder = rungs();
  Decision d;
  // The highest rung this result reaches and the trial had not: the one it is judged at.
  for (auto m = ladder.rbegin(); m != ladder.rend(); ++m) {
    if (p.time < *m) continue;
    if (own != histories.end() && reached_before(own->second, *m, p.time)) break;  // judged there already
    std::vector<double> recorded;  // every other trial's score when it first reached the rung
    for (const auto& [id, points] : histories) {
      if (id == trial) continue;
      const auto first = std::find_if(points.begin(), points.end(), [&](const Point& q) { return q.time >= *m; });
      if (first != points.end()) recorded.push_back(first->score);
    }
    if (!recorded.empty()) {
      const double cutoff = detail::percentile(recorded, (1 - 1 / reduction_factor) * 100);
      if (p.score < cutoff)
        d = {true, "asha: score " + detail::number(p.score) + " at rung " + detail::number(*m) + " is below the cutoff " +
                       detail::number(cutoff) + " of the " + std::to_string(recorded.size()) + " trials there"};
    }
    break;
  }
  if (!d.stop && p.time >= max_t) d = {true, "asha: reached max_t " + detail::number(max_t)};
  return d;
}

DTRAIN_INLINE Decision median_stopping::on_result(const Histories& histories, const std::string& trial, Point p) const {
  if (min_samples_required < 1)
    throw ConfigError("tune::median_stopping: min_samples_required is " + std::to_string(min_samples_required) +
                      "; it must be at least 1");
  if (p.time < grace_period) return {};
  std::vector<double> means;  // each other trial that reached p.time: its mean score up to then
  for (const auto& [id, points] : histories) {
    if (id == trial || points.empty() || points.back().time < p.time) continue;
    double sum = 0;
    int n = 0;
    for (const auto& q : points)
      if (q.time <= p.time) sum += q.score, ++n;
    if (n) means.push_back(sum / n);
  }
  if (static_cast<int>(means.size()) < min_samples_required) return {};
  double best = p.score;
  if (const auto own = histories.find(trial); own != histories.end())
    for (const auto& q : own->second) best = std::max(best, q.score);
  const double median = detail::percentile(means, 50);
  if (best < median)
    return {true, "median_stopping: best score " + detail::number(best) + " at time " + detail::number(p.time) +
                      " is below the median " + detail::number(median) + " of " + std::to_string(means.size()) +
                      " trials' mean scores"};
  return {};
}
}  // namespace tune
DTRAIN_NAMESPACE_END
