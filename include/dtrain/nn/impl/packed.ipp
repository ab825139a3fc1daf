// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of packed.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/nn/packed.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {

DTRAIN_INLINE PackedTokens PackedTokens::of(const torch::Tensor& padding) {
  if (!padding.defined() || padding.dim() != 2)
    throw ConfigError("nn::PackedTokens: the padding mask must be [batch, sequence], got " +
                      (padding.defined() ? std::to_string(padding.dim()) + " dimensions" : std::string("none")));
  PackedTokens p;
  p.batch = padding.size(0);
  p.sequence = padding.size(1);
  const auto keep = padding.to(at::kBool).logical_not();
  p.index = keep.reshape({-1}).nonzero().squeeze(1);
  const auto counts = keep.sum(1).to(at::kLong).cpu().contiguous();
  const auto* c = counts.data_ptr<std::int64_t>();
  p.offsets.assign(1, 0);
  for (std::int64_t b = 0; b < p.batch; ++b) p.offsets.push_back(p.offsets.back() + c[b]);
  return p;
}

DTRAIN_INLINE torch::Tensor PackedTokens::pack(const torch::Tensor& x) const {
  if (x.dim() < 2 || x.size(0) != batch || x.size(1) != sequence)
    throw ConfigError("nn::PackedTokens: the input must be [" + std::to_string(batch) + ", " + std::to_string(sequence) +
                      ", ...] as its padding mask, got " + std::to_string(x.dim()) + " dimensions" +
                      (x.dim() >= 2 ? " [" + std::to_string(x.size(0)) + ", " + std::to_string(x.size(1)) + ", ...]" : ""));
  return x.flatten(0, 1).index_select(0, index.to(x.device()));
}

DTRAIN_INLINE torch::Tensor PackedTokens::unpack(const torch::Tensor& t) const {
  auto sizes = t.sizes().vec();
  sizes[0] = batch * sequence;
  auto out = at::zeros(sizes, t.options()).index_copy(0, index.to(t.device()), t);
  sizes[0] = sequence;
  sizes.insert(sizes.begin(), batch);
  return out.view(sizes);
}

DTRAIN_INLINE torch::Tensor PackedTokens::firsts() const {
  return at::tensor(std::vector<std::int64_t>(offsets.begin(), offsets.end() - 1), at::kLong);
}

namespace detail {

DTRAIN_INLINE torch::Tensor PackedAttention::forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q_in, const torch::Tensor& k_in,
                             const torch::Tensor& v_in, const std::vector<std::int64_t>& offsets, double dropout) {
  const auto q = q_in.detach(), k = k_in.detach(), v = v_in.detach();
  const auto heads = q.size(1);
  const auto blocks = block_starts(offsets, heads);
  auto probs = at::empty({blocks.back()}, q.options());
  torch::Tensor keep;  // the dropout mask, scaled by 1 / (1 - p); drawn at once, so runs repeat
  if (dropout > 0) keep = at::empty({blocks.back()}, q.options()).bernoulli_(1 - dropout).div_(1 - dropout);
  auto out = at::empty(q.sizes(), q.options());
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  for_rows(offsets, [&](std::int64_t b, std::int64_t o, std::int64_t len) {
    const auto qb = q.narrow(0, o, len).transpose(0, 1), kb = k.narrow(0, o, len).transpose(0, 1);
    const auto vb = v.narrow(0, o, len).transpose(0, 1);  // [heads, len, width]
    auto p = probs.narrow(0, blocks[b], heads * len * len).view({heads, len, len});
    at::softmax_out(p, at::bmm(qb, kb.transpose(1, 2)).mul_(scale), -1);
    const auto weights = keep.defined() ? p * keep.narrow(0, blocks[b], heads * len * len).view({heads, len, len}) : p;
    out.narrow(0, o, len).copy_(at::bmm(weights, vb).transpose(0, 1));
  });
  ctx->save_for_backward({q, k, v, probs, keep});
  ctx->saved_data["offsets"] = offsets;
  return out;
}

DTRAIN_INLINE torch::autograd::variable_list PackedAttention::backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
  const auto saved = ctx->get_saved_variables();
  const auto &q = saved[0], &k = saved[1], &v = saved[2], &probs = saved[3], &keep = saved[4];
  const auto offsets = ctx->saved_data["offsets"].toIntVector();
  const auto heads = q.size(1);
  const auto blocks = block_starts(offsets, heads);
  const auto grad = grads[0].detach();
  auto dq = at::empty(q.sizes(), q.options()), dk = at::empty(k.sizes(), k.options()), dv = at::empty(v.sizes(), v.options());
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  for_rows(offsets, [&](std::int64_t b, std::int64_t o, std::int64_t len) {
    const auto qb = q.narrow(0, o, len).transpose(0, 1), kb = k.narrow(0, o, len).transpose(0, 1);
    const auto vb = v.narrow(0, o, len).transpose(0, 1), gb = grad.narrow(0, o, len).transpose(0, 1);
    const auto p = probs.narrow(0, blocks[b], heads * len * len).view({heads, len, len});
    torch::Tensor mask;
    if (keep.defined()) mask = keep.narrow(0, blocks[b], heads * len * len).view({heads, len, len});
    const auto weights = mask.defined() ? p * mask : p;
    dv.narrow(0, o, len).copy_(at::bmm(weights.transpose(1, 2), gb).transpose(0, 1));
    auto dweights = at::bmm(gb, vb.transpose(1, 2));
    if (mask.defined()) dweights.mul_(mask);
    const auto dscores = at::_softmax_backward_data(dweights, p, -1, p.scalar_type()).mul_(scale);
    dq.narrow(0, o, len).copy_(at::bmm(dscores, kb).transpose(0, 1));
    dk.narrow(0, o, len).copy_(at::bmm(dscores.transpose(1, 2), qb).transpose(0, 1));
  });
  return {dq, dk, dv, torch::Tensor(), torch::Tensor()};
}

DTRAIN_INLINE std::vector<std::int64_t> PackedAttention::block_starts(const std::vector<std::int64_t>& offsets, std::int64_t heads) {
  std::vector<std::int64_t> starts{0};
  for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
    const auto len = offsets[b + 1] - offsets[b];
    starts.push_back(starts.back() + heads * len * len);
  }
  return starts;
}
}  // namespace detail

DTRAIN_INLINE torch::Tensor attend_packed(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const std::vector<std::int64_t>& offsets, double dropout, bool training) {
  if (q.dim() != 3 || k.sizes() != q.sizes() || v.sizes() != q.sizes() || offsets.empty() || offsets.back() != q.size(0))
    throw ConfigError("nn::attend_packed: q, k and v must be [tokens, heads, width] alike, with offsets ending at the tokens (" +
                      std::to_string(q.dim() ? q.size(0) : 0) + ")");
  return detail::PackedAttention::apply(q, k, v, offsets, training ? dropout : 0.0);
}

DTRAIN_INLINE bool packs(const torch::Tensor& x, const torch::Tensor& padding) {
  return padding.defined() && x.device().is_cpu() && padding.dim() == 2 && padding.to(at::kBool).any().item<bool>();
}
}  // namespace nn
DTRAIN_NAMESPACE_END
