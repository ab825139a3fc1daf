// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of decoder.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <algorithm>
#include <cmath>
#include <limits>

#include <dtrain/detail/torch_compat.hpp>
#include <dtrain/nn/decoder.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {

namespace detail {
DTRAIN_INLINE torch::Tensor hub_activation(const std::string& name, const torch::Tensor& x) {
  if (name == "silu" || name == "swish") return at::silu(x);
  if (name == "gelu") return at::gelu(x);
  if (name == "gelu_pytorch_tanh" || name == "gelu_new") return at::gelu(x, "tanh");
  if (name == "quick_gelu") return x * at::sigmoid(1.702 * x);  // CLIP's, as transformers' QuickGELUActivation
  return at::relu(x);
}

DTRAIN_INLINE void init_decoder_weights(torch::nn::Module& m, double std) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.named_parameters()) {
    const auto& name = p.key();
    if (name == "bias" || (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0)) p.value().zero_();
    else if (p.value().dim() == 2) p.value().normal_(0, std);
  }
}

DTRAIN_INLINE double lowest_of(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kHalf: return -65504.0;
    case torch::kBFloat16: return -3.3895313892515355e38;
    case torch::kDouble: return std::numeric_limits<double>::lowest();
    default: return std::numeric_limits<float>::lowest();
  }
}
}  // namespace detail

DTRAIN_INLINE std::pair<torch::Tensor, torch::Tensor> KVCache::append(std::size_t layer, const torch::Tensor& keys,
                                                                      const torch::Tensor& values) {
  if (keys.dim() != 4 || !keys.sizes().equals(values.sizes()))
    throw ConfigError("nn::KVCache: keys and values must both be [batch, kv_heads, tokens, head_dim]");
  if (layers_.size() <= layer) layers_.resize(layer + 1);
  auto& l = layers_[layer];
  const auto n = keys.size(2);
  if (l.keys.defined() && (l.keys.size(0) != keys.size(0) || l.keys.size(1) != keys.size(1) || l.keys.size(3) != keys.size(3)))
    throw ConfigError("nn::KVCache: layer " + std::to_string(layer) + " holds a batch of " + std::to_string(l.keys.size(0)) +
                      " sequences; clear() the cache before another batch");
  if (!l.keys.defined() || l.length + n > l.keys.size(2)) {
    const auto capacity = std::max<std::int64_t>(l.length + n, l.keys.defined() ? 2 * l.keys.size(2) : 0);
    const auto grow = [&](const torch::Tensor& old, const torch::Tensor& like) {
      auto sizes = like.sizes().vec();
      sizes[2] = capacity;
      auto buffer = at::empty(sizes, like.options());
      if (l.length > 0) buffer.narrow(2, 0, l.length).copy_(old.narrow(2, 0, l.length));
      return buffer;
    };
    l.keys = grow(l.keys, keys);
    l.values = grow(l.values, values);
  }
  l.keys.narrow(2, l.length, n).copy_(keys);
  l.values.narrow(2, l.length, n).copy_(values);
  l.length += n;
  return {l.keys.narrow(2, 0, l.length), l.values.narrow(2, 0, l.length)};
}

DTRAIN_INLINE DecoderMask decoder_mask(const torch::Tensor& attention_mask, std::int64_t batch, std::int64_t new_tokens,
                                       std::int64_t past, std::optional<std::int64_t> window, torch::ScalarType dtype,
                                       torch::Device device, const torch::Tensor& documents) {
  const auto total = past + new_tokens;
  if (attention_mask.defined() && (attention_mask.dim() != 2 || attention_mask.size(0) != batch || attention_mask.size(1) != total))
    throw ConfigError("nn: the attention_mask must be [batch " + std::to_string(batch) + ", cached + new tokens " +
                      std::to_string(total) + "] of 0 (padding) and 1, got " + std::to_string(attention_mask.dim()) +
                      " dimensions" + (attention_mask.dim() == 2 ? " [" + std::to_string(attention_mask.size(0)) + ", " +
                                                                       std::to_string(attention_mask.size(1)) + "]"
                                                                 : std::string()));
  // Every key visible: the usual cases spelled without a tensor.
  const bool padded = attention_mask.defined() && !attention_mask.to(torch::kBool).all().item<bool>();
  if (documents.defined() && (past != 0 || !documents.sizes().equals({batch, new_tokens})))
    throw ConfigError("nn: packed documents need [batch, tokens] positions and no cache");
  if (!padded && !documents.defined() && (!window || total <= *window)) {
    if (new_tokens == 1) return {};
    if (past == 0) return {{}, true};
  }
  const auto longs = torch::TensorOptions().dtype(torch::kLong).device(device);
  const auto queries = at::arange(past, total, longs).unsqueeze(1);
  const auto keys = at::arange(0, total, longs).unsqueeze(0);
  auto allowed = keys <= queries;
  if (window) allowed = allowed & (keys > queries - *window);
  allowed = allowed.view({1, 1, new_tokens, total});
  if (padded) allowed = allowed & attention_mask.to(device).to(torch::kBool).view({batch, 1, 1, total});
  if (documents.defined()) {
    const auto d = documents.to(device);
    allowed = allowed & (d.unsqueeze(-1) == d.unsqueeze(-2)).view({batch, 1, new_tokens, total});
  }
  auto additive = at::zeros(allowed.sizes(), torch::TensorOptions().dtype(dtype).device(device));
  DecoderMask mask{additive.masked_fill_(allowed.logical_not(), detail::lowest_of(dtype)), false, {}};
  if (padded) {
    auto blind = allowed.logical_not().all(-1, true);
    if (blind.any().item<bool>()) mask.blind = std::move(blind);
  }
  return mask;
}

