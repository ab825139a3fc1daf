// SPDX-License-Identifier: Apache-2.0
// nn::EncoderLayer and nn::Encoder against LibTorch's own torch::nn::TransformerEncoderLayer and
// TransformerEncoder with the same weights: the same names, outputs and gradients; the packed
// (padding-free) attention against the padded one.
#include "support.hpp"

#include <limits>
#include <map>
#include <string>

#include <dtrain/nn/encoder.hpp>
#include <dtrain/nn/loss.hpp>

#include <torch/torch.h>

namespace {

namespace nn = dtrain::nn;

// Copies `from`'s parameters into `to` by name; every name must exist in both.
void copy_by_name(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto theirs = from.named_parameters(), ours = to.named_parameters();
  REQUIRE(theirs.size() == ours.size());
  for (const auto& item : theirs) {
    INFO(item.key());
    REQUIRE(ours.contains(item.key()));
    ours[item.key()].copy_(item.value());
  }
}

// Random input [batch 3, sequence 7, 128] and a padding mask that pads the tails of two rows.
std::pair<torch::Tensor, torch::Tensor> batch() {
  torch::manual_seed(3);
  auto x = torch::randn({3, 7, 128});
  auto pad = torch::zeros({3, 7}, torch::kBool);
  pad.index_put_({1, torch::indexing::Slice(5, torch::indexing::None)}, true);
  pad.index_put_({2, torch::indexing::Slice(2, torch::indexing::None)}, true);
  return {x, pad};
}

using dtrain_test::max_diff;

// After the same backward through both: the input's and every parameter's gradients agree.
void check_same_gradients(torch::nn::Module& ours, torch::nn::Module& reference, const torch::Tensor& x_ours,
                          const torch::Tensor& x_ref) {
  CHECK(max_diff(x_ours.grad(), x_ref.grad()) < 1e-5);
  auto theirs = reference.named_parameters();
  for (const auto& item : ours.named_parameters()) {
    INFO(item.key());
    CHECK(max_diff(item.value().grad(), theirs[item.key()].grad()) < 1e-4);
  }
}

}  // namespace

TEST_CASE("nn::EncoderLayer equals torch::nn::TransformerEncoderLayer with its weights: output and gradients", "[nn]") {
  for (const bool gelu : {false, true}) {
    INFO("activation " << (gelu ? "gelu" : "relu"));
    torch::manual_seed(1);
    auto options = torch::nn::TransformerEncoderLayerOptions(128, 4).dim_feedforward(256).dropout(0.1);
    if (gelu) options.activation(torch::kGELU);
    torch::nn::TransformerEncoderLayer reference(options);
    nn::EncoderLayer ours(nn::EncoderLayerOptions(128, 4).feedforward(256).dropout(0.1).activation(
        gelu ? nn::Activation::gelu : nn::Activation::relu));
    copy_by_name(*reference, *ours);
    reference->eval();
    ours->eval();
    auto [x, pad] = batch();
    auto x_ref = x.clone().requires_grad_(true), x_ours = x.clone().requires_grad_(true);
    const auto expected = reference->forward(x_ref.transpose(0, 1), torch::Tensor(), pad).transpose(0, 1);
    const auto got = ours->forward(x_ours, nn::padding_mask(pad));
    CHECK(max_diff(got, expected) < 1e-5);

    const auto weight = torch::randn_like(expected);
    (expected * weight).sum().backward();
    (got * weight).sum().backward();
    check_same_gradients(*ours, *reference, x_ours, x_ref);
  }
}

TEST_CASE("nn::Encoder equals torch::nn::TransformerEncoder at the tokens, 0 at padding, and trains in both modes", "[nn]") {
  torch::manual_seed(2);
  torch::nn::TransformerEncoder reference(torch::nn::TransformerEncoderOptions(
      torch::nn::TransformerEncoderLayerOptions(128, 4).dim_feedforward(256).dropout(0.1), 2));
  nn::Encoder ours(nn::EncoderLayerOptions(128, 4).feedforward(256).dropout(0.1), 2);
  copy_by_name(*reference, *ours);  // names: layers.0.self_attn.in_proj_weight, ...
  reference->eval();
  ours->eval();
  auto [x, pad] = batch();
  // Padding at the tails, and (the second mask) inside a row: the packed path takes any mask.
  auto inside = pad.clone();
  inside.index_put_({0, 3}, true);
  for (const auto& mask : {pad, inside}) {
    auto x_ref = x.clone().requires_grad_(true), x_ours = x.clone().requires_grad_(true);
    const auto expected = reference->forward(x_ref.transpose(0, 1), torch::Tensor(), mask).transpose(0, 1);
    const auto got = ours->forward(x_ours, mask);
    const auto tokens = mask.logical_not();
    CHECK(max_diff(got.index({tokens}), expected.index({tokens})) < 1e-5);
    CHECK(got.index({mask}).abs().max().item<double>() == 0);  // nothing computed at padding
    // Gradients through the tokens' outputs (what a loss that masks padding reads): equal.
    const auto weight = torch::randn_like(expected) * tokens.unsqueeze(-1);
    (expected * weight).sum().backward();
    (got * weight).sum().backward();
    check_same_gradients(*ours, *reference, x_ours, x_ref);
    reference->zero_grad();
    ours->zero_grad();
  }

  // Training: dropout draws, and every parameter gets a gradient, with or without a mask.
  ours->train();
  const auto a = ours->forward(x, pad), b = ours->forward(x, pad);
  CHECK(max_diff(a, b) > 0);
  for (const auto& mask : {pad, torch::Tensor()}) {
    ours->zero_grad();
    ours->forward(x, mask).sum().backward();
    for (const auto& item : ours->named_parameters()) {
      INFO(item.key());
      CHECK(item.value().grad().defined());
    }
  }
}

