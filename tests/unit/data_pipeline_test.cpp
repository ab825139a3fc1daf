// SPDX-License-Identifier: Apache-2.0
// Real data: data::Fields batches, the file-backed sources (CSV, JSON Lines, globs), the pipeline
// and its loader threads, the preprocessors (and their round trip through a checkpoint), the
// splits, and the Predictor on raw strings.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <dtrain/checkpointer/directory.hpp>
#include <dtrain/checkpointer/model_config.hpp>
#include <dtrain/data/collate.hpp>
#include <dtrain/data/csv.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/fields.hpp>
#include <dtrain/data/files.hpp>
#include <dtrain/data/jsonl.hpp>
#include <dtrain/data/pipeline.hpp>
#include <dtrain/data/prefetch.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/data/shard.hpp>
#include <dtrain/data/splits.hpp>
#include <dtrain/data/stateful_stage.hpp>
#include <dtrain/error.hpp>
#include <dtrain/evaluation/predictor.hpp>
#include <dtrain/launch/group.hpp>
#include <dtrain/run_directory.hpp>

#include "checkpoint_support.hpp"
#include "support.hpp"

namespace d = dtrain;
namespace fs = std::filesystem;
using dtrain_test::MessageContains;
using dtrain_test::TempDir;

namespace {

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

std::vector<std::int64_t> ints(const torch::Tensor& t) {
  const auto c = t.to(torch::kInt64).contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

// A dataset of named fields: sample i has x = [i, i], label = i % 3.
struct FieldsDataset {
  std::int64_t n = 10;
  std::int64_t size() const { return n; }
  d::data::Fields get_batch(const torch::Tensor& idx) const {
    const auto x = idx.to(torch::kFloat32).unsqueeze(1).repeat({1, 2});
    return {{"x", x}, {"label", idx.remainder(3)}};
  }
};
static_assert(d::data::RandomAccess<FieldsDataset>);
static_assert(std::is_same_v<d::data::batch_of<FieldsDataset>, d::data::Fields>);

}  // namespace

// ------------------------------------------------------------------------------------------------
// 1. Batches of named tensors

TEST_CASE("Fields keeps insertion order and names the present fields when one is missing", "[data][fields]") {
  d::data::Fields b{{"input_ids", torch::ones({4, 7}, torch::kInt64)}, {"label", torch::zeros({4}, torch::kInt64)}};
  b.set("attention_mask", torch::ones({4, 7}, torch::kInt64));
  CHECK(b.names() == std::vector<std::string>{"input_ids", "label", "attention_mask"});
  CHECK(b.size() == 4);
  CHECK(d::data::samples_in(b) == 4);
  b.set("label", torch::ones({4}, torch::kInt64));  // replaced in place
  CHECK(b.names()[1] == "label");
  CHECK(ints(b["label"]) == std::vector<std::int64_t>{1, 1, 1, 1});
  CHECK_THROWS_MATCHES(b["labels"], d::DataError,
                       MessageContains({"\"labels\"", "\"input_ids\"", "\"label\"", "\"attention_mask\""}));
  const auto moved = b.to(torch::kCPU);
  CHECK(moved.names() == b.names());
  CHECK(torch::equal(moved["input_ids"], b["input_ids"]));
  CHECK(d::data::Fields{}.size() == 0);
}

TEST_CASE("A dataset of Fields flows through data::batches and prefetch like a (data target) one", "[data][fields]") {
  const FieldsDataset ds;
  std::vector<std::int64_t> order = {9, 8, 7, 6, 5, 4, 3};
  std::vector<std::int64_t> sizes, seen;
  for (const auto& b : d::data::batches(ds, order, 3, 0, [&](std::int64_t i, std::int64_t n) {
         seen.push_back(i);
         sizes.push_back(n);
       })) {
    static_assert(std::is_same_v<std::decay_t<decltype(b)>, d::data::Fields>);
    CHECK(b["x"].size(1) == 2);
  }
  CHECK(seen == std::vector<std::int64_t>{0, 1, 2});
  CHECK(sizes == std::vector<std::int64_t>{3, 3, 1});
  std::vector<std::int64_t> labels;
  for (const auto& b : d::data::prefetch(d::data::batches(ds, order, 3), d::data::no_transfer{}))
    for (auto l : ints(b["label"])) labels.push_back(l);
  CHECK(labels == std::vector<std::int64_t>{0, 2, 1, 0, 2, 1, 0});
  // data::Batch keeps working through the same templates.
  const d::data::TensorDataset td(torch::arange(6).to(torch::kFloat32).unsqueeze(1), torch::arange(6));
  std::int64_t total = 0;
  for (const auto& b : d::data::prefetch(d::data::batches(td, {0, 1, 2, 3, 4}, 2), d::data::no_transfer{}))
    total += d::data::samples_in(b);
  CHECK(total == 5);
}

namespace {
// A classifier over named fields: forward(const Fields&) for the Predictor, and forward(x) for
// a loop that passes tensors.
struct FieldsNetImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  FieldsNetImpl() { fc = register_module("fc", torch::nn::Linear(2, 3)); }
  torch::Tensor forward(const d::data::Fields& b) { return fc->forward(b["x"]); }
};
TORCH_MODULE(FieldsNet);
}  // namespace

TEST_CASE("Predictor predicts a dataset of Fields and scores it against the label field", "[data][fields][predictor]") {
  torch::manual_seed(3);
  d::evaluation::Predictor<FieldsNet> p(FieldsNet{}, {"a", "b", "c"});
  const FieldsDataset ds;
  d::evaluation::ConfusionMatrix cm(3);
  const auto all = p.predict(ds, 4, &cm);
  CHECK(all.size() == 10);
  CHECK(cm.total() == 10);
  const auto one = p.predict(ds.get_batch(torch::arange(10)));
  CHECK(torch::allclose(all.probabilities(), one.probabilities()));
  p.label_field("missing");
  CHECK_THROWS_MATCHES(p.predict(ds, 4, &cm), d::DataError, MessageContains({"\"missing\"", "\"x\"", "\"label\""}));
}

// ------------------------------------------------------------------------------------------------
// 2. File-backed sources

