// SPDX-License-Identifier: Apache-2.0
#pragma once
// What a worker holds: bytes of an optimizer's state.

#include <cstdint>
#include <sstream>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/output-archive.h>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {

std::int64_t bytes_of(const torch::Tensor& t);

/// Bytes of the tensors an optimizer keeps per parameter (Adam's two moments, SGD's momentum...).
/// LibTorch's own optimizers are counted tensor by tensor; another optimizer's state is measured
/// by the size of its serialization (a close upper bound).
std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& opt);

}  // namespace detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/detail/impl/memory.ipp>
#endif
