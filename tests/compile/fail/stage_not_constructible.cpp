// SPDX-License-Identifier: Apache-2.0
// A stage over a class (data::map_batches<C>) given arguments that none of C's constructors takes.
// Expected: "C is not constructible from the arguments after the options".

#include <string>

#include <dtrain/data/pipeline.hpp>

struct Embed {
  explicit Embed(const std::string& model_dir) : dir(model_dir) {}
  dtrain::data::Fields operator()(dtrain::data::Fields batch) { return batch; }
  std::string dir;
};

auto stage() { return dtrain::data::map_batches<Embed>({.concurrency = 2}, 64, "model"); }