TEST_CASE("CsvSource reads RFC 4180 quoting: commas quotes and newlines inside fields", "[data][csv]") {
  TempDir dir;
  write(dir / "a.csv",
        "id,title,score\r\n"
        "1,plain,0.5\r\n"
        "2,\"with, comma\",1.5\r\n"
        "\n"
        "3,\"say \"\"hi\"\"\",\r\n"
        "4,\"two\nlines\",-2\n"
        "5,\"\",7");  // no final newline
  d::data::CsvSource src(dir / "a.csv", {.types = {{"id", d::data::column_type::integer},
                                                   {"score", d::data::column_type::real}}});
  REQUIRE(src.size() == 5);
  CHECK(src.columns() == std::vector<std::string>{"id", "title", "score"});
  CHECK(src.row(0).integer("id") == 1);
  CHECK(src.row(1).text("title") == "with, comma");
  CHECK(src.row(1).number("score") == 1.5);
  CHECK(src.row(2).text("title") == "say \"hi\"");
  CHECK(std::holds_alternative<std::monostate>(src.row(2)["score"]));  // empty real cell: missing
  CHECK(src.row(3).text("title") == "two\nlines");
  CHECK(src.row(3).line() == 6);
  CHECK(src.row(4).line() == 8);  // the line after the two-line record
  CHECK(src.row(4).text("title").empty());
  CHECK(src.row(4).integer("id") == 5);
  CHECK_THROWS_MATCHES(src.row(0)["name"], d::DataError, MessageContains({"a.csv:2", "\"name\"", "\"title\""}));
  CHECK_THROWS_MATCHES(src.row(5), d::DataError, MessageContains({"row 5", "[0, 5)"}));
}

TEST_CASE("CsvSource names the file line and column of a malformed row", "[data][csv]") {
  TempDir dir;
  auto open = [&](const std::string& text) {
    write(dir / "bad.csv", text);
    return d::data::CsvSource(dir / "bad.csv", {.types = {{"n", d::data::column_type::integer}}});
  };
  CHECK_THROWS_MATCHES(open("a,n\nx,1\n\"open,2\n"), d::DataError,
                       MessageContains({"bad.csv", "line 3", "column 1", "not closed"}));
  CHECK_THROWS_MATCHES(open("a,n\n\"q\"x,1\n"), d::DataError,
                       MessageContains({"bad.csv", "line 2", "column 1", "after the closing quote"}));
  CHECK_THROWS_MATCHES(open("a,n\nok,1\nx,a\"b\n"), d::DataError,
                       MessageContains({"bad.csv", "line 3", "column 2", "quote inside an unquoted field"}));
  CHECK_THROWS_MATCHES(open("a,n\nok,1\nx,1,extra\n"), d::DataError,
                       MessageContains({"bad.csv", "line 3", "3 fields", "header 2"}));
  CHECK_THROWS_MATCHES(open(""), d::DataError, MessageContains({"bad.csv", "empty", "header"}));
  const auto typed = open("a,n\nok,1\n\"multi\nline\",twelve\n");
  CHECK_THROWS_MATCHES(typed.row(1), d::DataError,
                       MessageContains({"bad.csv", "line 3", "column 2", "\"n\"", "\"twelve\"", "whole number"}));
  write(dir / "t.csv", "a\n1\n");
  CHECK_THROWS_MATCHES(d::data::CsvSource(dir / "t.csv", {.types = {{"b", d::data::column_type::real}}}),
                       d::DataError, MessageContains({"\"b\"", "\"a\""}));
  CHECK_THROWS_MATCHES(d::data::CsvSource(dir / "none.csv"), d::DataError, MessageContains({"none.csv", "cannot be opened"}));
}

TEST_CASE("JsonLinesSource reads objects by index and names malformed lines", "[data][jsonl]") {
  TempDir dir;
  write(dir / "a.jsonl", "{\"text\": \"hello\", \"n\": 3, \"x\": 0.5, \"z\": null}\n\n  \n{\"text\": \"a\\nb\", \"n\": -1}\n"
                         "[1, 2]\n{\"text\": oops}\n");
  d::data::JsonLinesSource src(dir / "a.jsonl");
  REQUIRE(src.size() == 4);
  CHECK(src.row(0).text("text") == "hello");
  CHECK(src.row(0).integer("n") == 3);
  CHECK(src.row(0).number("x") == 0.5);
  CHECK(std::holds_alternative<std::monostate>(src.row(0)["z"]));
  CHECK(src.row(1).text("text") == "a\nb");
  CHECK(src.row(1).line() == 4);
  CHECK_THROWS_MATCHES(src.row(2), d::DataError, MessageContains({"a.jsonl", "line 5", "not a JSON object"}));
  CHECK_THROWS_MATCHES(src.row(3), d::DataError, MessageContains({"a.jsonl", "line 6", "column", "malformed"}));
  CHECK_THROWS_MATCHES(src.row(0).integer("text"), d::DataError, MessageContains({"a.jsonl:1", "\"text\"", "whole number"}));
}

TEST_CASE("A glob of CSV files reads as one source in name order", "[data][csv]") {
  TempDir dir;
  write(dir / "part-2.csv", "k,v\nc,3\n");
  write(dir / "part-1.csv", "k,v\na,1\nb,2\n");
  write(dir / "other.txt", "k,v\nz,0\n");
  const auto all = d::data::csv_files((dir.path() / "part-*.csv").string());
  REQUIRE(all.size() == 3);
  CHECK(all.row(0).text("k") == "a");
  CHECK(all.row(2).text("k") == "c");
  CHECK(all.row(2).file().find("part-2.csv") != std::string::npos);
  CHECK_THROWS_MATCHES(d::data::csv_files((dir.path() / "*.parquet").string()), d::DataError,
                       MessageContains({"no file matches", "*.parquet"}));
  write(dir / "part-3.csv", "k,w\nd,4\n");
  CHECK_THROWS_MATCHES(d::data::csv_files((dir.path() / "part-*.csv").string()), d::DataError,
                       MessageContains({"part-3.csv", "columns differ"}));
  write(dir / "j1.jsonl", "{\"a\": 1}\n");
  write(dir / "j2.jsonl", "{\"a\": 2}\n{\"a\": 3}\n");
  const auto js = d::data::jsonl_files((dir.path() / "j*.jsonl").string());
  REQUIRE(js.size() == 3);
  CHECK(js.row(2).integer("a") == 3);
}

namespace {
long peak_rss_kb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}
long current_rss_kb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}
}  // namespace

