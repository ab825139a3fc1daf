// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of memory.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/detail/memory.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace detail {

DTRAIN_INLINE std::int64_t bytes_of(const torch::Tensor& t) {
  if (!t.defined()) return 0;
  if (t.is_sparse()) return bytes_of(t._indices()) + bytes_of(t._values());
  return t.numel() * static_cast<std::int64_t>(t.element_size());
}

DTRAIN_INLINE std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& opt) {
  std::int64_t n = 0;
  for (const auto& [key, st] : opt.state()) {
    const auto* s = st.get();
    if (auto* a = dynamic_cast<const torch::optim::AdamParamState*>(s))
      n += bytes_of(a->exp_avg()) + bytes_of(a->exp_avg_sq()) + bytes_of(a->max_exp_avg_sq());
    else if (auto* w = dynamic_cast<const torch::optim::AdamWParamState*>(s))
      n += bytes_of(w->exp_avg()) + bytes_of(w->exp_avg_sq()) + bytes_of(w->max_exp_avg_sq());
    else if (auto* g = dynamic_cast<const torch::optim::SGDParamState*>(s))
      n += bytes_of(g->momentum_buffer());
    else if (auto* r = dynamic_cast<const torch::optim::RMSpropParamState*>(s))
      n += bytes_of(r->square_avg()) + bytes_of(r->momentum_buffer()) + bytes_of(r->grad_avg());
    else if (auto* d = dynamic_cast<const torch::optim::AdagradParamState*>(s))
      n += bytes_of(d->sum());
    else {
      torch::serialize::OutputArchive archive;
      s->serialize(archive);
      std::ostringstream os;
      archive.save_to(os);
      n += static_cast<std::int64_t>(os.str().size());
    }
  }
  return n;
}
}  // namespace detail
DTRAIN_NAMESPACE_END
