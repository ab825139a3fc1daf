// SPDX-License-Identifier: Apache-2.0
// strategy/: how ddp<> buckets gradients and fsdp<> groups parameters into units (pure functions
// of sizes, dtypes and names), the autograd hook skeleton both strategies share, and how fsdp<>
// re-cuts saved optimizer state for another world size (real optimizers over shards in one
// process). Their collectives are tested across real processes in tests/multirank.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <dtrain/concept/strategy.hpp>
#include <dtrain/detail/torch_compat.hpp>
#include <dtrain/strategy/assignment.hpp>
#include <dtrain/strategy/ddp.hpp>
#include <dtrain/strategy/detail/fsdp_reshard.hpp>
#include <dtrain/strategy/detail/gradient_hooks.hpp>
#include <dtrain/strategy/fsdp.hpp>

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
  // wrap::layers: each element of a list its own unit ("encoder.0", "encoder.1"), the rest as top_level.
  CHECK(s::unit_assignment(names, s::wrap::layers) == groups{{0, 5}, {1, 2}, {3}, {4}});
  const std::vector<std::string> bert{"bert.embeddings.word_embeddings.weight", "bert.encoder.layer.0.attention.self.query.weight",
                                      "bert.encoder.layer.0.output.dense.bias", "bert.encoder.layer.10.output.dense.bias",
                                      "bert.pooler.dense.weight", "classifier.weight", "classifier.bias"};
  CHECK(s::unit_assignment(bert, s::wrap::layers) == groups{{0, 4}, {1, 2}, {3}, {5, 6}});
  CHECK(s::unit_assignment(bert, s::wrap::top_level) == groups{{0, 1, 2, 3, 4}, {5, 6}});
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

// ---- fsdp<>'s optimizer state under another world size ----

TEST_CASE("reshard_flat re-cuts a unit saved by 2 ranks for 3 and back with the padding zero", "[strategy][fsdp][reshard]") {
  // 7 values: 2 ranks hold 4 each (1 of padding), 3 ranks 3 each (2 of padding).
  const auto full = torch::arange(1, 8, torch::kFloat);
  const std::vector<torch::Tensor> two{torch::tensor({1.f, 2.f, 3.f, 4.f}), torch::tensor({5.f, 6.f, 7.f, 0.f})};
  std::vector<torch::Tensor> three;
  for (int r = 0; r < 3; ++r) three.push_back(s::detail::reshard_flat(two, 7, r, 3));
  CHECK(torch::equal(three[0], torch::tensor({1.f, 2.f, 3.f})));
  CHECK(torch::equal(three[1], torch::tensor({4.f, 5.f, 6.f})));
  CHECK(torch::equal(three[2], torch::tensor({7.f, 0.f, 0.f})));
  for (int r = 0; r < 2; ++r) CHECK(torch::equal(s::detail::reshard_flat(three, 7, r, 4), two[r]));
  // A world larger than the unit: the last ranks hold padding only.
  CHECK(torch::equal(s::detail::reshard_flat(two, 7, 7, 1), torch::zeros({1})));
  CHECK(torch::equal(torch::cat(three).narrow(0, 0, 7), full));
}