TEST_CASE("A CSV source several times larger than the memory bound is indexed and read within it", "[data][csv][memory]") {
  TempDir dir;
  const auto path = dir / "big.csv";
  constexpr std::int64_t kRows = 60000;
  {
    std::ofstream out(path, std::ios::binary);
    out << "id,text,label\n";
    const std::string filler(1000, 'w');
    for (std::int64_t i = 0; i < kRows; ++i) out << i << ",\"row " << i << ", " << filler << "\"," << (i % 7) << "\n";
  }
  const auto file_mb = static_cast<double>(fs::file_size(path)) / (1 << 20);
  REQUIRE(file_mb > 55);
  constexpr long kBoundKb = 16 * 1024;  // the growth the reader may cause: under a third of the file
  // In a child process, so that the peak RSS measured is this reading's alone: the child resets
  // its high-water mark, notes its RSS, reads every row and reports how far the peak rose.
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(pipefd[0]);
    // Reset the high-water mark (Linux: writing 5 to clear_refs), then read everything.
    std::ofstream("/proc/self/clear_refs") << "5";
    const long before = current_rss_kb();
    long ok = 1;
    try {
      d::data::CsvSource src(path, {.types = {{"id", d::data::column_type::integer}, {"label", d::data::column_type::integer}}});
      std::int64_t sum = 0;
      for (std::int64_t i = 0; i < src.size(); ++i) sum += src.row(i).integer("id");
      ok = src.size() == kRows && sum == kRows * (kRows - 1) / 2;
    } catch (...) {
      ok = 0;
    }
    const long growth = peak_rss_kb() - before;
    const std::string msg = std::to_string(ok) + " " + std::to_string(growth) + "\n";
    (void)!::write(pipefd[1], msg.data(), msg.size());
    ::_exit(0);
  }
  ::close(pipefd[1]);
  char buf[64] = {};
  const auto got = ::read(pipefd[0], buf, sizeof buf - 1);
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(got > 0);
  std::istringstream in(buf);
  long ok = 0, growth_kb = -1;
  in >> ok >> growth_kb;
  INFO("file " << file_mb << " MiB, peak RSS growth " << growth_kb << " KiB, bound " << kBoundKb << " KiB");
  CHECK(ok == 1);
  CHECK(growth_kb >= 0);
  CHECK(growth_kb < kBoundKb);
  CHECK(file_mb * 1024 > 3 * kBoundKb);
}

// ------------------------------------------------------------------------------------------------
// 3. The pipeline

namespace {
// Sample i: Fields{ids: i % 5 + 1 tokens, label}; a random transform adds noise from the sample's
// generator, a filter drops multiples of 7.
struct Numbers {
  std::int64_t n;
  std::int64_t size() const { return n; }
  std::int64_t operator[](std::int64_t i) const { return i; }
};

auto numbers_pipeline() {
  namespace dd = d::data;
  return dd::filter([](std::int64_t i) { return i % 7 != 3; }) |
         dd::map([](std::int64_t i, at::Generator& g) {
           const auto len = i % 5 + 1;
           return dd::Fields{{"ids", torch::arange(1, len + 1, torch::kInt64) + i},
                             {"noise", torch::rand({2}, g)},
                             {"label", torch::tensor(i % 3)}};
         }) |
         dd::collate(dd::pad_to_longest("ids")) |
         dd::map_batches([](dd::Fields b, at::Generator& g) {
           b.set("batch_noise", torch::rand({1}, g).expand({b.size()}));
           return b;
         });
}

std::vector<d::data::Fields> all_batches(int threads, std::int64_t epoch, std::int64_t first = 0) {
  auto ds = d::data::pipelined(Numbers{50}, numbers_pipeline(), {.loader_threads = threads, .seed = 11});
  std::vector<std::int64_t> order(50);
  for (std::int64_t i = 0; i < 50; ++i) order[static_cast<std::size_t>(i)] = (i * 17) % 50;
  std::vector<d::data::Fields> out;
  for (const auto& b : d::data::batches(ds, order, 4, first, {}, epoch)) out.push_back(b);
  return out;
}

bool same(const d::data::Fields& a, const d::data::Fields& b) {
  if (a.names() != b.names()) return false;
  for (const auto& n : a.names())
    if (!torch::equal(a[n], b[n])) return false;
  return true;
}
}  // namespace

TEST_CASE("pipeline: filter map collate with a mask and map_batches", "[data][pipeline]") {
  auto ds = d::data::pipelined(Numbers{50}, numbers_pipeline(), {.loader_threads = 0});
  static_assert(d::data::RandomAccess<decltype(ds)>);
  static_assert(d::data::ThreadedLoading<decltype(ds)>);
  const auto b = ds.get_batch(torch::tensor({0, 3, 4, 6}));  // 3 is filtered out
  CHECK(b.names() == std::vector<std::string>{"ids", "attention_mask", "noise", "label", "batch_noise"});
  CHECK(b.size() == 3);
  CHECK(ints(b["ids"]) == std::vector<std::int64_t>{1, 0, 0, 0, 0, 5, 6, 7, 8, 9, 7, 8, 0, 0, 0});
  CHECK(ints(b["attention_mask"]) == std::vector<std::int64_t>{1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0});
  CHECK(ints(b["label"]) == std::vector<std::int64_t>{0, 1, 0});
  // A sample's draw depends on the sample, not on its batch.
  const auto alone = ds.get_batch(torch::tensor({4}));
  CHECK(torch::equal(alone["noise"][0], b["noise"][1]));
  // And on the epoch.
  CHECK_FALSE(torch::equal(ds.get_batch(torch::tensor({4}), 1)["noise"], alone["noise"]));
}

