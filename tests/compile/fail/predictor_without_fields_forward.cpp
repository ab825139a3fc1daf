// SPDX-License-Identifier: Apache-2.0
// A Predictor given a batch of named fields (data::Fields) for a model whose only forward takes a
// tensor: issue 30 found a raw overload error inside predictor.hpp.
// Expected: "Model has neither forward(const dtrain::data::Fields&) nor forward(input_ids,
// attention_mask). Add one that picks the inputs".

#include <dtrain/dtrain.hpp>
#include <dtrain/data.hpp>
#include <dtrain/inference.hpp>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

struct NetImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x; }  // missing: forward(const dtrain::data::Fields&)
};
TORCH_MODULE(Net);

void predict(const dtrain::data::Fields& batch) {
  dtrain::evaluation::Predictor<Net> predictor(Net{});
  (void)predictor.predict(batch);
}
