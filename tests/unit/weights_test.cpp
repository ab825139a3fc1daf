// SPDX-License-Identifier: Apache-2.0
// weights/: safetensors read and written (every dtype, metadata, empty tensors, scalars, strided
// inputs), bad files refused naming file and tensor, a seeded fuzz of the reader, weights::load over
// every format with prefixes, strictness and dtype conversion; and, through the Python environment
// of scripts/python-env (tests/unit/safetensors_reference.py), files of Python's safetensors and
// transformers read equal, dtrain's files read equal in Python, and the real all-MiniLM-L6-v2.

#include "../dtrain_catch.hpp"
#include "../run_command.hpp"

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/torch.h>

#include <dtrain/detail/sha256.hpp>
#include <dtrain/weights.hpp>

namespace fs = std::filesystem;
namespace weights = dtrain::weights;
namespace compat = dtrain::compat;
using State = std::vector<std::pair<std::string, torch::Tensor>>;

namespace {

struct Dir {
  fs::path path;
  Dir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("dtrain_safetensors_" + std::to_string(rd()) + std::to_string(getpid()));
    fs::create_directories(path);
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& n) const { return path / n; }
};

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

std::string le64(std::uint64_t n) { return std::string(reinterpret_cast<const char*>(&n), 8); }

/// A safetensors file from its parts; `length` overrides the header length field.
void write_raw(const fs::path& p, const std::string& header, std::size_t data_bytes,
               std::optional<std::uint64_t> length = {}) {
  write_bytes(p, le64(length.value_or(header.size())) + header + std::string(data_bytes, '\x01'));
}

/// The values safetensors_reference.py's write-dtypes saves for `dtype`.
torch::Tensor values(torch::ScalarType dtype) {
  const bool floating = c10::isFloatingType(dtype);
  const auto base = torch::arange(-6, 6, torch::kDouble).reshape({3, 4}) * (floating ? 0.5 : 1.0);
  if (dtype == torch::kBool) return base > 0;
  if (dtype == torch::kByte) return (base + 6).to(dtype);
  if (dtype == torch::kComplexFloat) return torch::complex(base, -base).to(dtype);
  return base.to(dtype);
}

const std::vector<torch::ScalarType> all_dtypes = {torch::kDouble, torch::kFloat, torch::kHalf, torch::kBFloat16,
                                                   torch::kLong,   torch::kInt,   torch::kShort, torch::kChar,
                                                   torch::kByte,   torch::kBool,  torch::kComplexFloat};

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

/// One line of a description (see safetensors_reference.py): name, dtype, shape, sha256, sum.
std::string describe(const std::string& name, const torch::Tensor& tensor) {
  const auto t = tensor.contiguous();
  const auto digest = dtrain::detail::sha256_of({static_cast<const char*>(t.data_ptr()), t.nbytes()});
  const auto flat = t.reshape({-1});
  const double sum = (t.is_complex() ? torch::view_as_real(flat) : flat).to(torch::kDouble).sum().item<double>();
  std::string shape;
  for (auto d : t.sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
  char buf[64];
  const auto end = std::to_chars(buf, buf + sizeof buf, sum).ptr;
  return name + "\t" + std::string(*weights::detail::dtype_name(t.scalar_type())) + "\t" + shape + "\t" +
         dtrain::detail::to_hex(digest.data(), digest.size()) + "\t" + std::string(buf, end);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep) out.emplace_back();
    else out.back().push_back(c);
  }
  return out;
}

/// `state` agrees with the description at `desc` (tensors by name; sums within rounding).
void check_described(const State& state, const fs::path& desc) {
  std::map<std::string, std::vector<std::string>> want;
  std::istringstream in(read_bytes(desc));
  for (std::string line; std::getline(in, line);)
    if (line.rfind("__metadata__", 0) != 0) want[split(line, '\t')[0]] = split(line, '\t');
  REQUIRE(state.size() == want.size());
  for (const auto& [name, t] : state) {
    INFO(name);
    REQUIRE(want.count(name));
    const auto got = split(describe(name, t), '\t');
    const auto& w = want.at(name);
    CHECK(std::vector(got.begin(), got.begin() + 4) == std::vector(w.begin(), w.begin() + 4));
    const double x = std::stod(got[4]), y = std::stod(w[4]);
    CHECK(std::abs(x - y) <= 1e-9 * (1 + std::abs(x) + std::abs(y)));
  }
}

/// Runs tests/unit/safetensors_reference.py with the Python of scripts/python-env.
dtrain_test::CommandResult reference(const std::string& args) {
  return dtrain_test::run_command(std::string(DTRAIN_VENV_PYTHON) + " " + DTRAIN_SAFETENSORS_REFERENCE + " " + args);
}

