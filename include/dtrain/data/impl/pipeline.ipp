// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of pipeline.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/pipeline.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

DTRAIN_INLINE void PipelineRandom::load(torch::serialize::InputArchive& a) {
  torch::Tensor t;
  a.read("seed", t);
  seed = static_cast<std::uint64_t>(t.item<std::int64_t>());
}

namespace detail {

DTRAIN_INLINE std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

DTRAIN_INLINE std::uint64_t seed_for(std::uint64_t seed, std::int64_t epoch, std::int64_t index, std::uint64_t stream) {
  return mix(mix(mix(seed ^ stream) + static_cast<std::uint64_t>(epoch)) + static_cast<std::uint64_t>(index));
}

DTRAIN_INLINE at::Generator generator_for(std::uint64_t seed, std::int64_t epoch, std::int64_t index, std::uint64_t stream) {
  return at::detail::createCPUGenerator(seed_for(seed, epoch, index, stream));
}
}  // namespace detail
}  // namespace data
DTRAIN_NAMESPACE_END