namespace {

// One rank's shards of units of `numels` values over `world` ranks, cut from `full` (one flat
// tensor per unit) as fsdp<> cuts them: padded with zeros, piece `rank`.
std::vector<torch::Tensor> shards_of(const std::vector<torch::Tensor>& full, int rank, int world) {
  std::vector<torch::Tensor> out;
  for (const auto& f : full) {
    const auto l = s::layout_of({f.numel()}, world);
    auto padded = torch::zeros({l.padded(world)});
    padded.narrow(0, 0, f.numel()).copy_(f);
    out.push_back(padded.narrow(0, rank * l.shard_numel, l.shard_numel).clone().requires_grad_(true));
  }
  return out;
}

// Trains `world` ranks' Adam (amsgrad: all three moments) or SGD (momentum) over their shards for
// `steps` steps of the same full gradients, and saves each rank's optimizer as fsdp<> does
// (optimizer_rank_RRRRR.pt in `dir`); `steps_of_rank_1` lets rank 1 take another count.
template <class Optimizer, class Options>
std::vector<std::filesystem::path> save_ranks(const std::filesystem::path& dir, const std::vector<torch::Tensor>& full,
                                              int world, const Options& options, int steps, int steps_of_rank_1 = -1) {
  std::vector<std::filesystem::path> files;
  for (int r = 0; r < world; ++r) {
    auto shards = shards_of(full, r, world);
    Optimizer opt(shards, options);
    auto gen = at::detail::createCPUGenerator(99);  // every rank draws the same full gradients
    for (int step = 0; step < (r == 1 && steps_of_rank_1 >= 0 ? steps_of_rank_1 : steps); ++step) {
      std::vector<torch::Tensor> grads;
      for (const auto& f : full) grads.push_back(torch::randn({f.numel()}, gen));
      const auto cut = shards_of(grads, r, world);
      for (std::size_t u = 0; u < shards.size(); ++u) shards[u].mutable_grad() = cut[u].detach();
      opt.step();
    }
    torch::serialize::OutputArchive archive;
    opt.save(archive);
    files.push_back(dir / dtrain::checkpointer::files::rank_optimizer(r));
    archive.save_to(files.back().string());
  }
  return files;
}

// `world` fresh ranks' optimizers over their shards, each loaded with the re-cut state of `saved`.
template <class Optimizer, class Options>
std::vector<std::unique_ptr<Optimizer>> load_ranks(const std::vector<std::filesystem::path>& saved,
                                                   const std::vector<torch::Tensor>& full, int world,
                                                   const Options& options) {
  std::vector<std::unique_ptr<Optimizer>> out;
  for (int r = 0; r < world; ++r) {
    auto shards = shards_of(full, r, world);
    auto opt = std::make_unique<Optimizer>(shards, options);
    s::detail::load_resharded_optimizer(*opt, saved, r, [&](const torch::Tensor& p) -> std::optional<s::detail::unit_extent> {
      for (std::size_t u = 0; u < shards.size(); ++u)
        if (shards[u].unsafeGetTensorImpl() == p.unsafeGetTensorImpl())
          return s::detail::unit_extent{full[u].numel(), s::layout_of({full[u].numel()}, world).shard_numel};
      return std::nullopt;
    });
    out.push_back(std::move(opt));
  }
  return out;
}

// State `name` of every unit, joined over `ranks` and cut to the unit's own values (the full state
// the shards imply), read from each optimizer's serialized state as a checkpoint holds it.
template <class Optimizer>
std::vector<torch::Tensor> full_state_of(std::vector<std::unique_ptr<Optimizer>>& ranks,
                                         const std::vector<torch::Tensor>& full, const std::string& name,
                                         std::vector<c10::IValue>* scalars = nullptr, const std::string& scalar = "") {
  std::vector<torch::Tensor> out;
  for (std::size_t u = 0; u < full.size(); ++u) {
    std::vector<torch::Tensor> pieces;
    for (auto& opt : ranks) {
      const auto& p = opt->param_groups()[0].params()[u];
      torch::serialize::OutputArchive a;
      opt->state().at(dtrain::compat::optimizer_state_key(p))->serialize(a);
      std::stringstream bytes;
      a.save_to(bytes);
      torch::serialize::InputArchive in;
      in.load_from(bytes);
      c10::IValue v;
      REQUIRE(in.try_read(name, v));
      pieces.push_back(v.toTensor());
      if (scalars && in.try_read(scalar, v)) scalars->push_back(v);
    }
    out.push_back(torch::cat(pieces));
  }
  return out;
}

void check_bitwise(const std::vector<torch::Tensor>& joined, const std::vector<torch::Tensor>& reference,
                   const std::vector<torch::Tensor>& full) {
  REQUIRE(joined.size() == reference.size());
  for (std::size_t u = 0; u < joined.size(); ++u) {
    INFO("unit " << u);
    const auto n = full[u].numel();
    CHECK(torch::equal(joined[u].narrow(0, 0, n), reference[u].narrow(0, 0, n)));
    CHECK(torch::equal(joined[u].narrow(0, n, joined[u].numel() - n), torch::zeros({joined[u].numel() - n})));
    CHECK(joined[u].narrow(0, 0, n).abs().sum().item<double>() > 0);  // state that moved, not zeros
  }
}

}  // namespace

TEST_CASE("load_resharded_optimizer gives 3 ranks exactly the Adam state 2 saved and 2 exactly what 3 saved", "[strategy][fsdp][reshard]") {
  dtrain_test::TempDir two_dir, three_dir;
  // Units of 7 and 64 values: 7 pads to 8 on 2 ranks and to 9 on 3; 64 pads to 66 on 3.
  const std::vector<torch::Tensor> full{torch::randn({7}), torch::randn({64})};
  const auto options = torch::optim::AdamOptions(1e-2).amsgrad(true);
  const auto saved = save_ranks<torch::optim::Adam>(two_dir.path(), full, 2, options, 3);
  std::vector<std::unique_ptr<torch::optim::Adam>> two;  // the saved ranks, read back as the reference
  for (int r = 0; r < 2; ++r) {
    auto shards = shards_of(full, r, 2);
    two.push_back(std::make_unique<torch::optim::Adam>(shards, options));
    torch::serialize::InputArchive a;
    a.load_from(saved[r].string());
    two.back()->load(a);
  }
  auto three = load_ranks<torch::optim::Adam>(saved, full, 3, options);
  for (const std::string name : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}) {
    INFO(name);
    std::vector<c10::IValue> steps;
    check_bitwise(full_state_of(three, full, name, &steps, "step"), full_state_of(two, full, name), full);
    REQUIRE(steps.size() == 6);
    for (const auto& st : steps) CHECK(st.toInt() == 3);
  }
  CHECK(static_cast<const torch::optim::AdamOptions&>(three[2]->param_groups()[0].options()).amsgrad());

  // And back, 3 -> 2, from the 3 ranks' own files: the padding of 3 is dropped again.
  std::vector<std::filesystem::path> three_files;
  for (int r = 0; r < 3; ++r) {
    torch::serialize::OutputArchive a;
    three[r]->save(a);
    three_files.push_back(three_dir / dtrain::checkpointer::files::rank_optimizer(r));
    a.save_to(three_files.back().string());
  }
  auto back = load_ranks<torch::optim::Adam>(three_files, full, 2, options);
  for (const std::string name : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"})
    check_bitwise(full_state_of(back, full, name), full_state_of(two, full, name), full);
}

