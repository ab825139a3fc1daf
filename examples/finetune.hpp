// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the fine-tuning examples (finetune_text_classifier.cpp, finetune_vit.cpp) share with their
// Python peers (benchmarks/minilm_peer.py, benchmarks/vit_peer.py): the split's fingerprint and
// the steps an epoch takes, counted as torch's DistributedSampler + DataLoader count them.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace finetune {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// FNV-1a (64 bits) over the rows' little-endian int64 bytes: the split's fingerprint, which the
/// peers compute over their own split (minilm_peer.py's fnv1a).
inline std::string fnv1a(const std::vector<std::int64_t>& rows) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (auto v : rows)
    for (int b = 0; b < 8; ++b) h = (h ^ ((static_cast<std::uint64_t>(v) >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

/// Steps an epoch takes: each rank's share (the sampler pads the last round) in per-rank batches,
/// the last one short.
inline std::int64_t steps_per_epoch(std::int64_t rows, std::int64_t workers, std::int64_t global_batch) {
  const auto per_rank = (rows + workers - 1) / workers, batch = global_batch / workers;
  return (per_rank + batch - 1) / batch;
}

}  // namespace finetune
