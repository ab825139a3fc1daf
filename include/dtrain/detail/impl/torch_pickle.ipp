// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of torch_pickle.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/detail/torch_pickle.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace detail {
namespace torch_pickle {

DTRAIN_INLINE std::optional<torch::ScalarType> storage_dtype(const std::string& name) {
  static const std::map<std::string, torch::ScalarType> types = {
      {"torch.FloatStorage", torch::kFloat},   {"torch.DoubleStorage", torch::kDouble},
      {"torch.HalfStorage", torch::kHalf},     {"torch.BFloat16Storage", torch::kBFloat16},
      {"torch.LongStorage", torch::kLong},     {"torch.IntStorage", torch::kInt},
      {"torch.ShortStorage", torch::kShort},   {"torch.CharStorage", torch::kChar},
      {"torch.ByteStorage", torch::kByte},     {"torch.BoolStorage", torch::kBool}};
  const auto it = types.find(name);
  if (it == types.end()) return std::nullopt;
  return it->second;
}

DTRAIN_INLINE Ref Unpickler::run(const char* data, std::size_t size) {
  p_ = data, end_ = data + size;
  while (true) {
    const auto op = static_cast<unsigned char>(byte());
    switch (op) {
      case 0x80: byte(); break;                                   // PROTO
      case '.': return pop();                                     // STOP
      case 'c': {                                                 // GLOBAL
        auto g = make(Value::Kind::global);
        g->text = line();  // the module, then the name (two statements: the order matters)
        g->text += "." + line();
        push(g);
        break;
      }
      case 'q': memo(byte_int(1)); break;                         // BINPUT
      case 'r': memo(byte_int(4)); break;                         // LONG_BINPUT
      case 'h': push(recall(byte_int(1))); break;                 // BINGET
      case 'j': push(recall(byte_int(4))); break;                 // LONG_BINGET
      case '(': push(make(Value::Kind::mark)); break;             // MARK
      case ')': push(make(Value::Kind::tuple)); break;            // EMPTY_TUPLE
      case ']': push(make(Value::Kind::list)); break;             // EMPTY_LIST
      case '}': push(make(Value::Kind::dict)); break;             // EMPTY_DICT
      case 't': push(tuple(to_mark())); break;                    // TUPLE
      case 0x85: push(tuple(take(1))); break;                     // TUPLE1
      case 0x86: push(tuple(take(2))); break;                     // TUPLE2
      case 0x87: push(tuple(take(3))); break;                     // TUPLE3
      case 'N': push(make(Value::Kind::none)); break;             // NONE
      case 0x88: case 0x89: {                                     // NEWTRUE, NEWFALSE
        auto b = make(Value::Kind::boolean);
        b->integer = op == 0x88;
        push(b);
        break;
      }
      case 'K': push(integer(byte_int(1))); break;                // BININT1
      case 'M': push(integer(byte_int(2))); break;                // BININT2
      case 'J': push(integer(static_cast<std::int32_t>(byte_int(4)))); break;  // BININT
      case 0x8a: {                                                // LONG1
        const auto n = byte_int(1);
        if (n > 8) fail("an integer wider than 64 bits");
        std::int64_t v = 0;
        for (std::uint64_t i = 0; i < n; ++i) v |= static_cast<std::int64_t>(byte_int(1)) << (8 * i);
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v -= std::int64_t{1} << (8 * n);  // sign
        push(integer(v));
        break;
      }
      case 'G': {                                                 // BINFLOAT, big-endian
        std::uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(byte());
        auto r = make(Value::Kind::real);
        std::memcpy(&r->real, &bits, 8);
        push(r);
        break;
      }
      case 'X': case 0x8c: case 'U': case 'T': {                  // BINUNICODE, SHORT_BINUNICODE, *BINSTRING
        const auto n = byte_int(op == 'X' || op == 'T' ? 4 : 1);
        auto s = make(Value::Kind::text);
        s->text = bytes(n);
        push(s);
        break;
      }
      case 'a': {                                                 // APPEND
        auto v = pop();
        top(Value::Kind::list, "APPEND")->items.push_back(v);
        break;
      }
      case 'e': {                                                 // APPENDS
        auto vs = to_mark();
        auto& l = top(Value::Kind::list, "APPENDS")->items;
        l.insert(l.end(), vs.begin(), vs.end());
        break;
      }
      case 's': {                                                 // SETITEM
        auto v = pop(), k = pop();
        auto& d = top(Value::Kind::dict, "SETITEM")->items;
        d.push_back(k), d.push_back(v);
        break;
      }
      case 'u': {                                                 // SETITEMS
        auto kvs = to_mark();
        auto& d = top(Value::Kind::dict, "SETITEMS")->items;
        d.insert(d.end(), kvs.begin(), kvs.end());
        break;
      }
      case 'b': pop(); break;   // BUILD: a state_dict's _metadata, a tensor's hooks: not needed
      case 'Q': push(persistent(pop())); break;                   // BINPERSID
      case 'R': {                                                 // REDUCE
        auto args = pop(), fn = pop();
        push(reduce(*fn, *args));
        break;
      }
      default: fail("the pickle opcode 0x" + hex(op), "is not one torch.save writes for tensors and dicts");
    }
  }
}

DTRAIN_INLINE std::string Unpickler::hex(unsigned v) {
  const char* d = "0123456789abcdef";
  return {d[(v >> 4) & 15], d[v & 15]};
}

DTRAIN_INLINE std::uint64_t Unpickler::byte_int(int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(byte())) << (8 * i);
  return v;
}

DTRAIN_INLINE std::string Unpickler::bytes(std::uint64_t n) {
  if (static_cast<std::uint64_t>(end_ - p_) < n) fail("the pickle", "ends early (truncated?)");
  std::string s(p_, n);
  p_ += n;
  return s;
}