/// A module with a float parameter of each name and shape of `state`: the submodules the dotted
/// names say, as a Hugging Face model's.
std::shared_ptr<torch::nn::Module> module_like(const State& state) {
  auto root = std::make_shared<torch::nn::Module>();
  std::map<std::string, std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& [name, t] : state) {
    auto m = root;
    std::size_t start = 0;
    for (auto dot = name.find('.'); dot != std::string::npos; start = dot + 1, dot = name.find('.', start)) {
      const auto path = name.substr(0, dot);
      auto it = modules.find(path);
      if (it == modules.end())
        it = modules.emplace(path, m->register_module(name.substr(start, dot - start), std::make_shared<torch::nn::Module>())).first;
      m = it->second;
    }
    m->register_parameter(name.substr(start), torch::zeros(t.sizes()));
  }
  return root;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const dtrain::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("safetensors: every dtype, metadata, empty tensors, scalars and strided inputs round-trip", "[weights]") {
  Dir dir;
  State state;
  for (auto dt : all_dtypes) state.emplace_back("t_" + lower(*weights::detail::dtype_name(dt)), values(dt));
  state.emplace_back("empty", torch::zeros({0, 3}));
  state.emplace_back("scalar", torch::tensor(2.5, torch::kDouble));
  state.emplace_back("transposed", torch::arange(12, torch::kFloat).reshape({3, 4}).t());
  state.emplace_back("strided", torch::arange(20, torch::kBFloat16).slice(0, 1, 20, 3));
  const auto path = dir / "rt.safetensors";
  weights::save_safetensors(path, state, {{"format", "pt"}, {"note", "ünïcode"}});
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);  // no temporary left

  weights::SafetensorsFile file(path);
  CHECK(file.metadata() == std::map<std::string, std::string>{{"format", "pt"}, {"note", "ünïcode"}});
  REQUIRE(file.tensors().size() == state.size());
  for (const auto& [name, t] : state) {
    INFO(name);
    const auto got = file.tensor(name);
    CHECK(got.scalar_type() == t.scalar_type());
    CHECK(got.sizes() == t.sizes());
    CHECK(torch::equal(got, t));
  }
  // The data region starts at a multiple of 8 and every tensor at a multiple of its element size.
  const auto bytes = read_bytes(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK((8 + n) % 8 == 0);
  for (const auto& t : file.tensors()) CHECK(t.begin % (weights::detail::find_dtype(t.dtype)->bits / 8) == 0);

  // No copy: two reads share the mapping, which outlives the file object; writes stay in memory.
  CHECK(file.tensor("t_f32").data_ptr() == file.tensor("t_f32").data_ptr());
  torch::Tensor kept;
  {
    weights::SafetensorsFile again(path);
    kept = again.tensor("t_f64");
  }
  CHECK(torch::equal(kept, values(torch::kDouble)));
  kept.add_(1);
  CHECK(torch::equal(weights::SafetensorsFile(path).tensor("t_f64"), values(torch::kDouble)));
  CHECK(weights::read(path).size() == state.size());
}

TEST_CASE("safetensors: the writer refuses what the format cannot hold, naming file and tensor", "[weights]") {
  Dir dir;
  const auto path = dir / "w.safetensors";
  const auto t = torch::ones({2});
  CHECK_THAT(error_of([&] { weights::save_safetensors(path, {{"a", t}, {"a", t}}); }),
             Catch::Contains(path.string()) && Catch::Contains("\"a\"") && Catch::Contains("twice"));
  CHECK_THAT(error_of([&] { weights::save_safetensors(path, {{"__metadata__", t}}); }), Catch::Contains("reserved"));
  CHECK_THAT(error_of([&] { weights::save_safetensors(path, {{"c", t.to(torch::kComplexDouble)}}); }),
             Catch::Contains(path.string()) && Catch::Contains("\"c\"") && Catch::Contains("ComplexDouble"));
  CHECK_THAT(error_of([&] { weights::save_safetensors(path, {{"u", torch::Tensor()}}); }), Catch::Contains("undefined"));
  CHECK_THAT(error_of([&] { weights::save_safetensors(dir / "no" / "such.safetensors", {{"a", t}}); }),
             Catch::Contains("no/such.safetensors") && Catch::Contains("cannot create"));
  CHECK(!fs::exists(path));
}

