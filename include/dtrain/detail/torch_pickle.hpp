// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reading a file Python's torch.save wrote (zip format) holding a dict of tensors: a state_dict.
//
// LibTorch 1.13's torch::pickle_load cannot: it reads collections.OrderedDict (a state_dict's
// type) as None, since it meets that global only as a tensor's empty backward hooks. This is a
// restricted unpickler, as torch.load(weights_only=True) is one: it knows the opcodes and the few
// globals torch.save writes for tensors and dicts (OrderedDict, _rebuild_tensor_v2,
// _rebuild_parameter, the typed storages) and calls nothing else, so a file cannot run code.

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <caffe2/serialize/inline_container.h>
#include <torch/types.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail::torch_pickle {

struct Value;
using Ref = std::shared_ptr<Value>;

/// One unpickled value; containers hold references, as Python's objects do.
struct Value {
  enum class Kind { none, boolean, integer, real, text, tuple, list, dict, tensor, storage, global, mark };
  Kind kind = Kind::none;
  std::int64_t integer = 0;
  double real = 0;
  std::string text;                       // text; a global's "module.name"
  std::vector<Ref> items;                 // tuple, list; a dict's keys and values alternating
  torch::Tensor tensor;                   // tensor; a storage as a flat tensor
  torch::ScalarType dtype = torch::kFloat;  // a storage global's element type
};

inline Ref make(Value::Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

/// The element type of a typed storage global (torch.FloatStorage, ...), or nothing.
std::optional<torch::ScalarType> storage_dtype(const std::string& name);

class Unpickler {
 public:
  Unpickler(caffe2::serialize::PyTorchStreamReader& zip, std::string source) : zip_(zip), source_(std::move(source)) {}

  Ref run(const char* data, std::size_t size);

 private:
  [[noreturn]] void fail(const std::string& what, const std::string& why = "is malformed") const {
    throw Error(source_ + ": " + what + " " + why + "; this reader takes a state_dict saved by Python's "
                "torch.save(model.state_dict(), path) (a dict of tensors, zip format)");
  }
  static std::string hex(unsigned v);
  char byte() {
    if (p_ >= end_) fail("the pickle", "ends early (truncated?)");
    return *p_++;
  }
  std::uint64_t byte_int(int n);
  std::string bytes(std::uint64_t n);
  std::string line();
  static Ref integer(std::int64_t v) {
    auto i = make(Value::Kind::integer);
    i->integer = v;
    return i;
  }
  static Ref tuple(std::vector<Ref> items) {
    auto t = make(Value::Kind::tuple);
    t->items = std::move(items);
    return t;
  }
  void push(Ref v) { stack_.push_back(std::move(v)); }
  Ref pop();
  std::vector<Ref> take(std::size_t n);
  std::vector<Ref> to_mark();
  Ref& top(Value::Kind k, const char* op);
  void memo(std::uint64_t i) {
    if (stack_.empty()) fail("a memo put", "has nothing to store");
    memo_[i] = stack_.back();
  }
  Ref recall(std::uint64_t i);

  // ('storage', <storage type>, key, location, numel): the record data/<key>, read once.
  Ref persistent(const Ref& id);

  Ref reduce(const Value& fn, const Value& args);

  caffe2::serialize::PyTorchStreamReader& zip_;
  std::string source_;
  const char* p_ = nullptr;
  const char* end_ = nullptr;
  std::vector<Ref> stack_;
  std::map<std::uint64_t, Ref> memo_;
  std::map<std::string, Ref> storages_;
};

/// The tensors of the dict saved at `path` by torch.save, by key, in the file's order (a value
/// that is not a tensor, such as an `_extra_state`, is left out and its key listed in `skipped`).
std::vector<std::pair<std::string, torch::Tensor>> read_tensor_dict(const std::filesystem::path& path,
                                                                    std::vector<std::string>* skipped = nullptr);

}  // namespace detail::torch_pickle

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/detail/impl/torch_pickle.ipp>
#endif