TEST_CASE("pipeline: any loader thread count gives the same batches in the same order", "[data][pipeline]") {
  const auto reference = all_batches(0, 2);
  REQUIRE(reference.size() == 13);
  for (int threads : {1, 2, 3, 8}) {
    const auto got = all_batches(threads, 2);
    REQUIRE(got.size() == reference.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(same(got[i], reference[i]));
  }
  // Through the prefetcher (the GPU backends' path), which takes the loader's range as any range.
  {
    auto ds = d::data::pipelined(Numbers{50}, numbers_pipeline(), {.loader_threads = 2, .seed = 11});
    std::vector<std::int64_t> order(50);
    for (std::int64_t i = 0; i < 50; ++i) order[static_cast<std::size_t>(i)] = (i * 17) % 50;
    std::size_t k = 0;
    for (const auto& b : d::data::prefetch(d::data::batches(ds, order, 4, 0, {}, 2), d::data::no_transfer{}))
      CHECK(same(b, reference.at(k++)));
    CHECK(k == reference.size());
  }
  // A resumed epoch (from batch 5) gets the batches the uninterrupted one had there.
  const auto resumed = all_batches(3, 2, 5);
  REQUIRE(resumed.size() == 8);
  for (std::size_t i = 0; i < resumed.size(); ++i) CHECK(same(resumed[i], reference[i + 5]));
  // Another epoch draws anew.
  CHECK_FALSE(same(all_batches(2, 3)[0], reference[0]));
}

TEST_CASE("pipeline: a loader thread's error reaches the loop and leaving early stops the threads", "[data][pipeline]") {
  namespace dd = d::data;
  auto failing = dd::pipelined(Numbers{40}, dd::map([](std::int64_t i) {
                                 if (i == 21) throw d::DataError("sample 21 is bad");
                                 return dd::Fields{{"v", torch::tensor(i)}};
                               }) | dd::collate(dd::stack()),
                               {.loader_threads = 3});
  std::vector<std::int64_t> order(40);
  for (std::int64_t i = 0; i < 40; ++i) order[static_cast<std::size_t>(i)] = i;
  std::int64_t seen = 0;
  auto consume = [&] {
    for (const auto& b : dd::batches(failing, order, 4)) seen += b.size();
  };
  CHECK_THROWS_MATCHES(consume(), d::DataError, MessageContains({"sample 21 is bad"}));
  CHECK(seen == 20);  // batches 0..4 arrived before batch 5's error
  const auto start = std::chrono::steady_clock::now();
  for (const auto& b : dd::batches(failing, order, 4)) {
    CHECK(b.size() == 4);
    break;
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK_THROWS_MATCHES(dd::stack()({dd::Fields{{"a", torch::zeros({2})}}, dd::Fields{{"a", torch::zeros({3})}}}),
                       d::DataError, MessageContains({"\"a\"", "pad_to_longest"}));
}

namespace {
// Stage classes for map_batches<C>: each counts its constructions in statics that a test resets.
// Sample i of `numbered()` is Fields{v: i, label: i % 3}.
auto numbered() {
  namespace dd = d::data;
  return dd::map([](std::int64_t i) { return dd::Fields{{"v", torch::tensor(i)}, {"label", torch::tensor(i % 3)}}; }) |
         dd::collate(dd::stack());
}
std::vector<std::int64_t> iota(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

// Sleeps in each call, recording how many calls overlap and which instance served each.
struct Sleepy {
  static inline std::atomic<int> constructed{0}, busy{0}, most_busy{0};
  static inline std::mutex mutex;
  static inline std::vector<int> calls;  // per instance
  static void reset() {
    constructed = busy = most_busy = 0;
    calls.clear();
  }
  int id;
  std::chrono::milliseconds nap;
  explicit Sleepy(int nap_ms) : id(constructed++), nap(nap_ms) {
    std::lock_guard lock(mutex);
    calls.resize(static_cast<std::size_t>(constructed.load()) + 1);
  }
  d::data::Fields operator()(d::data::Fields b) {
    const int now = ++busy;
    for (int seen = most_busy; now > seen && !most_busy.compare_exchange_weak(seen, now);) {
    }
    {
      std::lock_guard lock(mutex);
      ++calls[static_cast<std::size_t>(id)];
    }
    std::this_thread::sleep_for(nap);
    b.set("doubled", b["v"] * 2);
    --busy;
    return b;
  }
};

// v -> [v, v * v] as "embedding", "v" dropped; records the largest chunk it was given.
struct Square {
  static inline std::atomic<std::int64_t> largest{0}, calls{0};
  d::data::Fields operator()(d::data::Fields b) const {
    ++calls;
    for (auto seen = largest.load(); b.size() > seen && !largest.compare_exchange_weak(seen, b.size());) {
    }
    const auto v = b["v"].to(torch::kFloat32);
    return {{"embedding", torch::stack({v, v * v}, 1)}, {"label", b["label"]}};
  }
};
d::data::Fields square(d::data::Fields b) { return Square{}(std::move(b)); }
// A class given explicitly is a stage over a class, even with no option set.
static_assert(std::is_same_v<decltype(d::data::map_batches<Square>({})),
                             d::data::pipeline<d::data::map_batches_stage<d::data::StatefulStage>>>);

struct Broken {
  static inline std::atomic<int> attempts{0};
  explicit Broken(const std::string& dir) {
    ++attempts;
    throw std::runtime_error("no model in " + dir);
  }
  d::data::Fields operator()(d::data::Fields b) const { return b; }
};
struct Picky {
  d::data::Fields operator()(d::data::Fields b) const {
    for (auto v : ints(b["v"]))
      if (v == 21) throw std::runtime_error("sample 21 is bad");
    return b;
  }
};

// A frozen "pretrained" encoder in the pipeline: a Linear(2, 4) of fixed weights, its output the
// "embedding" column; "x" is dropped.
struct Encoder {
  torch::nn::Linear model{nullptr};
  explicit Encoder(std::int64_t width) : model(2, width) {
    torch::NoGradGuard no_grad;
    model->weight.copy_(torch::linspace(-1, 1, width * 2).reshape({width, 2}));
    model->bias.zero_();
    model->eval();
  }
  d::data::Fields operator()(d::data::Fields b) {
    return {{"embedding", model(b["x"])}, {"label", b["label"]}};
  }
};
}  // namespace

TEST_CASE("pipeline: a stage over a class is constructed lazily once per instance and shared", "[data][pipeline][stage]") {
  namespace dd = d::data;
  Sleepy::reset();
  const auto p = numbered() | dd::map_batches<Sleepy>({.concurrency = 2, .name = "sleepy"}, 5);
  auto ds = dd::pipelined(Numbers{160}, p, {.loader_threads = 4});
  CHECK(Sleepy::constructed == 0);  // nothing until a batch is loaded
  std::vector<std::int64_t> seen;
  for (const auto& b : dd::batches(ds, iota(160), 4)) {
    CHECK(b.names() == std::vector<std::string>{"v", "label", "doubled"});
    CHECK(torch::equal(b["doubled"], b["v"] * 2));
    for (auto v : ints(b["v"])) seen.push_back(v);
  }
  CHECK(seen == iota(160));
  CHECK(Sleepy::constructed == 2);
  REQUIRE(Sleepy::calls.size() >= 2);
  CHECK(Sleepy::calls[0] > 0);
  CHECK(Sleepy::calls[1] > 0);
  CHECK(Sleepy::calls[0] + Sleepy::calls[1] == 40);
  CHECK(Sleepy::most_busy == 2);
  // The dataset's copies, and a second epoch, use the same two instances.
  const auto copy = ds;
  for (int k = 0; k < 3; ++k) CHECK(copy.get_batch(torch::tensor({1, 2}))["doubled"].size(0) == 2);
  for (const auto& b : dd::batches(ds, iota(160), 8, 0, {}, 1)) CHECK(b.size() == 8);
  CHECK(Sleepy::constructed == 2);
  CHECK(Sleepy::most_busy == 2);
  // One stage composed into two pipelines (training and validation): one set of instances.
  Sleepy::reset();
  const auto shared = dd::map_batches<Sleepy>({.concurrency = 1}, 0);
  const auto train = dd::pipelined(Numbers{8}, numbered() | shared, {.loader_threads = 0});
  const auto val = dd::pipelined(Numbers{8}, dd::filter([](std::int64_t i) { return i % 2 == 0; }) | numbered() | shared,
                                 {.loader_threads = 0});
  CHECK(train.get_batch(torch::arange(8)).size() == 8);
  CHECK(val.get_batch(torch::arange(8)).size() == 4);
  CHECK(Sleepy::constructed == 1);
}

TEST_CASE("pipeline: a stage's concurrency bounds its simultaneous calls", "[data][pipeline][stage]") {
  namespace dd = d::data;
  for (int concurrency : {1, 3}) {
    Sleepy::reset();
    auto ds = dd::pipelined(Numbers{96}, numbered() | dd::map_batches<Sleepy>({.concurrency = concurrency}, 10),
                            {.loader_threads = 4});
    std::int64_t rows = 0;
    for (const auto& b : dd::batches(ds, iota(96), 4)) rows += b.size();
    CHECK(rows == 96);
    INFO("concurrency " << concurrency);
    CHECK(Sleepy::constructed <= concurrency);
    CHECK(Sleepy::most_busy <= concurrency);
    CHECK(Sleepy::most_busy >= std::min(concurrency, 2));  // 4 threads, 10 ms calls: they overlap
  }
  CHECK_THROWS_MATCHES(dd::map_batches<Sleepy>({.concurrency = 0, .name = "s"}, 1), d::ConfigError,
                       MessageContains({"\"s\"", "concurrency must be 1 or more, got 0"}));
  CHECK_THROWS_MATCHES(dd::map_batches<Sleepy>({.batch_size = -1}, 1), d::ConfigError,
                       MessageContains({"Sleepy", "batch_size", "got -1"}));
}

TEST_CASE("pipeline: a stage with batch_size is called on chunks and equals a whole-batch function", "[data][pipeline][stage]") {
  namespace dd = d::data;
  const auto filtered = dd::filter([](std::int64_t i) { return i % 7 != 3; }) | numbered();
  auto chunked = dd::pipelined(Numbers{60}, filtered | dd::map_batches<Square>({.batch_size = 3}), {.loader_threads = 2});
  auto whole = dd::pipelined(Numbers{60}, filtered | dd::map_batches(square), {.loader_threads = 0});
  Square::largest = 0;
  Square::calls = 0;
  std::vector<dd::Fields> got, want;
  for (const auto& b : dd::batches(chunked, iota(60), 10)) got.push_back(b);
  const auto chunk_calls = Square::calls.load();
  CHECK(Square::largest == 3);
  for (const auto& b : dd::batches(whole, iota(60), 10)) want.push_back(b);
  REQUIRE(got.size() == 6);
  REQUIRE(want.size() == got.size());
  std::int64_t expected_calls = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    CHECK(got[k].names() == std::vector<std::string>{"embedding", "label"});  // "v" dropped, "embedding" added
    CHECK(same(got[k], want[k]));
    expected_calls += (got[k].size() + 2) / 3;
  }
  CHECK(chunk_calls == expected_calls);
  CHECK(got[0].size() == 9);  // 3 is filtered out: 9 rows, 3 calls
  // batch_size 0: the whole batch in one call.
  Square::largest = 0;
  auto one = dd::pipelined(Numbers{60}, filtered | dd::map_batches<Square>({}), {.loader_threads = 0});
  CHECK(same(one.get_batch(torch::arange(10)), want[0]));
  CHECK(Square::largest == 9);
}

TEST_CASE("pipeline: a stage's errors name the stage and the rows, and a constructor runs once", "[data][pipeline][stage]") {
  namespace dd = d::data;
  Broken::attempts = 0;
  auto broken = dd::pipelined(Numbers{40}, numbered() | dd::map_batches<Broken>({.concurrency = 2, .name = "clip"}, "/models/clip"),
                              {.loader_threads = 0});
  const auto ctor = MessageContains({"map_batches stage \"clip\"", "constructor threw", "rows 4, 5, 6", "no model in /models/clip",
                                     "not run again"});
  CHECK_THROWS_MATCHES(broken.get_batch(torch::tensor({4, 5, 6})), d::DataError, ctor);
  CHECK_THROWS_MATCHES(broken.get_batch(torch::tensor({7})), d::DataError, ctor);  // the same error
  broken.set_loader_threads(3);
  auto consume = [&] {
    for (const auto& b : dd::batches(broken, iota(40), 4)) (void)b;
  };
  CHECK_THROWS_MATCHES(consume(), d::DataError, ctor);
  CHECK(Broken::attempts == 1);
  // Unnamed: the class's name.
  auto unnamed = dd::pipelined(Numbers{4}, numbered() | dd::map_batches<Broken>({}, std::string("x")), {.loader_threads = 0});
  CHECK_THROWS_MATCHES(unnamed.get_batch(torch::tensor({0})), d::DataError,
                       MessageContains({"map_batches stage \"", "Broken\"", "for row 0)", "no model in x"}));

  // A call's error: the chunk's rows (after a filter), on the loop's thread.
  auto picky = dd::pipelined(Numbers{40},
                             dd::filter([](std::int64_t i) { return i != 20; }) | numbered() |
                                 dd::map_batches<Picky>({.batch_size = 2, .name = "picky"}),
                             {.loader_threads = 2});
  std::int64_t rows = 0;
  auto consume_picky = [&] {
    for (const auto& b : dd::batches(picky, iota(40), 4)) rows += b.size();
  };
  CHECK_THROWS_MATCHES(consume_picky(), d::DataError,
                       MessageContains({"map_batches stage \"picky\" threw on rows 21, 22: sample 21 is bad"}));
  CHECK(rows == 20);
  auto long_batch = dd::pipelined(Numbers{40}, numbered() | dd::map_batches<Picky>({.name = "picky"}), {.loader_threads = 0});
  CHECK_THROWS_MATCHES(long_batch.get_batch(torch::arange(12, 32)), d::DataError,
                       MessageContains({"threw on rows 12, 13, 14, 15, 16, 17, 18, 19, ... (20 rows, the last 31)"}));
}

TEST_CASE("pipeline: a stage's output column trains a model", "[data][pipeline][stage]") {
  namespace dd = d::data;
  // Why the stage copies its inference tensors: autograd refuses to save one for backward.
  torch::nn::Linear probe(4, 3);
  torch::Tensor inference;
  {
    c10::InferenceMode guard;
    inference = torch::ones({2, 4});
  }
  CHECK_THROWS(probe(inference).sum().backward());

  struct Points {
    std::int64_t size() const { return 64; }
    dd::Fields operator[](std::int64_t i) const {
      const auto label = i % 3;
      return {{"x", torch::tensor({static_cast<float>(label) - 1.0f, static_cast<float>(i % 5) / 5.0f})},
              {"label", torch::tensor(label)}};
    }
  };
  for (std::int64_t chunk : {0, 5}) {
    INFO("batch_size " << chunk);
    auto ds = dd::pipelined(Points{}, dd::collate(dd::stack()) | dd::map_batches<Encoder>({.batch_size = chunk}, 4),
                            {.loader_threads = 2});
    torch::manual_seed(0);
    torch::nn::Linear head(4, 3);
    torch::optim::SGD opt(head->parameters(), 0.5);
    double first_loss = -1, last_loss = -1;
    for (int epoch = 0; epoch < 5; ++epoch)
      for (const auto& b : dd::batches(ds, iota(64), 16, 0, {}, epoch)) {
        CHECK(b.names() == std::vector<std::string>{"embedding", "label"});
        CHECK_FALSE(b["embedding"].is_inference());
        CHECK_FALSE(b["embedding"].requires_grad());
        opt.zero_grad();
        const auto loss = torch::nn::functional::cross_entropy(head(b["embedding"]), b["label"]);
        loss.backward();
        REQUIRE(head->weight.grad().defined());
        opt.step();
        if (first_loss < 0) first_loss = loss.item<double>();
        last_loss = loss.item<double>();
      }
    CHECK(last_loss < first_loss);
  }
}

// ------------------------------------------------------------------------------------------------
// 4. Preprocessors

TEST_CASE("WordVocabulary tokenizes as text_peer.py does and ranks words by count then word", "[data][preprocess]") {
  using V = d::data::WordVocabulary;
  CHECK(V::tokens("Hello, World! x86_64 C++ e-mail") ==
        std::vector<std::string>{"hello", "world", "x86", "64", "c", "e", "mail"});
  CHECK(V::tokens("caf\xc3\xa9 na\xc3\xafve") == std::vector<std::string>{"caf", "na", "ve"});
  CHECK(V::tokens("\xc4\xb0" "stanbul \xe2\x84\xaa" "elvin") == std::vector<std::string>{"i", "stanbul", "kelvin"});
  CHECK(V::tokens("a b c d", 2) == std::vector<std::string>{"a", "b"});
  const std::vector<std::string> train = {"b a c", "a b", "d b", "e e e e", "z y"};
  const auto v = V::fit(train, 4);
  // counts: e 4, b 3, a 2; then c d y z at 1 -> c by the word.
  CHECK(v.words() == std::vector<std::string>{"e", "b", "a", "c"});
  CHECK(v.size() == 6);
  CHECK(v.encode("B, e! unknown") == std::vector<std::int64_t>{3, 2, 1});
  CHECK(v.encode("...") == std::vector<std::int64_t>{1});
  // max_len cuts the tokens that are counted too (as the peer counts truncated texts).
  CHECK(V::fit(std::vector<std::string>{"q q w", "w"}, 10, 1).words() == std::vector<std::string>{"q", "w"});
}

TEST_CASE("LabelEncoder and StandardScaler fit transform and invert", "[data][preprocess]") {
  const auto enc = d::data::LabelEncoder::fit(std::vector<std::string>{"utils", "admin", "utils", "net"});
  CHECK(enc.classes() == std::vector<std::string>{"admin", "net", "utils"});
  CHECK(enc.transform("net") == 1);
  CHECK(enc.inverse(2) == "utils");
  CHECK_THROWS_MATCHES(enc.transform("games"), d::DataError, MessageContains({"\"games\"", "admin", "net"}));
  const auto x = torch::tensor({{1.0, 5.0}, {3.0, 5.0}}, torch::kFloat32);
  const auto s = d::data::StandardScaler::fit(x);
  CHECK(torch::allclose(s.transform(x), torch::tensor({{-1.0, 0.0}, {1.0, 0.0}}, torch::kFloat32)));
  CHECK(torch::allclose(s.inverse(s.transform(x)), x));
  CHECK_THROWS_MATCHES(s.transform(torch::zeros({1, 3})), d::DataError, MessageContains({"2 features", "given 3"}));
}

namespace {
// A text classifier over fields: mean of the embeddings of the non-pad tokens.
struct TextNetImpl : torch::nn::Module {
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear fc{nullptr};
  TextNetImpl(std::int64_t vocab, std::int64_t classes) {
    emb = register_module("emb", torch::nn::Embedding(vocab, 8));
    fc = register_module("fc", torch::nn::Linear(8, classes));
  }
  torch::Tensor forward(const d::data::Fields& b) {
    const auto keep = b["attention_mask"].unsqueeze(-1).to(torch::kFloat32);
    return fc->forward((emb->forward(b["input_ids"]) * keep).sum(1) / keep.sum(1).clamp_min(1));
  }
};
TORCH_MODULE(TextNet);

// The same network, describing itself: its sizes are a Config that every checkpoint saves.
struct TaggerConfig {
  std::int64_t vocab = 0, classes = 0, width = 8;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TaggerConfig, vocab, classes, width)
struct TaggerImpl : torch::nn::Module {
  using Config = TaggerConfig;
  explicit TaggerImpl(const Config& c) : config(c) {
    emb = register_module("emb", torch::nn::Embedding(c.vocab, c.width));
    fc = register_module("fc", torch::nn::Linear(c.width, c.classes));
  }
  torch::Tensor forward(const d::data::Fields& b) {
    const auto keep = b["attention_mask"].unsqueeze(-1).to(torch::kFloat32);
    return fc->forward((emb->forward(b["input_ids"]) * keep).sum(1) / keep.sum(1).clamp_min(1));
  }
  Config config;
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Tagger);
struct OtherImpl : torch::nn::Module {
  using Config = TaggerConfig;
  explicit OtherImpl(const Config& c) : config(c) {}
  torch::Tensor forward(const d::data::Fields& b) { return b["input_ids"].to(torch::kFloat32); }
  Config config;
};
TORCH_MODULE(Other);
static_assert(d::checkpointer::DescribedModel<Tagger> && d::checkpointer::DescribedModel<std::shared_ptr<TaggerImpl>>);
static_assert(!d::checkpointer::DescribedModel<TextNet>, "no Config: not a described model");

}  // namespace

TEST_CASE("A checkpoint alone builds its model: the config it saved, the preprocessors, the same predictions",
          "[data][preprocess][predictor]") {
  TempDir dir;
  const std::vector<std::string> texts = {"disk partition tool", "network daemon", "disk image", "network proxy"};
  const auto vocab = d::data::WordVocabulary::fit(texts, 100, 16);
  const auto labels = d::data::LabelEncoder::fit(std::vector<std::string>{"admin", "net", "web"});
  torch::manual_seed(3);
  Tagger model(TaggerConfig{.vocab = vocab.size(), .classes = labels.size(), .width = 6});
  const auto path = dtrain_test::save_checkpoint(dir / "run", *model, [&](auto& s) {
    s.model_config = d::checkpointer::describe_model(model);  // what ctx.checkpoint(model, ...) adds
    s.with_object("vocab", vocab).with_object("labels", labels);
  });
  const auto saved = nlohmann::json::parse(std::ifstream(path / "model_config.json"));
  CHECK(saved["format"] == 1);
  CHECK(saved["model"].get<std::string>().find("TaggerImpl") != std::string::npos);
  CHECK(saved["config"] == nlohmann::json{{"vocab", vocab.size()}, {"classes", 3}, {"width", 6}});

  using P = d::evaluation::Predictor<Tagger>;
  const std::vector<std::string> raw = {"disk partition", "Network proxy daemon!", "", "web"};
  auto alone = P::from_checkpoint(path, d::evaluation::TextInputs{});  // no sizes, no model
  auto given = P::from_checkpoint(path, Tagger(TaggerConfig{vocab.size(), 3, 6}), d::evaluation::TextInputs{});
  const auto a = alone.predict(raw), b = given.predict(raw);
  CHECK(torch::equal(a.probabilities(), b.probabilities()));
  CHECK(alone.model()->config.width == 6);
  CHECK(a.class_names() == labels.classes());
  // The in-training model's scores, bitwise.
  model->eval();
  torch::NoGradGuard no_grad;
  const auto batch = d::data::pad_to_longest("input_ids", d::data::WordVocabulary::pad_id, "attention_mask")(
      {d::data::Fields{{"input_ids", vocab.transform(raw[0])}}, d::data::Fields{{"input_ids", vocab.transform(raw[1])}},
       d::data::Fields{{"input_ids", vocab.transform(raw[2])}}, d::data::Fields{{"input_ids", vocab.transform(raw[3])}}});
  CHECK(torch::equal(a.probabilities(), torch::softmax(model->forward(batch), 1)));
  // Weights without preprocessing: the model alone.
  auto bare = P::from_checkpoint(path);
  CHECK(torch::equal(bare.predict(batch).probabilities(), a.probabilities()));
  CHECK(torch::equal(d::evaluation::Predictor<std::shared_ptr<TaggerImpl>>::from_checkpoint(path).predict(batch).probabilities(),
                     a.probabilities()));

  // Another model type: both named.
  CHECK_THROWS_MATCHES(d::evaluation::Predictor<Other>::from_checkpoint(path), d::ConfigError,
                       MessageContains({"holds a", "TaggerImpl", "not a", "OtherImpl"}));
  // A checkpoint of a model without a Config: what to do.
  TextNet plain(vocab.size(), 3);
  const auto plain_path = dtrain_test::save_checkpoint(dir / "plain", *plain);
  CHECK_THROWS_MATCHES(P::from_checkpoint(plain_path), d::ConfigError,
                       MessageContains({"does not say how its model was built", "model_config.json", "Config config"}));
  // A config that no longer converts (the field changed type): the file and the reason.
  const auto bad_path = dtrain_test::save_checkpoint(dir / "bad", *model, [&](auto& s) {
    s.model_config = R"({"format": 1, "model": ")" + d::checkpointer::model_type_name<Tagger>() +
                     R"(", "config": {"vocab": "many", "classes": 3, "width": 6}})";
  });
  CHECK_THROWS_MATCHES(P::from_checkpoint(bad_path), d::ConfigError,
                       MessageContains({"model_config.json", "does not convert", "TaggerConfig"}));
  const auto broken_path = dtrain_test::save_checkpoint(dir / "broken", *model, [&](auto& s) { s.model_config = "{"; });
  CHECK_THROWS_MATCHES(P::from_checkpoint(broken_path), d::ConfigError, MessageContains({"model_config.json", "malformed"}));
}