DTRAIN_INLINE torch::Tensor packed_documents(const torch::Tensor& position_ids) {
  if (position_ids.dim() != 2 || position_ids.size(1) == 0) return {};
  const auto before = at::cat({position_ids.narrow(1, 0, 1) - 1, position_ids.narrow(1, 0, position_ids.size(1) - 1)}, 1);
  const auto documents = (position_ids - before).ne(1).to(torch::kLong).cumsum(-1);
  return documents.select(1, documents.size(1) - 1).eq(0).all().item<bool>() ? torch::Tensor() : documents;
}

namespace detail {
/// softmax(q k^T * scale + mask) v with as many key/value heads as query heads: [batch, heads, new, width].
DTRAIN_INLINE torch::Tensor attend_heads(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                         const DecoderMask& mask, double scale, double dropout) {
#if DTRAIN_TORCH_AT_LEAST(2, 1)
  const c10::optional<torch::Tensor> additive =
      mask.additive.defined() ? c10::optional<torch::Tensor>(mask.additive.to(q.scalar_type())) : c10::nullopt;
  auto out = at::scaled_dot_product_attention(q, k, v, additive, dropout, mask.causal, scale);
#else
  auto scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  if (mask.additive.defined()) scores = scores + mask.additive.to(scores.scalar_type());
  if (mask.causal)
    scores = scores.masked_fill(at::ones({q.size(2), k.size(2)}, q.options().dtype(torch::kBool)).triu(1),
                                lowest_of(scores.scalar_type()));
  auto weights = at::softmax(scores, -1, torch::kFloat).to(q.scalar_type());
  if (dropout > 0) weights = at::dropout(weights, dropout, true);
  auto out = at::matmul(weights, v);
#endif
  return mask.blind.defined() ? out.masked_fill(mask.blind, 0) : out;
}
}  // namespace detail

DTRAIN_INLINE torch::Tensor decoder_attention(const torch::Tensor& q, torch::Tensor k, torch::Tensor v, const DecoderMask& mask,
                                              double scale, double dropout, bool training) {
  const auto batch = q.size(0), heads = q.size(1), queries = q.size(2), width = q.size(3);
  const auto kv_heads = k.size(1), keys = k.size(2);
  const double p = training ? dropout : 0.0;
  if (heads != kv_heads && queries == 1 && !mask.causal) {
    // A decode step with grouped-query attention: a key/value head's query heads become its rows
    // ([batch, kv_heads, heads / kv_heads, width]), so the cache is read in place rather than
    // copied for each query head; the one-row mask [batch, 1, 1, keys] broadcasts as it is.
    const auto out = detail::attend_heads(q.reshape({batch, kv_heads, heads / kv_heads, width}), k, v, mask, scale, p);
    return out.reshape({batch, 1, heads * width});  // [batch, kv_heads, group, width] is the heads' order
  }
  if (heads != kv_heads) {  // grouped-query attention: each key/value head serves heads / kv_heads query heads
    const auto repeat = [&](const torch::Tensor& t) {
      return t.unsqueeze(2).expand({batch, kv_heads, heads / kv_heads, keys, width}).reshape({batch, heads, keys, width});
    };
    k = repeat(k);
    v = repeat(v);
  }
  return detail::attend_heads(q, k, v, mask, scale, p).transpose(1, 2).reshape({batch, queries, heads * width});
}

