// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of python_format.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/checkpointer/python_format.hpp>

// Only the bodies write pickles: the header stays without the JIT's pickler and its frontend.
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>

DTRAIN_NAMESPACE_BEGIN
namespace checkpointer {
namespace detail {

DTRAIN_INLINE std::string torch_save_bytes(const c10::IValue& value) {
  std::string pickle;
  std::vector<std::string> keys;
  torch::jit::Pickler pickler([&](const char* data, std::size_t n) { pickle.append(data, n); }, nullptr, nullptr,
                              nullptr,
                              [&](const at::Tensor&) {
                                keys.push_back(std::to_string(keys.size()));
                                return keys.back();
                              },
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::string out;
  caffe2::serialize::PyTorchStreamWriter zip([&](const void* data, std::size_t n) {
    out.append(static_cast<const char*>(data), n);
    return n;
  });
  zip.writeRecord("data.pkl", pickle.data(), pickle.size());
  const auto& tensors = pickler.tensorData();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto data = torch::jit::getWriteableTensorData(tensors[i]);
    zip.writeRecord("data/" + keys.at(i), data.data(), data.sizeInBytes());
  }
  zip.writeEndOfFile();
  return out;
}

DTRAIN_INLINE std::optional<c10::impl::GenericDict> python_param_state(const torch::optim::OptimizerParamState& s,
                                                                       bool copy) {
  using namespace torch::optim;
  auto d = string_dict();
  auto put = [&](const char* key, const at::Tensor& t) {
    // On the CPU: the file then loads on a machine without the GPU it was trained on.
    if (t.defined()) d.insert(key, t.detach().to(torch::kCPU, /*non_blocking=*/false, copy));
  };
  if (auto* sgd = dynamic_cast<const SGDParamState*>(&s)) {
    put("momentum_buffer", sgd->momentum_buffer());
  } else if (auto* adam = dynamic_cast<const AdamParamState*>(&s)) {
    d.insert("step", python_step(adam->step()));
    put("exp_avg", adam->exp_avg());
    put("exp_avg_sq", adam->exp_avg_sq());
    put("max_exp_avg_sq", adam->max_exp_avg_sq());
  } else if (auto* adamw = dynamic_cast<const AdamWParamState*>(&s)) {
    d.insert("step", python_step(adamw->step()));
    put("exp_avg", adamw->exp_avg());
    put("exp_avg_sq", adamw->exp_avg_sq());
    put("max_exp_avg_sq", adamw->max_exp_avg_sq());
  } else if (auto* rms = dynamic_cast<const RMSpropParamState*>(&s)) {
    d.insert("step", python_step(rms->step()));
    put("square_avg", rms->square_avg());
    put("momentum_buffer", rms->momentum_buffer());
    put("grad_avg", rms->grad_avg());
  } else if (auto* ada = dynamic_cast<const AdagradParamState*>(&s)) {
    d.insert("step", python_step(ada->step()));
    put("sum", ada->sum());
  } else {
    return std::nullopt;
  }
  return d;
}

DTRAIN_INLINE std::optional<c10::impl::GenericDict> python_group_options(const torch::optim::OptimizerOptions& o) {
  using namespace torch::optim;
  auto d = string_dict();
  auto betas = [](const std::tuple<double, double>& b) {
    return c10::ivalue::Tuple::create({std::get<0>(b), std::get<1>(b)});
  };
  if (auto* sgd = dynamic_cast<const SGDOptions*>(&o)) {
    d.insert("lr", sgd->lr());
    d.insert("momentum", sgd->momentum());
    d.insert("dampening", sgd->dampening());
    d.insert("weight_decay", sgd->weight_decay());
    d.insert("nesterov", sgd->nesterov());
  } else if (auto* adam = dynamic_cast<const AdamOptions*>(&o)) {
    d.insert("lr", adam->lr());
    d.insert("betas", betas(adam->betas()));
    d.insert("eps", adam->eps());
    d.insert("weight_decay", adam->weight_decay());
    d.insert("amsgrad", adam->amsgrad());
  } else if (auto* adamw = dynamic_cast<const AdamWOptions*>(&o)) {
    d.insert("lr", adamw->lr());
    d.insert("betas", betas(adamw->betas()));
    d.insert("eps", adamw->eps());
    d.insert("weight_decay", adamw->weight_decay());
    d.insert("amsgrad", adamw->amsgrad());
  } else if (auto* rms = dynamic_cast<const RMSpropOptions*>(&o)) {
    d.insert("lr", rms->lr());
    d.insert("alpha", rms->alpha());
    d.insert("eps", rms->eps());
    d.insert("weight_decay", rms->weight_decay());
    d.insert("momentum", rms->momentum());
    d.insert("centered", rms->centered());
  } else if (auto* ada = dynamic_cast<const AdagradOptions*>(&o)) {
    d.insert("lr", ada->lr());
    d.insert("lr_decay", ada->lr_decay());
    d.insert("weight_decay", ada->weight_decay());
    d.insert("initial_accumulator_value", ada->initial_accumulator_value());
    d.insert("eps", ada->eps());
  } else {
    return std::nullopt;
  }
  return d;
}

DTRAIN_INLINE std::optional<c10::IValue> python_optimizer_state(const torch::optim::Optimizer& optimizer, bool copy) {
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  std::int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    auto options = python_group_options(group.options());
    if (!options) return std::nullopt;
    c10::impl::GenericList params(c10::AnyType::get());  // a List[int] would pickle as build_intlist
    for (const auto& p : group.params()) {
      const auto it = optimizer.state().find(optimizer_state_key(optimizer.state(), p));
      if (it != optimizer.state().end()) {
        auto s = python_param_state(*it->second, copy);
        if (!s) return std::nullopt;
        state.insert(index, std::move(*s));
      }
      params.push_back(index++);
    }
    options->insert("params", params);
    groups.push_back(std::move(*options));
  }
  auto out = string_dict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return c10::IValue(out);
}

DTRAIN_INLINE bool renew_state_tensors(torch::optim::Optimizer& optimizer, SnapshotBuffers* buffers) {
  using namespace torch::optim;
  for (const auto& [key, state] : optimizer.state()) {
    const auto* s = state.get();
    if (!dynamic_cast<const SGDParamState*>(s) && !dynamic_cast<const AdamParamState*>(s) &&
        !dynamic_cast<const AdamWParamState*>(s) && !dynamic_cast<const RMSpropParamState*>(s) &&
        !dynamic_cast<const AdagradParamState*>(s))
      return false;
  }
  for (auto& [key, state] : optimizer.state()) {
    std::ostringstream name;
    name << "optimizer/" << key << '/';
    auto renewed = [&](const at::Tensor& t, const char* field) {
      if (!t.defined()) return t;
      if (!buffers) return t.clone();
      auto copy = buffers->copy(name.str() + field, t);
      buffers->keep(name.str() + field, t);  // the snapshot's: free again once its write is done
      return copy;
    };
    auto* s = state.get();
    if (auto* sgd = dynamic_cast<SGDParamState*>(s)) {
      sgd->momentum_buffer(renewed(sgd->momentum_buffer(), "momentum_buffer"));
    } else if (auto* adam = dynamic_cast<AdamParamState*>(s)) {
      adam->exp_avg(renewed(adam->exp_avg(), "exp_avg")).exp_avg_sq(renewed(adam->exp_avg_sq(), "exp_avg_sq"));
      adam->max_exp_avg_sq(renewed(adam->max_exp_avg_sq(), "max_exp_avg_sq"));
    } else if (auto* adamw = dynamic_cast<AdamWParamState*>(s)) {
      adamw->exp_avg(renewed(adamw->exp_avg(), "exp_avg")).exp_avg_sq(renewed(adamw->exp_avg_sq(), "exp_avg_sq"));
      adamw->max_exp_avg_sq(renewed(adamw->max_exp_avg_sq(), "max_exp_avg_sq"));
    } else if (auto* rms = dynamic_cast<RMSpropParamState*>(s)) {
      rms->square_avg(renewed(rms->square_avg(), "square_avg"))
          .momentum_buffer(renewed(rms->momentum_buffer(), "momentum_buffer"));
      rms->grad_avg(renewed(rms->grad_avg(), "grad_avg"));
    } else if (auto* ada = dynamic_cast<AdagradParamState*>(s)) {
      ada->sum(renewed(ada->sum(), "sum"));
    }
  }
  return true;
}
}  // namespace detail
}  // namespace checkpointer
DTRAIN_NAMESPACE_END