TEST_CASE("safetensors: a bad file is an Error naming the file, the tensor and what to do", "[weights]") {
  Dir dir;
  const auto p = dir / "bad.safetensors";
  const auto f32 = [](const std::string& shape, std::uint64_t b, std::uint64_t e) {
    return "{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(e) + "]}";
  };
  const auto rejected = [&](const std::vector<std::string>& parts) {
    const auto what = error_of([&] { weights::SafetensorsFile(p).state(); });
    INFO(what);
    CHECK_THAT(what, Catch::Contains(p.string()));
    for (const auto& part : parts) CHECK_THAT(what, Catch::Contains(part));
  };
  write_bytes(p, "abc");
  rejected({"is 3 bytes", "truncated"});
  write_raw(p, "{\"a\":" + f32("[1]", 0, 4) + "}", 4, 4096);
  rejected({"says 4096 bytes", "truncated"});
  write_raw(p, "{}", 0, 200'000'000);
  rejected({"100 MB"});
  write_raw(p, "{\"a\":", 0);
  rejected({"not a JSON object"});
  write_raw(p, "[1, 2]", 0);
  rejected({"not a JSON object"});
  write_raw(p, "{\"a\":" + f32("[2]", 0, 8) + "}", 4);
  rejected({"\"a\"", "ends at byte 8 of a 4-byte data region", "truncated"});
  write_raw(p, "{\"a\":" + f32("[2]", 0, 8) + ",\"b\":" + f32("[2]", 4, 12) + "}", 12);
  rejected({"\"b\"", "overlaps tensor \"a\""});
  write_raw(p, "{\"a\":" + f32("[1]", 0, 4) + ",\"b\":" + f32("[1]", 8, 12) + "}", 12);
  rejected({"before tensor \"b\"", "belong to no tensor"});
  write_raw(p, "{\"a\":" + f32("[1]", 0, 4) + "}", 8);
  rejected({"\"a\"", "8 bytes and its tensors cover 4"});
  write_raw(p, "{\"a\":" + f32("[3]", 0, 8) + "}", 8);
  rejected({"\"a\"", "12 bytes", "span 8"});
  write_raw(p, "{\"a\":" + f32("[-1]", 0, 4) + "}", 4);
  rejected({"\"a\"", "not a list of sizes"});
  write_raw(p, "{\"a\":" + f32("[4294967296,4294967296,0]", 0, 0) + "}", 0);
  rejected({"\"a\"", "too large"});
  write_raw(p, "{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
  rejected({"\"a\"", "\"F33\"", "no safetensors dtype"});
  write_raw(p, "{\"a\":" + f32("[1]", 0, 4) + ",\"a\":" + f32("[1]", 4, 8) + "}", 8);
  rejected({"\"a\" appears twice"});
  write_raw(p, "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
  rejected({"\"a\"", "no \"dtype\""});
  write_raw(p, "{\"__metadata__\":{\"n\":1}}", 0);
  rejected({"\"n\"", "not a string"});
  // A dtype no LibTorch has a type for: the header is fine, the tensor is refused, naming the
  // LibTorch compiled against.
  const std::string this_libtorch = "LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
  write_raw(p, "{\"a\":{\"dtype\":\"F6_E3M2\",\"shape\":[4],\"data_offsets\":[0,3]}}", 3);
  CHECK(weights::SafetensorsFile(p).tensors().size() == 1);
  rejected({"\"a\"", "F6_E3M2", this_libtorch + " has no type for"});
  // U16: read where the LibTorch has uint16 (2.3 on), else refused naming the version that reads it.
  write_raw(p, "{\"a\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4);
  if (const auto u16 = compat::added_scalar_type("U16"); u16.type) {
    const auto a = weights::SafetensorsFile(p).tensor("a");
    CHECK(a.scalar_type() == *u16.type);
    CHECK(a.sizes() == torch::IntArrayRef{2});
  } else {
    rejected({"\"a\"", "U16", this_libtorch + " has no type for (LibTorch 2.3 and later have)"});
  }
  write_raw(p, "{\"a\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);  // bytes 0x01 0x01
  CHECK(weights::SafetensorsFile(p).tensor("a").all().item<bool>());
  const std::string bools = "{\"a\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,2]}}";
  write_bytes(p, le64(bools.size()) + bools + std::string("\x01\x02", 2));
  rejected({"\"a\"", "BOOL but holds the byte 2"});
  CHECK_THAT(error_of([&] { weights::SafetensorsFile(dir.path); }), Catch::Contains("not a regular file"));
}

TEST_CASE("load: formats, prefixes, strictness and dtype conversion", "[weights]") {
  Dir dir;
  const auto w = torch::randn({2, 3}), b = torch::randn({3}), head = torch::randn({4, 3});
  const State backbone = {{"encoder.w", w}, {"pooler.b", b}};
  const State task = {{"bert.encoder.w", w}, {"bert.pooler.b", b}, {"classifier.weight", head}};
  weights::save_safetensors(dir / "task.safetensors", task);
  auto m = module_like(backbone);
  // The backbone of a task checkpoint: "bert." named; the head is unexpected, so strict refuses.
  CHECK_THAT(error_of([&] { weights::load(*m, dir / "task.safetensors", {.prefix = "bert."}); }),
             Catch::Contains("strict load") && Catch::Contains("unexpected in the file \"classifier.weight\""));
  auto report = weights::load(*m, dir / "task.safetensors", {.strict = false, .prefix = "bert."});
  CHECK(report.loaded == 2);
  CHECK(report.missing.empty());
  CHECK(report.unexpected == std::vector<std::string>{"classifier.weight"});
  CHECK(torch::equal(m->named_parameters()["encoder.w"], w));
  // Errors name the file's key, prefix and all.
  weights::save_safetensors(dir / "wide.safetensors", {{"bert.encoder.w", torch::zeros({3, 2})}, {"bert.pooler.b", b}});
  CHECK_THAT(error_of([&] { weights::load(*m, dir / "wide.safetensors", {.prefix = "bert."}); }),
             Catch::Contains("\"bert.encoder.w\" has shape [3, 2] and the module's encoder.w has shape [2, 3]"));
  CHECK_THAT(error_of([&] { weights::load(*m, dir / "task.safetensors", {.prefix = "vit."}); }),
             Catch::Contains("task.safetensors") && Catch::Contains("no key starts with the prefix \"vit.\""));
  // Automatic: "module." on every key is removed.
  weights::save_safetensors(dir / "ddp.safetensors", {{"module.encoder.w", w}, {"module.pooler.b", b}});
  CHECK(weights::load(*module_like(backbone), dir / "ddp.safetensors").complete());

  // fp16 and bf16 files load into fp32 parameters converted; an fp64 one rounded; integers refused.
  for (auto dt : {torch::kHalf, torch::kBFloat16, torch::kDouble}) {
    weights::save_safetensors(dir / "h.safetensors", {{"encoder.w", w.to(dt)}, {"pooler.b", b.to(dt)}});
    auto half = module_like(backbone);
    CHECK(weights::load(*half, dir / "h.safetensors").loaded == 2);
    CHECK(half->named_parameters()["encoder.w"].scalar_type() == torch::kFloat);
    CHECK(torch::equal(half->named_parameters()["encoder.w"], w.to(dt).to(torch::kFloat)));
  }
  weights::save_safetensors(dir / "i.safetensors", {{"encoder.w", w.to(torch::kLong)}, {"pooler.b", b}});
  CHECK_THAT(error_of([&] { weights::load(*m, dir / "i.safetensors"); }),
             Catch::Contains("\"encoder.w\" is Long") && Catch::Contains("module's is Float"));
  weights::save_safetensors(dir / "s.safetensors", {{"encoder.w", torch::zeros({3, 2})}, {"pooler.b", b}});
  CHECK_THAT(error_of([&] { weights::load(*m, dir / "s.safetensors", {.strict = false}); }),
             Catch::Contains("\"encoder.w\" has shape [3, 2]") && Catch::Contains("[2, 3]"));

  // A Hugging Face directory; a sharded index made by hand; a safetensors file of any name.
  fs::create_directories(dir / "hf");
  weights::save_safetensors(dir / "hf" / "model.safetensors", backbone);
  CHECK(weights::load(*module_like(backbone), dir / "hf").complete());
  fs::create_directories(dir / "sharded");
  weights::save_safetensors(dir / "sharded" / "a.safetensors", {{"encoder.w", w}});
  weights::save_safetensors(dir / "sharded" / "b.safetensors", {{"pooler.b", b}, {"not.indexed", b}});
  write_bytes(dir / "sharded" / "model.safetensors.index.json",
              R"({"metadata": {}, "weight_map": {"encoder.w": "a.safetensors", "pooler.b": "b.safetensors"}})");
  auto sharded = module_like(backbone);
  CHECK(weights::load(*sharded, dir / "sharded").complete());
  CHECK(torch::equal(sharded->named_parameters()["pooler.b"], b));
  fs::copy_file(dir / "hf" / "model.safetensors", dir / "weights");
  CHECK(weights::read(dir / "weights").size() == 2);
  // What cannot be read says so, naming the file.
  write_bytes(dir / "bad.json", R"({"weight_map": {"encoder.w": "../a.safetensors"}})");
  CHECK_THAT(error_of([&] { weights::read(dir / "bad.json"); }),
             Catch::Contains("bad.json") && Catch::Contains("\"encoder.w\"") && Catch::Contains("not a file name"));
  write_bytes(dir / "sharded" / "lying.json", R"({"weight_map": {"pooler.w": "b.safetensors"}})");
  CHECK_THAT(error_of([&] { weights::read(dir / "sharded" / "lying.json"); }),
             Catch::Contains("b.safetensors") && Catch::Contains("no tensor \"pooler.w\"") && Catch::Contains("lying.json"));
  write_bytes(dir / "missing.json", R"({"weight_map": {"encoder.w": "gone.safetensors"}})");
  CHECK_THAT(error_of([&] { weights::read(dir / "missing.json"); }), Catch::Contains("gone.safetensors"));
  fs::create_directories(dir / "empty");
  CHECK_THAT(error_of([&] { weights::read(dir / "empty"); }), Catch::Contains("without model.safetensors"));
  CHECK_THAT(error_of([&] { weights::read(dir / "none"); }), Catch::Contains("no such file"));
  write_bytes(dir / "old.pt", "not a zip");
  CHECK_THAT(error_of([&] { weights::read(dir / "old.pt"); }), Catch::Contains("not a zip-format torch.save file"));
}

TEST_CASE("load: a load that would load nothing is an Error naming the prefix that matches", "[weights]") {
  Dir dir;
  const auto w = torch::randn({2, 3}), b = torch::randn({3}), head = torch::randn({4, 3});
  const State backbone = {{"encoder.w", w}, {"pooler.b", b}};
  const State task = {{"bert.encoder.w", w}, {"bert.pooler.b", b}, {"classifier.weight", head}};
  weights::save_safetensors(dir / "backbone.safetensors", backbone);
  weights::save_safetensors(dir / "task.safetensors", task);
  // A bare model's file (all-MiniLM-L6-v2's embeddings.*) into a task model (bert.embeddings.*):
  // non-strict, no name matches; before, 0 tensors loaded and training started from random weights.
  auto tagger = module_like(task);
  const auto before = tagger->named_parameters()["bert.encoder.w"].clone();
  CHECK_THAT(error_of([&] { weights::load(*tagger, dir / "backbone.safetensors", {.strict = false}); }),
             Catch::Contains("backbone.safetensors") && Catch::Contains("0 of 2 would load") &&
                 Catch::Contains("under \"bert.\"") && Catch::Contains("model->bert"));
  CHECK(torch::equal(tagger->named_parameters()["bert.encoder.w"], before));  // nothing copied
  // Strict, the same names: the hint rather than {.strict = false}, which would load nothing.
  const auto strict = error_of([&] { weights::load(*tagger, dir / "backbone.safetensors"); });
  CHECK_THAT(strict, Catch::Contains("under \"bert.\""));
  CHECK_THAT(strict, !Catch::Contains("{.strict = false}"));
  // The other way: a task model's file into the bare model names the prefix to load with.
  auto bare = module_like(backbone);
  CHECK_THAT(error_of([&] { weights::load(*bare, dir / "task.safetensors", {.strict = false}); }),
             Catch::Contains("0 of 3 would load") && Catch::Contains("{.prefix = \"bert.\"}"));
  // The hint's load works.
  CHECK(weights::load(*bare, dir / "task.safetensors", {.strict = false, .prefix = "bert."}).loaded == 2);
  // Unrelated names: no prefix to name, and still an Error.
  weights::save_safetensors(dir / "other.safetensors", {{"conv.weight", w}});
  CHECK_THAT(error_of([&] { weights::load(*module_like(backbone), dir / "other.safetensors", {.strict = false}); }),
             Catch::Contains("0 of 1 would load") && Catch::Contains("this model's file"));
}

TEST_CASE("safetensors: files of Python's safetensors and transformers read equal", "[weights][python]") {
  Dir dir;
  auto r = reference("write-dtypes " + dir.path.string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  weights::SafetensorsFile file(dir / "dtypes.safetensors");
  CHECK(file.metadata() == std::map<std::string, std::string>{{"format", "pt"}, {"origin", "python"}});
  check_described(file.state(), dir / "dtypes.txt");
  for (auto dt : all_dtypes) {
    INFO(c10::toString(dt));
    CHECK(torch::equal(file.tensor("t_" + lower(*weights::detail::dtype_name(dt))), values(dt)));
  }
  CHECK(file.tensor("scalar").dim() == 0);
  CHECK(file.tensor("empty").sizes() == torch::IntArrayRef{0, 3});
  // Dtypes LibTorch added after 1.13 (compat::added_scalar_type): read, with Python's values, where
  // this LibTorch has them; else the header reads and the tensor is refused naming file, tensor,
  // dtype. Written by dtrain, Python reads them equal (the next test case).
  weights::SafetensorsFile u16(dir / "uint16.safetensors");
  CHECK(torch::equal(u16.tensor("ok"), torch::ones({2})));
  if (compat::added_scalar_type("U16").type) {
    CHECK(u16.tensor("u16").scalar_type() == *compat::added_scalar_type("U16").type);
    CHECK(torch::equal(u16.tensor("u16").to(torch::kLong), torch::arange(4)));
  } else {
    CHECK_THAT(error_of([&] { u16.tensor("u16"); }),
               Catch::Contains("uint16.safetensors") && Catch::Contains("\"u16\" is U16"));
  }
  if (compat::added_scalar_type("F8_E4M3").type) {
    const auto f8 = weights::SafetensorsFile(dir / "float8.safetensors").tensor("f8");
    CHECK(f8.scalar_type() == *compat::added_scalar_type("F8_E4M3").type);
    CHECK(torch::equal(f8.to(torch::kFloat), torch::ones({4})));
  } else {
    CHECK_THAT(error_of([&] { weights::read(dir / "float8.safetensors"); }),
               Catch::Contains("float8.safetensors") && Catch::Contains("\"f8\" is F8_E4M3"));
  }

  r = reference("write-models " + dir.path.string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto sharded = weights::read(dir / "bert_sharded");
  CHECK(weights::read_safetensors_index(dir / "bert_sharded" / "model.safetensors.index.json").shards().size() > 1);
  check_described(sharded, dir / "bert.txt");
  for (const auto* source : {"bert_sharded", "bert_bin"}) {  // save_pretrained's shards; torch.save of torch 2.15
    INFO(source);
    auto m = module_like(sharded);
    const auto report = weights::load(*m, dir / source);
    CHECK(report.complete());
    CHECK(report.loaded == sharded.size());
    for (const auto& [name, t] : sharded) CHECK(torch::equal(m->named_parameters()[name], t));
  }
  // The backbone of BertForSequenceClassification: "bert." removed, the classifier unexpected.
  check_described(weights::read(dir / "bert_cls"), dir / "bert_cls.txt");
  auto m = module_like(sharded);
  CHECK_THAT(error_of([&] { weights::load(*m, dir / "bert_cls", {.prefix = "bert."}); }),
             Catch::Contains("bert_cls/model.safetensors") && Catch::Contains("\"classifier.weight\""));
  const auto report = weights::load(*m, dir / "bert_cls", {.strict = false, .prefix = "bert."});
  CHECK(report.missing.empty());
  CHECK(report.unexpected == std::vector<std::string>{"classifier.bias", "classifier.weight"});
  CHECK(report.loaded == sharded.size());
}

TEST_CASE("safetensors: a file dtrain writes reads equal in Python's safetensors", "[weights][python]") {
  Dir dir;
  State state;
  for (auto dt : all_dtypes) state.emplace_back("t_" + lower(*weights::detail::dtype_name(dt)), values(dt));
  state.emplace_back("empty", torch::zeros({0, 3}, torch::kHalf));
  state.emplace_back("scalar", torch::tensor(-3, torch::kLong));
  state.emplace_back("transposed", torch::randn({5, 7}).t());
  state.emplace_back("strided", torch::randn({40}).to(torch::kBFloat16).slice(0, 3, 40, 4));
  // Dtypes LibTorch added after 1.13, where this one has them (compat::added_scalar_type).
  for (const auto* added : {"U16", "F8_E4M3"})
    if (const auto a = compat::added_scalar_type(added); a.type)
      state.emplace_back("added_" + lower(added), torch::arange(4, torch::kFloat).to(*a.type));
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"written_by", "dtrain"}};
  weights::save_safetensors(dir / "dtrain.safetensors", state, metadata);
  std::map<std::string, std::string> lines;
  for (const auto& [name, t] : state) lines[name] = describe(name, t);
  std::string desc = "__metadata__\t{\"format\": \"pt\", \"written_by\": \"dtrain\"}\n";
  for (const auto& [name, line] : lines) desc += line + "\n";
  write_bytes(dir / "dtrain.txt", desc);
  const auto r = reference("check " + (dir / "dtrain.safetensors").string() + " " + (dir / "dtrain.txt").string());
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains(std::to_string(state.size() + 2) + " checks, 0 failed"));
}

TEST_CASE("safetensors: the real all-MiniLM-L6-v2 reads as Python reads it", "[weights][python]") {
  Dir dir;
  const auto r = reference("minilm " + dir.path.string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  weights::SafetensorsFile file(read_bytes(dir / "minilm.path"));
  CHECK(file.metadata() == std::map<std::string, std::string>{{"format", "pt"}});
  const auto state = file.state();
  CHECK(state.size() >= 100);  // 6 layers of 16 tensors, embeddings, pooler
  check_described(state, dir / "minilm.txt");
}

TEST_CASE("safetensors: fuzzed files load or throw an Error naming the file", "[weights][fuzz]") {
  Dir dir;
  const State seed_state = {{"a", torch::arange(6, torch::kFloat).reshape({2, 3})}, {"b", torch::tensor({true, false})},
                            {"c", torch::tensor(7, torch::kLong)}, {"d", torch::zeros({0, 4}, torch::kHalf)},
                            {"e", torch::ones({5}, torch::kBFloat16)}, {"f", torch::arange(7, torch::kChar)},
                            {"g", torch::ones({2}, torch::kComplexFloat)}};
  weights::save_safetensors(dir / "seed.safetensors", seed_state, {{"format", "pt"}});
  const auto seed = read_bytes(dir / "seed.safetensors");
  std::uint64_t n = 0;
  std::memcpy(&n, seed.data(), 8);
  const auto header = seed.substr(8, n), data = seed.substr(8 + n);
  const auto path = dir / "fuzz.safetensors";

  const auto env = [](const char* name, std::uint64_t otherwise) {
    return std::getenv(name) ? std::strtoull(std::getenv(name), nullptr, 10) : otherwise;
  };
  const auto seed_value = env("DTRAIN_FUZZ_SEED", 20261127);
  std::mt19937_64 rng(seed_value);
  const auto pick = [&](const auto& options) { return options[rng() % options.size()]; };
  const auto anywhere = [&](std::size_t size) { return size ? rng() % size : 0; };
  const std::vector<std::string> numbers = {"0", "1", "-1", "2", "3", "7", "8", "9", "16", "1.5", "1e3", "4294967296",
                                            "9223372036854775807", "18446744073709551615", "18446744073709551616"};
  const std::vector<std::string> dtypes = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "C64",
                                           "U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "F4", "F6_E2M3", "F33", "", "f32"};
  const std::vector<std::string> junk = {"{", "}", "[", "]", "\"", ",", ":", "0", "-", "e", " ", "\\", "null", "true",
                                         std::string(1, '\0'), "\xff", "\xc3", "\"__metadata__\":{},",
                                         "\"z\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},", "[[[[[[[["};
  const auto mutate_header = [&](std::string h) {
    switch (rng() % 4) {
      case 0: {  // a number (a size, an offset) rewritten
        std::vector<std::size_t> at;
        for (std::size_t i = 0; i < h.size(); ++i)
          if (std::isdigit(static_cast<unsigned char>(h[i])) && (i == 0 || !std::isdigit(static_cast<unsigned char>(h[i - 1]))))
            at.push_back(i);
        if (at.empty()) break;
        const auto i = pick(at);
        auto j = i;
        while (j < h.size() && std::isdigit(static_cast<unsigned char>(h[j]))) ++j;
        const bool nudge = rng() % 3 == 0 && j - i < 19;  // a neighbour of the number, or one of `numbers`
        h.replace(i, j - i, nudge ? std::to_string(std::stoull(h.substr(i, j - i)) + rng() % 5 - 2) : pick(numbers));
        break;
      }
      case 1: {  // a dtype string changed
        const auto i = h.find("\"dtype\":\"", anywhere(h.size()));
        if (i == std::string::npos) break;
        const auto begin = i + 9, end = h.find('"', begin);
        if (end != std::string::npos) h.replace(begin, end - begin, pick(dtypes));
        break;
      }
      case 2: h.insert(anywhere(h.size() + 1), pick(junk)); break;  // JSON junk
      default: if (!h.empty()) h.erase(anywhere(h.size()), 1 + rng() % 8);
    }
    return h;
  };

  const auto iterations = env("DTRAIN_FUZZ_ITERATIONS", 30000);
  int loaded = 0, rejected = 0;
  std::vector<std::string> failures;
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < iterations; ++i) {
    std::string h = header;
    std::optional<std::uint64_t> length;
    std::string file;
    const auto op = rng() % 6;
    if (op <= 2) {  // header mutations, one or several; the length field follows them or not
      for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) h = mutate_header(h);
      if (rng() % 4 == 0) length = n;
    } else if (op == 3) {  // the length field rewritten
      const std::uint64_t size = 8 + n + data.size();
      length = pick(std::vector<std::uint64_t>{0, 1, 7, 8, n - 1, n + 1, size, size - 8, size - 7, 100'000'000,
                                               100'000'001, std::uint64_t{1} << 63, ~std::uint64_t{0}, rng()});
    }
    file = le64(length.value_or(h.size())) + h + data;
    if (op == 4) {  // bit flips anywhere, mostly in the header
      for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k) {
        const auto at = rng() % 4 ? anywhere(8 + h.size()) : anywhere(file.size());
        file[at] = static_cast<char>(file[at] ^ (1 << (rng() % 8)));
      }
    } else if (op == 5) {  // truncation at an interesting offset, or anywhere
      const std::vector<std::size_t> cuts = {0, 1, 7, 8, 9, 8 + h.size() - 1, 8 + h.size(), 8 + h.size() + 1,
                                             file.size() - 1, file.size() - 2, file.size() - 9, anywhere(file.size())};
      file.resize(std::min(pick(cuts), file.size()));
    }
    write_bytes(path, file);
    try {
      const auto state = i % 4 ? weights::SafetensorsFile(path).state() : weights::read(path);
      std::uint64_t sum = 0;  // every byte of every tensor read
      for (const auto& [name, t] : state)
        for (std::size_t b = 0; b < t.nbytes(); ++b) sum += static_cast<const unsigned char*>(t.data_ptr())[b];
      ++loaded;
    } catch (const dtrain::Error& e) {
      ++rejected;
      if (std::string(e.what()).find(path.string()) == std::string::npos) failures.push_back(std::string("unnamed: ") + e.what());
    } catch (const std::exception& e) {
      failures.push_back(std::string("not a dtrain::Error: ") + e.what());
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "safetensors fuzz: " << iterations << " iterations (seed " << seed_value << "), " << loaded << " loaded, "
            << rejected << " rejected, " << failures.size() << " failures, " << seconds << " s\n";
  for (std::size_t i = 0; i < failures.size() && i < 10; ++i) UNSCOPED_INFO(failures[i]);
  CHECK(failures.empty());
  CHECK(loaded > 0);
  CHECK(rejected > 0);
}

TEST_CASE("torch.save pickles: fuzzed files load or throw an Error naming the file", "[weights][fuzz]") {
  Dir dir;
  // A state_dict as torch.save writes it: the pickle (data.pkl) and one record per tensor.
  c10::Dict<std::string, at::Tensor> state;
  state.insert("w", torch::arange(6, torch::kFloat).reshape({2, 3}));
  state.insert("b", torch::tensor({1.5, -2.0}, torch::kDouble));
  state.insert("n", torch::tensor(7, torch::kLong));
  state.insert("h", torch::ones({3}, torch::kHalf));
  std::string pickle;
  std::vector<std::string> keys;
  torch::jit::Pickler pickler([&](const char* data, std::size_t n) { pickle.append(data, n); }, nullptr, nullptr, nullptr,
                              [&](const at::Tensor&) {
                                keys.push_back(std::to_string(keys.size()));
                                return keys.back();
                              },
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(state));
  pickler.stop();
  std::vector<std::string> records;
  for (const auto& t : pickler.tensorData()) {
    const auto data = torch::jit::getWriteableTensorData(t);
    records.emplace_back(static_cast<const char*>(data.data()), data.sizeInBytes());
  }
  const auto zip_of = [&](const std::string& pkl, std::size_t cut_record) {
    std::string out;
    caffe2::serialize::PyTorchStreamWriter zip([&](const void* d, std::size_t n) {
      out.append(static_cast<const char*>(d), n);
      return n;
    });
    zip.writeRecord("data.pkl", pkl.data(), pkl.size());
    for (std::size_t i = 0; i < records.size(); ++i) {
      const auto& r = records[i];
      zip.writeRecord("data/" + keys[i], r.data(), i == cut_record ? r.size() / 2 : r.size());
    }
    zip.writeEndOfFile();
    return out;
  };
  const auto path = dir / "fuzz.pt";
  write_bytes(path, zip_of(pickle, records.size()));
  REQUIRE(weights::read(path).size() == 4);  // the unmutated file reads

  std::mt19937_64 rng(std::getenv("DTRAIN_FUZZ_SEED") ? std::strtoull(std::getenv("DTRAIN_FUZZ_SEED"), nullptr, 10) : 20261127);
  const auto anywhere = [&](std::size_t size) { return size ? rng() % size : 0; };
  // Opcodes and arguments a hostile pickle would use: globals that run code, huge lengths, memo indices.
  const std::vector<std::string> junk = {"c", "\x80\x02", "cos\nsystem\n", "cbuiltins\neval\n", "R", "b", "\x93", "(",
                                         ".", "q\xff", "h\xff", "j\xff\xff\xff\x7f", "X\xff\xff\xff\x7f", "T\xff\xff\xff\xff",
                                         "B\xff\xff\xff\xff\xff\xff\xff\x7f", "K\x05", "J\xff\xff\xff\xff", "N", "}", "]",
                                         "ctorch._utils\n_rebuild_tensor_v2\n", "ctorch\nFloatStorage\n", "\x8c\xff",
                                         "Q", "s", "u", "e", "t", "\x85", "\x86", "\x87", "0", "1", "2"};
  const auto iterations = std::getenv("DTRAIN_FUZZ_ITERATIONS") ? std::strtoull(std::getenv("DTRAIN_FUZZ_ITERATIONS"), nullptr, 10)
                                                                : 10000;
  int loaded = 0, rejected = 0;
  std::vector<std::string> failures;
  for (std::uint64_t i = 0; i < iterations; ++i) {
    std::string pkl = pickle;
    std::size_t cut = records.size();
    std::string file;
    const auto op = rng() % 6;
    if (op <= 3) {  // the pickle mutated: bit flips, junk inserted, bytes deleted, or cut short
      for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
        switch (rng() % 4) {
          case 0: pkl[anywhere(pkl.size())] ^= static_cast<char>(1 << (rng() % 8)); break;
          case 1: pkl.insert(anywhere(pkl.size() + 1), junk[rng() % junk.size()]); break;
          case 2: pkl.erase(anywhere(pkl.size()), 1 + rng() % 6); break;
          default: pkl.resize(anywhere(pkl.size()));
        }
      }
      file = zip_of(pkl, cut);
    } else if (op == 4) {  // a tensor's record shorter than its storage says
      file = zip_of(pkl, rng() % records.size());
    } else {  // the zip itself: bit flips or a truncation
      file = zip_of(pkl, cut);
      if (rng() % 2) file.resize(anywhere(file.size()));
      else
        for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k) file[anywhere(file.size())] ^= static_cast<char>(1 << (rng() % 8));
    }
    write_bytes(path, file);
    try {
      const auto read = weights::read(path);
      for (const auto& [name, t] : read) (void)t.sum().item<double>();  // every element touched
      ++loaded;
    } catch (const dtrain::Error& e) {
      ++rejected;
      if (std::string(e.what()).find(path.string()) == std::string::npos) failures.push_back(std::string("unnamed: ") + e.what());
    } catch (const std::exception& e) {
      failures.push_back(std::string("not a dtrain::Error: ") + e.what());
    }
  }
  std::cout << "torch.save fuzz: " << iterations << " iterations, " << loaded << " loaded, " << rejected << " rejected, "
            << failures.size() << " failures\n";
  for (std::size_t i = 0; i < failures.size() && i < 10; ++i) UNSCOPED_INFO(failures[i]);
  CHECK(failures.empty());
  CHECK(loaded > 0);
  CHECK(rejected > 0);
}