DTRAIN_INLINE torch::Tensor decoder_positions(const torch::Tensor& attention_mask, std::int64_t batch, std::int64_t new_tokens,
                                              std::int64_t past, torch::Device device) {
  if (!attention_mask.defined())
    return at::arange(past, past + new_tokens, torch::TensorOptions().dtype(torch::kLong).device(device))
        .unsqueeze(0)
        .expand({batch, new_tokens});
  auto positions = attention_mask.to(device).to(torch::kLong).cumsum(-1) - 1;
  positions.masked_fill_(attention_mask.to(device) == 0, 0);
  return positions.narrow(1, positions.size(1) - new_tokens, new_tokens);
}

DTRAIN_INLINE RMSNormImpl::RMSNormImpl(std::int64_t size, double eps) : eps(eps) {
  weight = register_parameter("weight", torch::ones({size}));
}

DTRAIN_INLINE torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  auto h = x.to(torch::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, true) + eps);
  return weight * h.to(x.scalar_type());
}

DTRAIN_INLINE torch::Tensor rope_inverse_frequencies(std::int64_t head_dim, double theta, const std::string& type, double factor,
                                                     double low_freq_factor, double high_freq_factor,
                                                     std::int64_t original_max_positions) {
  // Op for op as transformers' modeling_rope_utils computes it, so that the fp32 values are equal.
  const auto exponent = at::arange(0, head_dim, 2, torch::kLong).to(torch::kFloat) / static_cast<double>(head_dim);
  auto inv = at::pow(theta, exponent).reciprocal();
  if (type == "linear") return inv / factor;
  if (type != "llama3") return inv;
  const double old_context = static_cast<double>(original_max_positions);
  const double low_freq_wavelen = old_context / low_freq_factor, high_freq_wavelen = old_context / high_freq_factor;
  const auto wavelen = inv.reciprocal() * (2 * M_PI);
  auto llama = at::where(wavelen > low_freq_wavelen, inv / factor, inv);
  const auto smooth = (wavelen.reciprocal() * old_context - low_freq_factor) / (high_freq_factor - low_freq_factor);
  const auto smoothed = at::rsub(smooth, 1) * llama / factor + smooth * llama;
  const auto medium = (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
  return at::where(medium, smoothed, llama);
}

DTRAIN_INLINE std::pair<torch::Tensor, torch::Tensor> rope_cos_sin(const torch::Tensor& inverse_frequencies,
                                                                   const torch::Tensor& positions, torch::ScalarType dtype) {
  const auto freqs = positions.unsqueeze(-1).to(torch::kFloat) * inverse_frequencies.to(positions.device());
  const auto angles = at::cat({freqs, freqs}, -1).unsqueeze(1);
  return {angles.cos().to(dtype), angles.sin().to(dtype)};
}

DTRAIN_INLINE torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const auto half = x.size(-1) / 2;
  const auto rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

namespace detail {

DTRAIN_INLINE weights::LoadReport load_causal_lm(torch::nn::Module* whole, torch::nn::Module& backbone,
                                                 const CausalLMLayout& layout, const std::filesystem::path& path,
                                                 weights::LoadOptions options) {
  auto state = weights::read(path);
  const auto source = weights::detail::weights_format(path).second.string();
  const auto& prefix = layout.backbone_prefix;
  const auto starts = [](const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; };
  const bool lm_file = std::any_of(state.begin(), state.end(), [&](const auto& kv) { return starts(kv.first, prefix); });
  std::vector<std::string> passed_over;
  std::erase_if(state, [&](const auto& kv) {
    const auto& key = kv.first;
    const auto inner = lm_file && starts(key, prefix) ? key.substr(prefix.size()) : key;
    const bool extra = (layout.tied && key == layout.head) || (layout.computed && layout.computed(inner));
    if (extra) passed_over.push_back(key);
    return extra;
  });
  weights::LoadReport report;
  if (whole && !lm_file && options.prefix.empty()) {
    // A backbone's file (a bare LlamaModel's, the hub's gpt2): into the backbone, the head new.
    report = weights::load_state_dict(backbone, std::move(state), source, options);
    for (auto& k : report.missing) k = prefix + k;
    if (!layout.tied) report.missing.push_back(layout.head);
  } else if (whole) {
    report = weights::load_state_dict(*whole, std::move(state), source, options);
  } else {
    if (lm_file && options.prefix.empty()) {
      options.prefix = prefix;
      std::erase_if(state, [&](const auto& kv) {
        if (starts(kv.first, prefix)) return false;
        passed_over.push_back(kv.first);
        return true;
      });
    }
    report = weights::load_state_dict(backbone, std::move(state), source, options);
  }
  report.unexpected.insert(report.unexpected.end(), passed_over.begin(), passed_over.end());
  return report;
}

}  // namespace detail

}  // namespace nn
DTRAIN_NAMESPACE_END