TEST_CASE("nn::attend_packed equals attend() at the tokens: outputs and gradients", "[nn]") {
  torch::manual_seed(6);
  const std::int64_t heads = 4, width = 8;
  const std::vector<std::int64_t> lengths = {9, 4, 1, 7};
  auto padding = torch::zeros({4, 9}, torch::kBool);
  for (std::int64_t r = 0; r < 4; ++r) padding.index_put_({r, torch::indexing::Slice(lengths[r], torch::indexing::None)}, true);
  const auto packing = nn::PackedTokens::of(padding);
  CHECK(packing.offsets == std::vector<std::int64_t>{0, 9, 13, 14, 21});
  const auto q = torch::randn({4, heads, 9, width}, torch::requires_grad()), k = torch::randn_like(q).requires_grad_(true),
             v = torch::randn_like(q).requires_grad_(true);
  const auto expected = nn::attend(q, k, v, nn::padding_mask(padding), 0.0, false);  // [batch, heads, sequence, width]
  const auto to_packed = [&](const torch::Tensor& t) { return packing.pack(t.transpose(1, 2)); };  // [tokens, heads, width]
  const auto qp = to_packed(q.detach()).requires_grad_(true), kp = to_packed(k.detach()).requires_grad_(true),
             vp = to_packed(v.detach()).requires_grad_(true);
  const auto got = nn::attend_packed(qp, kp, vp, packing.offsets, 0.0, true);
  CHECK(max_diff(got, to_packed(expected)) < 1e-5);
  const auto weight = torch::randn_like(got);
  (got * weight).sum().backward();
  (to_packed(expected) * weight).sum().backward();
  CHECK(max_diff(qp.grad(), to_packed(q.grad())) < 1e-5);
  CHECK(max_diff(kp.grad(), to_packed(k.grad())) < 1e-5);
  CHECK(max_diff(vp.grad(), to_packed(v.grad())) < 1e-5);
  CHECK_THROWS_WITH(nn::attend_packed(qp, kp, vp, {0, 9, 13}, 0.0, true), Catch::Contains("offsets ending at the tokens (21)"));
  CHECK_THROWS_WITH(packing.pack(torch::randn({4, 8, 2})), Catch::Contains("must be [4, 9, ...] as its padding mask"));
}

TEST_CASE("nn::attend_packed with dropout: draws repeat under a seed, and the gradient is the loss's derivative", "[nn]") {
  torch::manual_seed(7);
  const std::vector<std::int64_t> offsets = {0, 6, 9};
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  const auto q = torch::randn({9, 2, 4}, opts), k = torch::randn({9, 2, 4}, opts), v = torch::randn({9, 2, 4}, opts);
  const auto weight = torch::randn({9, 2, 4}, opts);
  const auto loss = [&](const torch::Tensor& qq, const torch::Tensor& kk, const torch::Tensor& vv) {
    torch::manual_seed(11);  // the same dropout draws every time
    return (nn::attend_packed(qq, kk, vv, offsets, 0.3, true) * weight).sum();
  };
  const auto qg = q.clone().requires_grad_(true), kg = k.clone().requires_grad_(true), vg = v.clone().requires_grad_(true);
  const auto l = loss(qg, kg, vg);
  CHECK(l.item<double>() == loss(q, k, v).item<double>());
  torch::manual_seed(12);
  CHECK(nn::attend_packed(q, k, v, offsets, 0.3, true).ne(nn::attend_packed(q, k, v, offsets, 0.0, true)).any().item<bool>());
  l.backward();
  // d/de loss(x + e·dx) by central differences, against <grad, dx>, for q, k and v in turn.
  const double e = 1e-6;
  const auto dq = torch::randn_like(q), dk = torch::randn_like(k), dv = torch::randn_like(v);
  const auto numeric = [&](const torch::Tensor& zq, const torch::Tensor& zk, const torch::Tensor& zv) {
    return (loss(q + e * zq, k + e * zk, v + e * zv) - loss(q - e * zq, k - e * zk, v - e * zv)).item<double>() / (2 * e);
  };
  const auto zero = torch::zeros_like(q);
  CHECK(numeric(dq, zero, zero) == Approx((qg.grad() * dq).sum().item<double>()).epsilon(1e-6));
  CHECK(numeric(zero, dk, zero) == Approx((kg.grad() * dk).sum().item<double>()).epsilon(1e-6));
  CHECK(numeric(zero, zero, dv) == Approx((vg.grad() * dv).sum().item<double>()).epsilon(1e-6));
}

