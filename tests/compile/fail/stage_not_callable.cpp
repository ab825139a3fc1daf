// SPDX-License-Identifier: Apache-2.0
// A stage over a class (data::map_batches<C>) whose class has no operator()(data::Fields).
// Expected: "C is not callable on a batch".

#include <dtrain/data/pipeline.hpp>

struct Embed {
  explicit Embed(int width) : width(width) {}
  torch::Tensor operator()(const torch::Tensor& x) { return x * width; }  // missing: Fields in, Fields out
  int width;
};

auto stage() { return dtrain::data::map_batches<Embed>({.concurrency = 2}, 3); }
