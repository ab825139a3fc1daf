// SPDX-License-Identifier: Apache-2.0
#pragma once
// Laws of the Sampler concept (policy/concepts.hpp), checked for one model over dataset sizes and
// world sizes 1-4. Pure: no processes.
//
// For every model S, every n and world size W, every epoch e:
//   - pure: indices(n, r, W, e) called twice gives the same vector;
//   - in range: every index is in [0, n);
//   - balanced: the ranks' shares differ in length by at most one;
//   - covered as the model documents (`cover`):
//       exact  the shares are a disjoint cover of [0, n): every index exactly once;
//       pad    interleaving the shares (rank 0's first, rank 1's first, ...) gives a sequence s of
//              W * ceil(n / W) indices whose first n are a permutation p of [0, n) and whose rest
//              repeat p from its start: s[i] = p[i mod n] (PyTorch's DistributedSampler);
//       drop   the shares are disjoint, floor(n / W) each, and leave out exactly n mod W indices;
//   - shuffled models (`shuffles`): epochs e and e + 1 visit the indices in different orders (n >= 8),
//     and the epoch's order does not depend on W (the interleaved sequence's first n are the same
//     permutation for every W, so a resumed run on another world size sees the same epoch).

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "../dtrain_catch.hpp"

namespace dtrain_laws::sampler {

enum class cover { exact, pad, drop };

inline const char* name(cover c) { return c == cover::exact ? "exact" : c == cover::pad ? "pad" : "drop"; }

/// Every rank's share of one epoch, interleaved in the order rank r's k-th index is global
/// position k * W + r (what distributed<> documents; for contiguous samplers it is only used to
/// compare epochs).
template <class S>
std::vector<std::int64_t> interleaved(std::int64_t n, int world, std::int64_t epoch) {
  std::vector<std::vector<std::int64_t>> shares;
  std::size_t longest = 0;
  for (int r = 0; r < world; ++r) {
    shares.push_back(S::indices(n, r, world, epoch));
    longest = std::max(longest, shares.back().size());
  }
  std::vector<std::int64_t> s;
  for (std::size_t k = 0; k < longest; ++k)
    for (const auto& share : shares)
      if (k < share.size()) s.push_back(share[k]);
  return s;
}

/// Checks every law above for S with the documented `c` over sizes and world sizes 1-4.
template <class S>
void check(cover c, bool shuffles, const std::vector<std::int64_t>& sizes = {0, 1, 2, 3, 7, 8, 12, 97, 1000}) {
  for (const std::int64_t n : sizes) {
    for (int world = 1; world <= 4; ++world) {
      for (const std::int64_t epoch : {0, 1, 5}) {
        INFO("n = " << n << ", world size " << world << ", epoch " << epoch << ", cover " << name(c));
        std::vector<std::vector<std::int64_t>> shares;
        std::size_t shortest = SIZE_MAX, longest = 0, total = 0;
        for (int r = 0; r < world; ++r) {
          shares.push_back(S::indices(n, r, world, epoch));
          INFO("rank " << r);
          CHECK(S::indices(n, r, world, epoch) == shares.back());  // pure
          for (const auto i : shares.back()) {
            CHECK(i >= 0);
            CHECK(i < n);
          }
          shortest = std::min(shortest, shares.back().size());
          longest = std::max(longest, shares.back().size());
          total += shares.back().size();
        }
        CHECK(longest - shortest <= 1);
        std::multiset<std::int64_t> seen;
        for (const auto& share : shares) seen.insert(share.begin(), share.end());
        const std::set<std::int64_t> distinct(seen.begin(), seen.end());
        if (c == cover::exact) {
          CHECK(total == static_cast<std::size_t>(n));
          CHECK(distinct.size() == static_cast<std::size_t>(n));  // with total == n: each once
        } else if (c == cover::drop) {
          CHECK(shortest == longest);
          CHECK(total == static_cast<std::size_t>(n - n % world));
          CHECK(distinct.size() == total);  // disjoint
        } else {
          const std::int64_t per_rank = (n + world - 1) / world;
          CHECK(shortest == longest);
          CHECK(total == static_cast<std::size_t>(per_rank * world));
          const auto s = interleaved<S>(n, world, epoch);
          const std::set<std::int64_t> first(s.begin(), s.begin() + std::min<std::int64_t>(n, s.size()));
          CHECK(first.size() == static_cast<std::size_t>(n));  // a permutation of [0, n)
          for (std::size_t i = static_cast<std::size_t>(n); i < s.size(); ++i) {
            INFO("padded position " << i);
            CHECK(s[i] == s[i % static_cast<std::size_t>(n)]);
          }
        }
      }
      if (shuffles && n >= 8) {
        INFO("n = " << n << ", world size " << world);
        for (const std::int64_t epoch : {0, 1, 2, 7}) {
          INFO("epochs " << epoch << " and " << epoch + 1);
          CHECK(interleaved<S>(n, world, epoch) != interleaved<S>(n, world, epoch + 1));
        }
      }
    }
    if (shuffles && c == cover::pad && n > 0) {
      // One permutation per epoch, whatever the world size.
      for (const std::int64_t epoch : {0, 3}) {
        const auto one = interleaved<S>(n, 1, epoch);
        for (int world = 2; world <= 4; ++world) {
          INFO("n = " << n << ", epoch " << epoch << ": world size " << world << " against 1");
          const auto s = interleaved<S>(n, world, epoch);
          CHECK(std::equal(one.begin(), one.end(), s.begin()));
        }
      }
    }
  }
}

}  // namespace dtrain_laws::sampler
