// SPDX-License-Identifier: Apache-2.0
// A tiny nn::ViTForImageClassification (random weights, image 16, patch 4, 2 layers, 3 classes)
// trained for 2 steps on 2 workers under ddp<>, fsdp<> (a unit per encoder layer) and amp<bf16>
// (issue 27, ViT); what it prints: model_scenarios.hpp.
//   vit_scenarios ddp|fsdp|amp STORAGE

#include "model_scenarios.hpp"

#include <dtrain/nn/vit.hpp>

int main(int argc, char** argv) {
  using ViT = dtrain::nn::ViTForImageClassification;
  auto gen = at::detail::createCPUGenerator(11);
  return model_scenarios::main_of<ViT>(argc, argv, {
      .program = "vit_scenarios",
      .make = [] {
        dtrain::nn::ViTConfig c;
        c.hidden_size = 32;
        c.num_hidden_layers = 2;
        c.num_attention_heads = 4;
        c.intermediate_size = 64;
        c.image_height = c.image_width = 16;
        c.patch_height = c.patch_width = 4;
        c.hidden_dropout_prob = 0.1;  // dropout in training, drawn on each rank
        return ViT(c.with_num_labels(3));
      },
      .data = {at::randn({64, 3, 16, 16}, gen), at::arange(64) % 3},  // normal noise, labels 0..2
      .global_batch = 16});
}