DTRAIN_INLINE std::string Unpickler::line() {
  std::string s;
  for (char c = byte(); c != '\n'; c = byte()) s += c;
  return s;
}

DTRAIN_INLINE Ref Unpickler::pop() {
  if (stack_.empty()) fail("the pickle's stack", "underflows");
  auto v = std::move(stack_.back());
  stack_.pop_back();
  return v;
}

DTRAIN_INLINE std::vector<Ref> Unpickler::take(std::size_t n) {
  if (stack_.size() < n) fail("the pickle's stack", "underflows");
  std::vector<Ref> out(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
  stack_.resize(stack_.size() - n);
  return out;
}

DTRAIN_INLINE std::vector<Ref> Unpickler::to_mark() {
  for (std::size_t i = stack_.size(); i-- > 0;)
    if (stack_[i]->kind == Value::Kind::mark) {
      std::vector<Ref> out(stack_.begin() + static_cast<std::ptrdiff_t>(i) + 1, stack_.end());
      stack_.resize(i);
      return out;
    }
  fail("a MARK", "is missing");
}

DTRAIN_INLINE Ref& Unpickler::top(Value::Kind k, const char* op) {
  if (stack_.empty() || stack_.back()->kind != k) fail(std::string("the target of ") + op, "is not a container");
  return stack_.back();
}

DTRAIN_INLINE Ref Unpickler::recall(std::uint64_t i) {
  const auto it = memo_.find(i);
  if (it == memo_.end()) fail("memo entry " + std::to_string(i), "is read before it is written");
  return it->second;
}

DTRAIN_INLINE Ref Unpickler::persistent(const Ref& id) {
  if (id->kind != Value::Kind::tuple || id->items.size() < 5 || id->items[0]->text != "storage")
    fail("a persistent id", "is not a storage");
  const auto& type = *id->items[1];
  const auto dtype = type.kind == Value::Kind::global ? storage_dtype(type.text) : std::nullopt;
  if (!dtype) fail("the storage type " + type.text, "is not supported");
  const auto& key = id->items[2]->text;
  auto& cached = storages_[key];
  if (!cached) {
    const std::string record = "data/" + key;
    if (!zip_.hasRecord(record)) fail("the record " + record, "is missing");
    auto [data, size] = zip_.getRecord(record);
    const auto element = static_cast<std::int64_t>(c10::elementSize(*dtype));
    const auto n = static_cast<std::int64_t>(size) / element;
    cached = make(Value::Kind::storage);
    cached->tensor = torch::from_blob(data.get(), {n}, torch::dtype(*dtype)).clone();
  }
  return cached;
}

DTRAIN_INLINE Ref Unpickler::reduce(const Value& fn, const Value& args) {
  if (fn.kind != Value::Kind::global || args.kind != Value::Kind::tuple) fail("a REDUCE", "has no global to call");
  if (fn.text == "collections.OrderedDict") return make(Value::Kind::dict);
  if (fn.text == "torch._utils._rebuild_parameter") {
    if (args.items.empty() || args.items[0]->kind != Value::Kind::tensor) fail("_rebuild_parameter's arguments");
    return args.items[0];
  }
  if (fn.text == "torch._utils._rebuild_tensor_v2") {
    // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
    const auto& a = args.items;
    if (a.size() < 4 || a[0]->kind != Value::Kind::storage) fail("_rebuild_tensor_v2's arguments");
    auto ints = [&](const Value& t) {
      std::vector<std::int64_t> v;
      for (const auto& x : t.items) v.push_back(x->integer);
      return v;
    };
    auto t = make(Value::Kind::tensor);
    t->tensor = a[0]->tensor.as_strided(ints(*a[2]), ints(*a[3]), a[1]->integer).clone();
    return t;
  }
  fail("the global " + fn.text, "is not one a state_dict holds (only tensors and dicts are read)");
}

DTRAIN_INLINE std::vector<std::pair<std::string, torch::Tensor>> read_tensor_dict(const std::filesystem::path& path,
                                                                                  std::vector<std::string>* skipped) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw Error(path.string() + ": no such file; pass the path torch.save(model.state_dict(), path) wrote");
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
  try {
    zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path.string());
  } catch (const c10::Error&) {
    throw Error(path.string() + ": not a zip-format torch.save file (saved with "
                "_use_new_zipfile_serialization=False, or not by torch.save); save it again with torch.save(sd, path)");
  }
  Ref root;
  try {  // the zip's own errors (a damaged record, a CRC mismatch) come as c10::Error
    if (!zip->hasRecord("data.pkl")) throw Error(path.string() + ": the zip holds no data.pkl; is it a torch.save file?");
    auto [data, size] = zip->getRecord("data.pkl");
    Unpickler u(*zip, path.string());
    root = u.run(static_cast<const char*>(data.get()), size);
  } catch (const c10::Error& e) {
    throw Error(path.string() + ": its zip is damaged (" + e.what_without_backtrace() +
                "); copy it again, or save it again with torch.save(sd, path)");
  }
  if (root->kind != Value::Kind::dict)
    throw Error(path.string() + ": holds no dict at its top; save model.state_dict() (a dict of tensors), not the "
                "model object");
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (std::size_t i = 0; i + 1 < root->items.size(); i += 2) {
    const auto& k = *root->items[i];
    const auto& v = *root->items[i + 1];
    if (k.kind != Value::Kind::text) throw Error(path.string() + ": a key of its dict is not a string");
    if (v.kind == Value::Kind::tensor) out.emplace_back(k.text, v.tensor);
    else if (skipped) skipped->push_back(k.text);
  }
  return out;
}
}  // namespace torch_pickle
}  // namespace detail
DTRAIN_NAMESPACE_END