TEST_CASE("nn::EncoderLayer pre-norm is x + attention(norm1(x)), then + feedforward(norm2(.))", "[nn]") {
  torch::manual_seed(4);
  nn::EncoderLayer layer(nn::EncoderLayerOptions(128, 4).feedforward(256).norm_first(true).activation(nn::Activation::gelu));
  layer->eval();
  auto [x, pad] = batch();
  const auto mask = nn::padding_mask(pad);
  const auto h = x + layer->self_attn(layer->norm1(x), mask, 0.0);
  const auto f = layer->norm2(h);
  const auto expected = h + layer->linear2(torch::gelu(layer->linear1(f)));
  CHECK(max_diff(layer->forward(x, mask), expected) < 1e-5);
}

TEST_CASE("nn::EncoderLayer: bad shapes are clear errors", "[nn]") {
  CHECK_THROWS_WITH(nn::EncoderLayer(nn::EncoderLayerOptions(130, 4)),
                    Catch::Contains("d_model 130 must be a positive multiple of heads 4"));
  nn::EncoderLayer layer(nn::EncoderLayerOptions(16, 2).feedforward(32));
  CHECK_THROWS_WITH(layer->forward(torch::randn({4, 16})), Catch::Contains("must be [batch, sequence, 16] (batch first)"));
  CHECK_THROWS_WITH(layer->forward(torch::randn({2, 4, 8})), Catch::Contains("with 8 features"));
  CHECK_THROWS_WITH(nn::padding_mask(torch::zeros({2, 3, 4})), Catch::Contains("[batch, sequence]"));
}

TEST_CASE("nn::cross_entropy_fp32 is F.cross_entropy(logits.float(), target), ignored targets included", "[nn]") {
  torch::manual_seed(5);
  const auto target = torch::randint(0, 50, {64}).index_put_({torch::indexing::Slice(0, 5)}, -100);
  for (const auto dtype : {torch::kBFloat16, torch::kFloat}) {
    INFO(dtype);
    const auto logits = (torch::randn({64, 50}) * 4).to(dtype).requires_grad_();
    const auto reference = logits.detach().clone().requires_grad_();
    const auto loss = nn::cross_entropy_fp32(logits, target);
    const auto expected = torch::nn::functional::cross_entropy(reference.to(torch::kFloat), target);
    CHECK(loss.scalar_type() == torch::kFloat);
    CHECK(torch::equal(loss, expected));
    loss.backward();
    expected.backward();
    CHECK(logits.grad().scalar_type() == dtype);
    CHECK(torch::equal(logits.grad(), reference.grad()));
    CHECK(logits.grad().narrow(0, 0, 5).abs().sum().item<double>() == 0);  // ignored rows train nothing
  }
  const auto logits = torch::randn({8, 3});
  const auto labels = torch::tensor({0, 1, 2, 0, 1, 2, 0, 1});
  CHECK(torch::equal(nn::cross_entropy_fp32(logits, labels, /*ignore_index=*/0),
                     torch::nn::functional::cross_entropy(
                         logits, labels, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(0))));
}

TEST_CASE("nn::cross_entropy_fp32: logits that are not [N, classes] are a clear error naming the reshape", "[nn]") {
  CHECK_THROWS_WITH(nn::cross_entropy_fp32(torch::randn({2, 4, 10}), torch::randint(0, 10, {2, 4})),
                    Catch::Contains("logits [2, 4, 10] and target [2, 4]") &&
                        Catch::Contains("logits.reshape({-1, logits.size(-1)})"));
  CHECK_THROWS_AS(nn::cross_entropy_fp32(torch::randn({3, 10}), torch::randint(0, 10, {4})), dtrain::ConfigError);
}
