// SPDX-License-Identifier: Apache-2.0
// A tiny nn::BertForSequenceClassification (random weights, 2 layers) trained for 2 steps on 2
// workers under each strategy and precision the issue names (issue 27):
//   bert_scenarios ddp|fsdp|amp STORAGE
// ddp: strategy::ddp<>; fsdp: strategy::fsdp<full_shard, wrap::layers> (a unit per encoder layer);
// amp: ddp<> with precision::amp<bf16>. Prints "RESULT <scenario> loss=... finite=1 steps=2 spread=0
// tensors=41 units=... logits=<dtype>"; spread is the largest difference, over ranks, of a checksum of each rank's
// model after the steps (0: every rank holds the same model); tensors, the full state's count.

#include <cmath>
#include <iomanip>
#include <iostream>
#include <string>

#include <dtrain/dtrain.hpp>
#include <dtrain/models.hpp>
#include <dtrain/nn/bert.hpp>

namespace {

using Bert = dtrain::nn::BertForSequenceClassification;

dtrain::nn::BertConfig tiny() {
  dtrain::nn::BertConfig c;
  c.vocab_size = 100;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 64;
  c.max_position_embeddings = 16;
  return c.with_num_labels(3);
}

// 64 rows of 12 token ids (the tails of every other row padded with 0), labels 0..2.
dtrain::data::TensorDataset rows() {
  auto gen = at::detail::createCPUGenerator(11);
  auto ids = at::randint(1, 100, {64, 12}, gen);
  ids.slice(0, 0, 64, 2).slice(1, 8).zero_();
  return {ids, at::arange(64) % 3};
}

template <class Trainer>
int run(const std::string& name, const std::string& storage) {
  const auto data = rows();
  Trainer trainer({.num_workers = 2, .threads_per_worker = 1},
                  {.storage_path = storage, .name = name, .collective_timeout = std::chrono::seconds(60),
                   .start = dtrain::Start::fresh});
  const auto result = trainer.fit([&](typename Trainer::context& ctx) {
    torch::manual_seed(ctx.world_rank() + 1);  // prepare_model makes the ranks agree
    auto model = ctx.prepare_model(Bert(tiny()));
    torch::optim::AdamW opt(ctx.parameters(model), torch::optim::AdamWOptions(1e-3));
    model->train();
    double loss_sum = 0;
    int steps = 0;
    std::string logits_dtype;
    for (const dtrain::data::Batch& batch : ctx.shard(data, 16)) {
      opt.zero_grad();
      torch::Tensor logits;
      {
        auto autocast = ctx.autocast();  // amp<bf16>: the forward in bf16 where ATen's autocast says
        logits = ctx.forward(model, batch.data, batch.data.ne(0), torch::Tensor());
      }
      logits_dtype = c10::toString(logits.scalar_type());
      torch::Tensor loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), batch.target);
      ctx.backward(loss);
      ctx.step(opt);
      loss_sum += loss.item<double>();
      if (++steps == 2) break;
    }
    // Every rank's model after the steps, checksummed: its logits on a fixed batch in eval mode
    // (under fsdp<> a rank holds only shards: ctx.forward gathers the full weights), and under
    // ddp<> its parameters themselves, every value weighted by its position so that a swap shows.
    const auto weighted = [](const torch::Tensor& t) {
      const torch::Tensor flat = t.detach().to(torch::kDouble).reshape(-1);
      return (flat * torch::arange(1, flat.numel() + 1, flat.options())).sum().item<double>();
    };
    model->eval();
    double checksum = 0;
    {
      torch::NoGradGuard no_grad;
      const auto fixed = data.get_batch(torch::arange(8));
      auto autocast = ctx.autocast();
      checksum += weighted(ctx.forward(model, fixed.data, fixed.data.ne(0), torch::Tensor()));
    }
    bool sharded = false;
    if constexpr (requires { ctx.strategy().stats().reduce_scatters; }) sharded = true;
    if (!sharded)
      for (const auto& p : model->named_parameters()) checksum += weighted(p.value());
    const double spread =
        ctx.all_reduce(checksum, dtrain::reduce::max) - ctx.all_reduce(checksum, dtrain::reduce::min);
    const auto full = ctx.full_state(model);  // on rank 0 (a collective under fsdp<>: every rank calls it)
    dtrain::Metrics m{{"loss", ctx.all_reduce(loss_sum / steps)}, {"steps", steps}, {"spread", spread},
                      {"tensors", static_cast<std::int64_t>(full.size())}, {"logits", logits_dtype}};
    if constexpr (requires { ctx.strategy().stats().reduce_scatters; }) m["units"] = ctx.strategy().stats().units;
    else m["units"] = 0;
    ctx.report(m);
  });
  const double loss = result.metrics.at("loss").number();
  std::cout << "RESULT " << name << " loss=" << std::setprecision(10) << loss << " finite=" << std::isfinite(loss)
            << " steps=" << result.metrics.at("steps").text() << " spread=" << result.metrics.at("spread").text()
            << " tensors=" << result.metrics.at("tensors").text() << " units=" << result.metrics.at("units").text()
            << " logits=" << result.metrics.at("logits").text()
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string scenario = argc == 3 ? argv[1] : "";
  using dtrain::data::TensorDataset;
  namespace s = dtrain::strategy;
  if (scenario == "ddp") return run<dtrain::Trainer<Bert, TensorDataset, s::ddp<>>>(scenario, argv[2]);
  if (scenario == "fsdp")
    return run<dtrain::Trainer<Bert, TensorDataset, s::fsdp<s::sharding::full_shard, s::wrap::layers>>>(scenario, argv[2]);
  if (scenario == "amp")
    return run<dtrain::Trainer<Bert, TensorDataset, s::ddp<>, dtrain::precision::amp<dtrain::precision::bf16>>>(
        scenario, argv[2]);
  std::cerr << "usage: bert_scenarios ddp|fsdp|amp STORAGE\n";
  return 2;
} catch (const std::exception& e) {
  std::cerr << "bert_scenarios: " << e.what() << "\n";
  return 1;
}
