// SPDX-License-Identifier: Apache-2.0
// The positive control of fail/: a Trainer configured correctly compiles, declared and fitted.
// Each fail/*.cpp is this file with one mistake.

#include <dtrain/dtrain.hpp>
#include <torch/nn/modules/container/sequential.h>

// Every member of the class, with the default policies.
template class dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist>;

// Each policy category given once, in an order other than the defaults'.
using configured = dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist,
                                   dtrain::precision::amp<dtrain::precision::bf16>,
                                   dtrain::sampler::sequential, dtrain::strategy::ddp<1024>,
                                   dtrain::checkpointer::none, dtrain::backend::gloo>;
static_assert(std::is_same_v<configured::policies::sampler, dtrain::sampler::sequential>);
static_assert(std::is_same_v<configured::policies::strategy, dtrain::strategy::ddp<1024>>);
// The Tracker defaults to tracker::directory; tracker::mlflow<> and tracker::none are accepted.
static_assert(std::is_same_v<configured::policies::tracker, dtrain::tracker::directory>);
using tracked = dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist, dtrain::tracker::mlflow<3>>;
static_assert(std::is_same_v<tracked::policies::tracker, dtrain::tracker::mlflow<3>>);
static_assert(std::is_same_v<dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist,
                                             dtrain::tracker::none>::policies::tracker, dtrain::tracker::none>);

// fit() instantiates the worker context and the driver; never called.
dtrain::Result fit_with_defaults() {
  dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist> trainer;
  return trainer.fit([](auto& ctx) { (void)ctx.world_rank(); });
}

dtrain::Result fit_configured() {
  configured trainer(dtrain::ScalingConfig{.num_workers = 2});
  return trainer.fit([](auto& ctx) { (void)ctx.world_size(); });
}

// strategy::fsdp<> in both modes and both unit choices: every non-template member of its state.
template class dtrain::strategy::fsdp<>::state<dtrain::backend::gloo::communicator>;
template class dtrain::strategy::fsdp<dtrain::strategy::sharding::shard_grad_op,
                                      dtrain::strategy::wrap::whole_model>::state<dtrain::backend::gloo::communicator>;
using sharded = dtrain::Trainer<torch::nn::Sequential, dtrain::data::FashionMnist, dtrain::strategy::fsdp<>>;
static_assert(std::is_same_v<sharded::policies::strategy, dtrain::strategy::fsdp<>>);
