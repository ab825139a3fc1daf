// SPDX-License-Identifier: Apache-2.0
// strategy/: how ddp<> buckets gradients and fsdp<> groups parameters into units (pure functions
// of sizes, dtypes and names), and the autograd hook skeleton both strategies share. Their
// collectives are tested across real processes in tests/multirank.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <dtrain/strategy/assignment.hpp>
#include <dtrain/strategy/detail/gradient_hooks.hpp>

#include <torch/torch.h>

#include "support.hpp"

namespace {

namespace s = dtrain::strategy;
using groups = std::vector<std::vector<std::size_t>>;

// A parameter of `n` values of `dtype` (4 bytes each for float).
torch::Tensor param(std::int64_t n, torch::ScalarType dtype = torch::kFloat) { return torch::empty({n}, dtype); }

}  // namespace

TEST_CASE("bucket_assignment fills buckets in reverse order, the first up to its own smaller cap", "[strategy][ddp]") {
  // 5 float parameters of 100 bytes each; first bucket closes at >= 150 bytes, later ones at >= 250.
  const std::vector<torch::Tensor> params{param(25), param(25), param(25), param(25), param(25)};
  CHECK(s::bucket_assignment(params, 150, 250) == groups{{4, 3}, {2, 1, 0}});
  // Caps larger than the model: one bucket.
  CHECK(s::bucket_assignment(params, 1 << 20, 1 << 20) == groups{{4, 3, 2, 1, 0}});
  // A cap smaller than one parameter: one parameter per bucket, never an empty bucket.
  CHECK(s::bucket_assignment(params, 1, 1) == groups{{4}, {3}, {2}, {1}, {0}});
}

TEST_CASE("bucket_assignment starts a new bucket where the dtype changes", "[strategy][ddp]") {
  const std::vector<torch::Tensor> params{param(4), param(4, torch::kDouble), param(4, torch::kDouble), param(4)};
  CHECK(s::bucket_assignment(params, 1 << 20, 1 << 20) == groups{{3}, {2, 1}, {0}});
}

TEST_CASE("bucket_assignment of no parameters is no bucket", "[strategy][ddp]") {
  CHECK(s::bucket_assignment({}, 1, 1).empty());
}

TEST_CASE("unit_assignment groups by top-level submodule in order of first appearance", "[strategy][fsdp]") {
  const std::vector<std::string> names{"scale", "encoder.0.weight", "encoder.0.bias", "head.weight",
                                       "encoder.1.weight", "bias"};
  // The root's own parameters ("scale", "bias") form one unit, each child another.
  CHECK(s::unit_assignment(names, s::wrap::top_level) == groups{{0, 5}, {1, 2, 4}, {3}});
  CHECK(s::unit_assignment(names, s::wrap::whole_model) == groups{{0, 1, 2, 3, 4, 5}});
  CHECK(s::unit_assignment({}, s::wrap::top_level).empty());
  CHECK(s::unit_assignment({}, s::wrap::whole_model).empty());
}

TEST_CASE("layout_of places parameters back to back and pads to a multiple of the world size", "[strategy][fsdp]") {
  const auto l = s::layout_of({6, 3, 4}, 4);
  CHECK(l.offsets == std::vector<std::int64_t>{0, 6, 9});
  CHECK(l.numel == 13);
  CHECK(l.shard_numel == 4);  // ceil(13 / 4)
  CHECK(l.padded(4) == 16);   // 3 values of padding
  const auto exact = s::layout_of({6, 2}, 2);
  CHECK(exact.shard_numel == 4);
  CHECK(exact.padded(2) == exact.numel);  // no padding when the world size divides it
  CHECK(s::layout_of({5}, 1).shard_numel == 5);
}

namespace {
// What the strategies' states do with the hooks' calls, counted.
struct recorder {
  s::detail::gradient_hooks<recorder> hooks;
  std::vector<std::size_t> ready;
  int finished = 0;
  void on_grad_ready(std::size_t k) {
    ready.push_back(k);
    hooks.queue_finish();
    hooks.queue_finish();  // a second call in the same backward queues nothing more
  }
  void finish_backward() { ++finished; }
};
}  // namespace

TEST_CASE("gradient_hooks reports each accumulated gradient and the end of each backward once", "[strategy]") {
  torch::manual_seed(0);
  torch::nn::Linear layer(3, 2);
  const std::vector<torch::Tensor> params = layer->parameters();
  auto owner = std::make_shared<recorder>();
  owner->hooks.install(owner, params);

  layer->forward(torch::randn({4, 3})).sum().backward();
  CHECK(owner->ready.size() == params.size());
  CHECK(owner->finished == 1);
  layer->forward(torch::randn({4, 3})).sum().backward();
  CHECK(owner->ready.size() == 2 * params.size());
  CHECK(owner->finished == 2);  // queued again in the next backward

  // Removed hooks call nothing; the parameters still train.
  owner->hooks.remove();
  layer->forward(torch::randn({4, 3})).sum().backward();
  CHECK(owner->ready.size() == 2 * params.size());
  CHECK(owner->finished == 2);
  CHECK(layer->weight.grad().defined());
}

TEST_CASE("gradient_hooks go with their owner", "[strategy]") {
  torch::nn::Linear layer(3, 2);
  auto owner = std::make_shared<recorder>();
  std::weak_ptr<recorder> weak = owner;
  // Installed, then the owner dies without calling remove(): the hooks' destructor removes them.
  owner->hooks.install(owner, layer->parameters());
  owner.reset();
  CHECK(weak.expired());
  layer->forward(torch::randn({4, 3})).sum().backward();  // no call into a destroyed owner
  CHECK(layer->weight.grad().defined());
}
