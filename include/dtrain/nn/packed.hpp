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
  static PackedTokens of(const torch::Tensor& padding);

  std::int64_t tokens() const { return offsets.empty() ? 0 : offsets.back(); }

  /// x [batch, sequence, features...] -> [tokens, features...].
  torch::Tensor pack(const torch::Tensor& x) const;

  /// t [tokens, features...] -> [batch, sequence, features...], 0 at padding.
  torch::Tensor unpack(const torch::Tensor& t) const;

  /// The packed rows of each row's first position ([batch]); only where no row starts with padding.
  torch::Tensor firsts() const;
};

namespace detail {

/// softmax(q kᵀ / √width) v within each row of the packed tokens, dropout on the weights: forward and
/// backward one [heads, L, L] block at a time (rows in parallel over the intra-op threads).
struct PackedAttention : torch::autograd::Function<PackedAttention> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q_in, const torch::Tensor& k_in,
                               const torch::Tensor& v_in, const std::vector<std::int64_t>& offsets, double dropout);

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads);

 private:
  // Where each row's [heads, L, L] block starts in the flat probabilities; the last entry is the total.
  static std::vector<std::int64_t> block_starts(const std::vector<std::int64_t>& offsets, std::int64_t heads);
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
torch::Tensor attend_packed(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const std::vector<std::int64_t>& offsets, double dropout, bool training);

/// Whether the encoders here run `x` [batch, sequence, ...] packed: on the CPU, with some padding.
bool packs(const torch::Tensor& x, const torch::Tensor& padding);

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/packed.ipp>
#endif