TEST_CASE("Preprocessors round-trip through a checkpoint and the Predictor takes raw strings", "[data][preprocess][predictor]") {
  TempDir dir;
  const std::vector<std::string> texts = {"disk partition tool", "network daemon", "disk image", "network proxy"};
  const std::vector<std::string> tags = {"admin", "net", "admin", "net"};
  const auto vocab = d::data::WordVocabulary::fit(texts, 100, 16);
  const auto labels = d::data::LabelEncoder::fit(tags);
  const auto scaler = d::data::StandardScaler::fit(torch::tensor({{1.0}, {2.0}, {4.0}}));
  torch::manual_seed(5);
  TextNet model(vocab.size(), labels.size());
  const auto path = dtrain_test::save_checkpoint(dir / "run", *model, [&](auto& s) {
    s.with_object("vocab", vocab).with_object("labels", labels).with_object("scaler", scaler);
  });

  auto ck = d::checkpointer::Checkpoint::open(path);
  REQUIRE(ck);
  d::data::WordVocabulary v2;
  d::data::LabelEncoder l2;
  d::data::StandardScaler s2;
  ck->load_object("vocab", v2);
  ck->load_object("labels", l2);
  ck->load_object("scaler", s2);
  CHECK(v2.words() == vocab.words());
  CHECK(v2.max_len() == 16);
  CHECK(v2.encode("disk network zzz") == vocab.encode("disk network zzz"));
  CHECK(l2.classes() == labels.classes());
  CHECK(torch::equal(s2.mean(), scaler.mean()));
  CHECK_THROWS_MATCHES(ck->load_object("vocab", l2), d::Error, MessageContains({"WordVocabulary", "LabelEncoder"}));

  using P = d::evaluation::Predictor<TextNet>;
  torch::manual_seed(6);  // other weights: the checkpoint replaces them
  auto p = P::from_checkpoint(path, TextNet(vocab.size(), labels.size()), d::evaluation::TextInputs{});
  const auto out = p.predict(std::vector<std::string>{"disk partition", "Network proxy daemon!", ""});
  REQUIRE(out.size() == 3);
  d::data::Fields expected_in{{"input_ids", torch::tensor({vocab.encode("disk partition")[0], vocab.encode("disk partition")[1]})}};
  const auto direct = torch::softmax(model->forward(d::data::pad_to_longest("input_ids")({expected_in})), 1);
  CHECK(torch::allclose(out.probabilities()[0], direct[0], 1e-6, 1e-6));
  CHECK(out.class_names() == std::vector<std::string>{"admin", "net"});
  CHECK((out[1].label == "admin" || out[1].label == "net"));
  CHECK_THROWS_MATCHES(P(TextNet(4, 2)).predict(std::vector<std::string>{"x"}), d::ConfigError,
                       MessageContains({"no preprocessing for raw inputs", "TextInputs", "ImageInputs"}));
  // An object that is not a tokenizer TextInputs knows: a ConfigError naming it and the way out.
  d::evaluation::TextInputs scaler_as_vocab;
  scaler_as_vocab.vocabulary = "scaler";
  CHECK_THROWS_MATCHES(P::from_checkpoint(path, TextNet(vocab.size(), 2), scaler_as_vocab), d::ConfigError,
                       MessageContains({"\"scaler\" is a StandardScaler", "does not restore by itself",
                                        "from_checkpoint<YourTokenizer>"}));

  // A corrupted preprocessor file fails the manifest's checksum.
  const auto object = path / "objects" / "vocab.pt";
  REQUIRE(fs::exists(object));
  {
    std::fstream f(object, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x5a');
  }
  std::string why;
  CHECK_FALSE(d::checkpointer::Checkpoint::open(path, &why));
  CHECK(why.find("vocab.pt") != std::string::npos);
  CHECK_THROWS_MATCHES(P::from_checkpoint(path, TextNet(vocab.size(), 2), d::evaluation::TextInputs{}), d::ConfigError,
                       MessageContains({"not a usable checkpoint", "vocab.pt"}));
}

TEST_CASE("A checkpoint's extras are read typed, naming the file and the key", "[data][checkpoint]") {
  TempDir dir;
  TextNet model(10, 2);
  const auto path = dtrain_test::save_checkpoint(dir / "run", *model, [&](auto& s) {
    s.extras = {{"samples", 640}, {"loop_s", 12.5}, {"first_step_unix", ""}};
  });
  auto ck = d::checkpointer::Checkpoint::open(path);
  REQUIRE(ck);
  CHECK(ck->extra("samples") == 640);
  CHECK(ck->extra("loop_s", 0) == 12.5);
  CHECK(ck->extra("global_samples", 7) == 7);  // saved before the program wrote it: the fallback
  CHECK_THROWS_MATCHES(ck->extra("global_samples"), d::Error,
                       MessageContains({"state.json", "no extra \"global_samples\"", "\"loop_s\"",
                                        "ck.extra(\"global_samples\", value)"}));
  // Text where a number was saved: a damaged checkpoint; in a train loop (ctx.get_checkpoint())
  // the group is told, and restarts from an older one.
  std::string reported;
  ck->mark_for_worker([&](const std::string& why) { reported = why; });
  CHECK_THROWS_MATCHES(ck->extra("first_step_unix", 0), d::Error,
                       MessageContains({"state.json", "\"first_step_unix\" is \"\"", "not a number", "damaged",
                                        "restarts from an older checkpoint"}));
  CHECK_THAT(reported, Catch::Contains("first_step_unix") && Catch::Contains("state.json"));
}

TEST_CASE("A .pt file changed with its manifest entry rewritten fails its zip records' own CRC-32s", "[data][checkpoint]") {
  TempDir dir;
  torch::manual_seed(3);
  TextNet model(4000, 2);  // 128 KB of embedding: the file's middle is tensor data
  const auto path = dtrain_test::save_checkpoint(dir / "run", *model);
  REQUIRE(d::checkpointer::Checkpoint::open(path));
  const auto file = path / "model.pt";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(file) / 2));
    const char c = static_cast<char>(f.peek());
    f.seekp(static_cast<std::streamoff>(fs::file_size(file) / 2));
    f.put(static_cast<char>(c ^ 0x10));
  }
  // The manifest made to agree, as a tool that "repairs" checksums would.
  auto manifest = nlohmann::json::parse(std::ifstream(path / "manifest.json"));
  for (auto& entry : manifest["files"])
    if (entry["name"] == "model.pt") entry["crc32"] = d::checkpointer::detail::crc32_of_file(file).first;
  std::ofstream(path / "manifest.json") << manifest.dump();
  std::string why;
  CHECK_FALSE(d::checkpointer::Checkpoint::open(path, &why));
  CHECK_THAT(why, Catch::Contains("model.pt") && Catch::Contains("fails its own CRC-32 check"));
}

