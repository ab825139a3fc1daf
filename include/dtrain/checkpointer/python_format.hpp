// SPDX-License-Identifier: Apache-2.0
#pragma once
// State in the format Python's torch.save writes (a zip of data.pkl and one record per storage),
// pickled without LibTorch's type tags: `torch.load(path, weights_only=True)` reads it, and
// torch::jit::pickle_load reads it back in C++.
//
// torch::jit::pickle_save tags every dict with `torch.jit._pickle.restore_type_tag`, a global that
// weights_only refuses; a Pickler with tag_aggregates = false writes plain dicts, lists and tuples.

#include <cstddef>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <dtrain/checkpointer/snapshot_buffers.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer::detail {

/// `value` as the bytes of a torch.save file (zip format, untagged pickle). Tensors are written
/// from the CPU.
std::string torch_save_bytes(const c10::IValue& value);

/// A dict with string keys and values of any type, as Python's state dicts are.
inline c10::impl::GenericDict string_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

/// Python's optimizers keep `step` as a float32 0-dim tensor.
inline at::Tensor python_step(std::int64_t step) { return torch::tensor(static_cast<float>(step)); }

/// The per-parameter state Python's optimizer of the same kind keeps, or nothing for a state type
/// this function does not know. `copy` = false references CPU tensors instead of copying them
/// (for state the optimizer no longer updates, see renew_state_tensors).
std::optional<c10::impl::GenericDict> python_param_state(const torch::optim::OptimizerParamState& s,
                                                         bool copy = true);

/// A param group's options under the names Python's optimizer of the same kind uses.
std::optional<c10::impl::GenericDict> python_group_options(const torch::optim::OptimizerOptions& o);

/// The key of parameter `p` in an optimizer's state: LibTorch 1.13 keys it by the text of the
/// TensorImpl's address (c10::guts::to_string), LibTorch 2.x by the address itself.
template <class State>
auto optimizer_state_key(const State&, const torch::Tensor& p) {
  if constexpr (std::is_same_v<typename State::key_type, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return static_cast<typename State::key_type>(p.unsafeGetTensorImpl());
  }
}

/// `optimizer`'s state as Python's `optimizer.state_dict()` structures it:
/// {"state": {index: {...}}, "param_groups": [{...options, "params": [indices]}]}, parameters
/// numbered over all groups in order. Nothing for an optimizer other than SGD, Adam, AdamW,
/// RMSprop and Adagrad (optimizer.pt, read by C++, still holds its state). Tensors are CPU copies.
std::optional<c10::IValue> python_optimizer_state(const torch::optim::Optimizer& optimizer, bool copy = true);

/// Gives each per-parameter state tensor of `optimizer` (SGD, Adam, AdamW, RMSprop, Adagrad) a
/// copy of itself to update from now on, so that the tensors referenced before (by an
/// OutputArchive that optimizer.save() filled, by python_optimizer_state(optimizer, false)) keep
/// this moment's values while a writer serializes them. The copy is a memcpy on the training
/// thread; the serialization (pickling, zip CRCs) then runs on the writer's. With `buffers` the
/// copies go into the state tensors an earlier snapshot referenced, once nothing else holds them
/// (see SnapshotBuffers), and this snapshot's are kept for the next. False, changing nothing, when
/// a state type is not one of these.
bool renew_state_tensors(torch::optim::Optimizer& optimizer, SnapshotBuffers* buffers = nullptr);

}  // namespace checkpointer::detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/checkpointer/impl/python_format.ipp>
#endif