TEST_CASE("load_resharded_optimizer re-cuts SGD's momentum buffers from 3 ranks for 4", "[strategy][fsdp][reshard]") {
  dtrain_test::TempDir dir;
  const std::vector<torch::Tensor> full{torch::randn({10}), torch::randn({5})};
  const auto options = torch::optim::SGDOptions(0.1).momentum(0.9);
  const auto saved = save_ranks<torch::optim::SGD>(dir.path(), full, 3, options, 2);
  std::vector<std::unique_ptr<torch::optim::SGD>> three;
  for (int r = 0; r < 3; ++r) {
    three.push_back(std::make_unique<torch::optim::SGD>(shards_of(full, r, 3), options));
    torch::serialize::InputArchive a;
    a.load_from(saved[r].string());
    three.back()->load(a);
  }
  auto four = load_ranks<torch::optim::SGD>(saved, full, 4, options);
  check_bitwise(full_state_of(four, full, "momentum_buffer"), full_state_of(three, full, "momentum_buffer"), full);
}

TEST_CASE("load_resharded_optimizer names a missing or truncated shard file and disagreeing step counts", "[strategy][fsdp][reshard][error]") {
  dtrain_test::TempDir dir;
  const std::vector<torch::Tensor> full{torch::randn({7})};
  const auto options = torch::optim::AdamOptions(1e-2);
  using Adam = torch::optim::Adam;
  SECTION("missing") {
    const auto saved = save_ranks<Adam>(dir.path(), full, 2, options, 2);
    std::filesystem::remove(saved[1]);
    REQUIRE_THROWS_MATCHES(load_ranks<Adam>(saved, full, 3, options), dtrain::Error,
                           dtrain_test::MessageContains({saved[1].string(), "rank 1's optimizer state", "is missing",
                                                         "ScalingConfig::num_workers = 2"}));
  }
  SECTION("truncated") {
    const auto saved = save_ranks<Adam>(dir.path(), full, 2, options, 2);
    const auto size = std::filesystem::file_size(saved[0]);
    std::filesystem::resize_file(saved[0], size / 2);
    REQUIRE_THROWS_MATCHES(load_ranks<Adam>(saved, full, 3, options), dtrain::Error,
                           dtrain_test::MessageContains({saved[0].string(), "does not load", "truncated"}));
  }
  SECTION("steps that disagree") {
    const auto saved = save_ranks<Adam>(dir.path(), full, 2, options, 3, /*steps_of_rank_1=*/2);
    REQUIRE_THROWS_MATCHES(load_ranks<Adam>(saved, full, 3, options), dtrain::Error,
                           dtrain_test::MessageContains({"\"step\" is 3", "2 in", "must agree"}));
  }
  SECTION("a tensor that is none of the model's shards") {
    const auto saved = save_ranks<Adam>(dir.path(), full, 2, options, 1);
    Adam opt(shards_of(full, 0, 3), options);
    REQUIRE_THROWS_MATCHES(
        s::detail::load_resharded_optimizer(opt, saved, 0, [](const torch::Tensor&) { return std::optional<s::detail::unit_extent>(); }),
        dtrain::ConfigError, dtrain_test::MessageContains({"not one of the model's fsdp<> shards", "ctx.parameters(model)"}));
  }
}

TEST_CASE("fsdp<> declares that it re-shards its optimizer state and ddp<> shards none", "[strategy][fsdp][reshard]") {
  static_assert(dtrain::strategy_traits<s::fsdp<>>::shards_optimizer && dtrain::strategy_traits<s::fsdp<>>::reshards_optimizer);
  static_assert(!dtrain::strategy_traits<s::ddp<>>::shards_optimizer && !dtrain::strategy_traits<s::ddp<>>::reshards_optimizer);
  SUCCEED("checked at compile time");
}