// ------------------------------------------------------------------------------------------------
// 5. Splits

TEST_CASE("PythonRandom shuffles as Python's random.Random(seed).shuffle", "[data][splits]") {
  std::vector<int> x = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  d::data::PythonRandom(7).shuffle(x);
  CHECK(x == std::vector<int>{8, 3, 1, 4, 7, 0, 9, 6, 2, 5});  // python3: random.Random(7).shuffle
  std::vector<int> y(1000);
  for (int i = 0; i < 1000; ++i) y[static_cast<std::size_t>(i)] = i;
  d::data::PythonRandom(0).shuffle(y);
  CHECK(std::vector<int>(y.begin(), y.begin() + 8) == std::vector<int>{439, 621, 160, 549, 237, 389, 658, 507});
  std::vector<int> z = {0, 1, 2, 3, 4};
  d::data::PythonRandom((1ULL << 40) + 3).shuffle(z);
  CHECK(z == std::vector<int>{4, 3, 2, 0, 1});
}

TEST_CASE("random and stratified splits are seeded disjoint and complete", "[data][splits]") {
  const auto r = d::data::random_split(100, 0.2, 0.1, 4);
  CHECK(r.validation.size() == 20);
  CHECK(r.test.size() == 10);
  CHECK(r.train.size() == 70);
  std::vector<std::int64_t> all = r.train;
  all.insert(all.end(), r.validation.begin(), r.validation.end());
  all.insert(all.end(), r.test.begin(), r.test.end());
  std::sort(all.begin(), all.end());
  for (std::int64_t i = 0; i < 100; ++i) CHECK(all[static_cast<std::size_t>(i)] == i);
  CHECK(d::data::random_split(100, 0.2, 0.1, 4).validation == r.validation);
  CHECK(d::data::random_split(100, 0.2, 0.1, 5).validation != r.validation);
  CHECK_THROWS_AS(d::data::random_split(10, 0.8, 0.5, 0), d::ConfigError);

  std::vector<std::string> tags;
  for (int i = 0; i < 50; ++i) tags.push_back(i % 5 == 0 ? "rare" : "common");  // 10 rare, 40 common
  const auto s = d::data::stratified_split(tags, 0.25, 0.0, 0);
  std::int64_t rare_val = 0;
  for (auto i : s.validation) rare_val += tags[static_cast<std::size_t>(i)] == "rare";
  CHECK(s.validation.size() == 12);  // round(0.25 * 40) + round(0.25 * 10) = 10 + 2 (2.5 rounds to even)
  CHECK(rare_val == 2);
  CHECK(s.train.size() == 38);
  // text_peer.py's split: per tag sorted, the tag's rows shuffled with random.Random(seed).
  std::vector<std::int64_t> common;
  for (int i = 0; i < 50; ++i)
    if (i % 5) common.push_back(i);
  d::data::PythonRandom(0).shuffle(common);
  CHECK(std::vector<std::int64_t>(s.validation.begin(), s.validation.begin() + 10) ==
        std::vector<std::int64_t>(common.begin(), common.begin() + 10));

  const d::data::TensorDataset td(torch::arange(10).to(torch::kFloat32).unsqueeze(1), torch::arange(10));
  const d::data::Subset sub(td, {7, 2, 5});
  CHECK(sub.size() == 3);
  CHECK(ints(sub.get_batch(torch::tensor({2, 0})).target) == std::vector<std::int64_t>{5, 7});
  CHECK_THROWS_MATCHES(d::data::Subset(td, {10}), d::DataError, MessageContains({"index 10", "[0, 10)"}));
}
