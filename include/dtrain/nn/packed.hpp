// SPDX-License-Identifier: Apache-2.0
#pragma once
// Padding-free encoders on the CPU: nn::PackedTokens and nn::attend_packed.
//
// A batch padded to its longest row spends most of a transformer's time on padding: on the text
// corpus (rows of 71 words on average, truncated at 128, batches of 32) the padded positions are
// 45 % of the tokens every Linear and LayerNorm runs on, and 63 % of the attention scores (their
// products, scaling, softmax, dropout and the backward of each). No real token attends to padding,
// so these states are never read by anything downstream that masks padding. When a batch has
// padding and lives on the CPU, nn::Encoder and BERT's pooled path (nn/bert.hpp) pack the real
// tokens row after row ([tokens, features]: PackedTokens), run every layer on them, and attend
// within each row only (attend_packed: per row, one [heads, L, L] block, with its own backward).
// The outputs at the tokens equal the padded computation's within float rounding; at padding the
// packed encoder returns 0, as Python's nn.TransformerEncoder does on its nested-tensor path.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>
#include <torch/autograd.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// The real tokens of a padded batch, packed row after row.
struct PackedTokens {
  /// The tokens' positions in the flattened [batch * sequence] (int64, ascending).
  torch::Tensor index;
  /// batch + 1 entries: row b's tokens are the packed rows [offsets[b], offsets[b + 1]).
  std::vector<std::int64_t> offsets;
  std::int64_t batch = 0, sequence = 0;

  /// `padding` [batch, sequence]: true (or nonzero) at padding. Padding may sit anywhere in a row.
  static PackedTokens of(const torch::Tensor& padding) {
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

  std::int64_t tokens() const { return offsets.empty() ? 0 : offsets.back(); }

  /// x [batch, sequence, features...] -> [tokens, features...].
  torch::Tensor pack(const torch::Tensor& x) const {
    if (x.dim() < 2 || x.size(0) != batch || x.size(1) != sequence)
      throw ConfigError("nn::PackedTokens: the input must be [" + std::to_string(batch) + ", " + std::to_string(sequence) +
                        ", ...] as its padding mask, got " + std::to_string(x.dim()) + " dimensions" +
                        (x.dim() >= 2 ? " [" + std::to_string(x.size(0)) + ", " + std::to_string(x.size(1)) + ", ...]" : ""));
    return x.flatten(0, 1).index_select(0, index.to(x.device()));
  }

  /// t [tokens, features...] -> [batch, sequence, features...], 0 at padding.
  torch::Tensor unpack(const torch::Tensor& t) const {
    auto sizes = t.sizes().vec();
    sizes[0] = batch * sequence;
    auto out = at::zeros(sizes, t.options()).index_copy(0, index.to(t.device()), t);
    sizes[0] = sequence;
    sizes.insert(sizes.begin(), batch);
    return out.view(sizes);
  }

  /// The packed rows of each row's first position ([batch]); only where no row starts with padding.
  torch::Tensor firsts() const {
    return at::tensor(std::vector<std::int64_t>(offsets.begin(), offsets.end() - 1), at::kLong);
  }
};

namespace detail {

/// softmax(q kᵀ / √width) v within each row of the packed tokens, dropout on the weights: forward and
/// backward one [heads, L, L] block at a time (rows in parallel over the intra-op threads).
struct PackedAttention : torch::autograd::Function<PackedAttention> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q_in, const torch::Tensor& k_in,
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

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
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

 private:
  // Where each row's [heads, L, L] block starts in the flat probabilities; the last entry is the total.
  static std::vector<std::int64_t> block_starts(const std::vector<std::int64_t>& offsets, std::int64_t heads) {
    std::vector<std::int64_t> starts{0};
    for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
      const auto len = offsets[b + 1] - offsets[b];
      starts.push_back(starts.back() + heads * len * len);
    }
    return starts;
  }
  // f(row, first packed token, length) for every non-empty row, rows spread over the intra-op
  // threads; no autograd or autocast inside (the ops here are this function's own).
  template <class F>
  static void for_rows(const std::vector<std::int64_t>& offsets, const F& f) {
    at::parallel_for(0, static_cast<std::int64_t>(offsets.size()) - 1, 1, [&](std::int64_t begin, std::int64_t end) {
      torch::NoGradGuard no_grad;
      c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
      for (auto b = begin; b < end; ++b)
        if (const auto len = offsets[b + 1] - offsets[b]; len > 0) f(b, offsets[b], len);
    });
  }
};

}  // namespace detail

/// attend() on packed tokens: q, k and v [tokens, heads, width] (PackedTokens' rows), each row
/// attending within itself; dropout on the weights in training. Returns [tokens, heads, width].
inline torch::Tensor attend_packed(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   const std::vector<std::int64_t>& offsets, double dropout, bool training) {
  if (q.dim() != 3 || k.sizes() != q.sizes() || v.sizes() != q.sizes() || offsets.empty() || offsets.back() != q.size(0))
    throw ConfigError("nn::attend_packed: q, k and v must be [tokens, heads, width] alike, with offsets ending at the tokens (" +
                      std::to_string(q.dim() ? q.size(0) : 0) + ")");
  return detail::PackedAttention::apply(q, k, v, offsets, training ? dropout : 0.0);
}

/// Whether the encoders here run `x` [batch, sequence, ...] packed: on the CPU, with some padding.
inline bool packs(const torch::Tensor& x, const torch::Tensor& padding) {
  return padding.defined() && x.device().is_cpu() && padding.dim() == 2 && padding.to(at::kBool).any().item<bool>();
}

}  // namespace nn

DTRAIN_NAMESPACE_END
