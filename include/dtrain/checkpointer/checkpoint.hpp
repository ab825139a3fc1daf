#pragma once
// A checkpoint on disk: its layout, its manifest (sizes and CRC-32s), the value type Checkpoint
// that finds, verifies and loads one, and the atomic, fsynced writing of its files.
//
// storage_path/name/checkpoint_NNNNNN/      NNNNNN: the report iteration, zero-padded
//   model.pt          parameters and buffers by name: torch::pickle_save of a Dict[str, Tensor]
//                     (Python: torch.load("model.pt") gives a dict of tensors)
//   optimizer.pt      the optimizer's state (torch::serialize::OutputArchive)
//   state.json        counters (iteration, epoch, steps), the reported metrics, the user's extras
//   rank_RRRRR.json   one per rank: its sampler position and its default CPU generator's state
//   optimizer_rank_RRRRR.pt  under strategy::fsdp<> only: rank R's optimizer state (over its
//                     shards); optimizer.pt then only records that the state is sharded
//   manifest.json     every other file's size and CRC-32 (zlib), written last
//
// A checkpoint is written into `.tmp_checkpoint_NNNNNN` beside it, every file fsynced, then the
// directory is renamed into place and the run directory fsynced: a checkpoint_* directory is
// complete or absent, and the manifest catches what the disk damaged later.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/metrics.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer {

namespace files {
inline constexpr const char* model = "model.pt";
inline constexpr const char* optimizer = "optimizer.pt";
inline constexpr const char* state = "state.json";
inline constexpr const char* manifest = "manifest.json";
inline std::string rank(int r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d.json", r);
  return buf;
}
/// Rank r's optimizer state when the strategy shards it (strategy::fsdp<>).
inline std::string rank_optimizer(int r) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "optimizer_rank_%05d.pt", r);
  return buf;
}
}  // namespace files

/// "checkpoint_000042" for iteration 42.
inline std::string directory_name(std::int64_t iteration) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "checkpoint_%06lld", static_cast<long long>(iteration));
  return buf;
}
inline std::string temporary_name(std::int64_t iteration) { return ".tmp_" + directory_name(iteration); }

/// The iteration a "checkpoint_NNNNNN" directory name stands for, or nothing for other names.
inline std::optional<std::int64_t> iteration_of(const std::string& dir_name) {
  static constexpr std::string_view prefix = "checkpoint_";
  if (dir_name.size() <= prefix.size() || dir_name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const auto digits = dir_name.substr(prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 18) return std::nullopt;
  return std::stoll(digits);
}

namespace detail {

inline constexpr const char* sharded_optimizer_key = "dtrain_optimizer_sharded_over_ranks";

inline std::uint32_t crc32_of(const char* data, std::size_t n, std::uint32_t crc = 0) {
  uLong c = crc == 0 ? ::crc32(0L, Z_NULL, 0) : crc;
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    c = ::crc32(c, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(c);
}

/// CRC-32 and size of a file on disk.
inline std::pair<std::uint32_t, std::uint64_t> crc32_of_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error(p.string() + ": cannot be read");
  std::vector<char> buf(1 << 20);
  uLong c = ::crc32(0L, Z_NULL, 0);
  std::uint64_t size = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = in.gcount();
    if (got <= 0) break;
    c = ::crc32(c, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(got));
    size += static_cast<std::uint64_t>(got);
  }
  return {static_cast<std::uint32_t>(c), size};
}

[[noreturn]] inline void io_error(const std::filesystem::path& p, const std::string& what) {
  throw Error(p.string() + ": cannot " + what + " (" + std::strerror(errno) +
              "); check that the storage path is writable and not full");
}

/// Opens `dir` and fsyncs it, so that the names created or renamed in it are durable.
inline void fsync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) io_error(dir, "open the directory to fsync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) io_error(dir, "fsync the directory");
}

/// A test hook: write only the first `cut_after` bytes, then end the process with _exit(9) (a
/// crash inside a checkpoint write). See DTRAIN_FAULT_CHECKPOINT_WRITE in checkpointer/directory.hpp.
inline std::optional<std::size_t>& crash_after_bytes() {
  static std::optional<std::size_t> cut;
  return cut;
}

/// Writes `bytes` to `p` (created or truncated) and fsyncs it. Returns the CRC-32.
inline std::uint32_t write_file(const std::filesystem::path& p, const char* data, std::size_t n) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_error(p, "create the file");
  std::size_t limit = n;
  if (auto& cut = crash_after_bytes(); cut) limit = std::min(n, *cut);
  std::size_t done = 0;
  while (done < limit) {
    const ssize_t w = ::write(fd, data + done, limit - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      io_error(p, "write the file");
    }
    done += static_cast<std::size_t>(w);
  }
  if (crash_after_bytes()) {
    ::fsync(fd);
    std::_Exit(9);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    io_error(p, "fsync the file");
  }
  if (::close(fd) != 0) io_error(p, "close the file");
  return crc32_of(data, n);
}
inline std::uint32_t write_file(const std::filesystem::path& p, const std::string& s) {
  return write_file(p, s.data(), s.size());
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error(p.string() + ": cannot be read");
  return {std::istreambuf_iterator<char>(in), {}};
}

inline std::string to_hex(const std::uint8_t* p, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  return s;
}
inline std::vector<std::uint8_t> from_hex(const std::string& s) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw Error("checkpoint: bad hex digit in a generator state");
  };
  std::vector<std::uint8_t> out(s.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::uint8_t>(nibble(s[2 * i]) << 4 | nibble(s[2 * i + 1]));
  return out;
}

/// The state of torch's default CPU generator (a uint8 tensor), cloned.
inline torch::Tensor default_generator_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state().clone();
}
inline void set_default_generator_state(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

/// Parameters and buffers by their dotted names (`0.weight`, `2.running_mean`).
inline c10::Dict<std::string, at::Tensor> named_state(const torch::nn::Module& m, bool clone) {
  c10::Dict<std::string, at::Tensor> d;
  for (const auto& p : m.named_parameters(true)) d.insert(p.key(), clone ? p.value().detach().clone() : p.value());
  for (const auto& b : m.named_buffers(true)) d.insert(b.key(), clone ? b.value().detach().clone() : b.value());
  return d;
}

}  // namespace detail

/// How long checkpointing held up the training thread, and how long the writes took.
struct CheckpointStats {
  /// Checkpoints written (completed) by this rank.
  std::int64_t written = 0;
  /// Seconds the training thread spent in ctx.checkpoint() and in starting the write: waiting
  /// for the previous write, cloning the state, serializing the optimizer.
  double blocked_s = 0;
  /// Seconds the writes took on the background thread (all of them, and the last one).
  double write_s = 0, last_write_s = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CheckpointStats, written, blocked_s, write_s, last_write_s)

inline constexpr const char* stats_file = "checkpoint_stats.json";


/// One checkpoint directory on disk: where it is, what was reported with it, and how to load it.
///
/// Obtained from Result::latest_checkpoint() / best_checkpoint() in the driver, or from
/// ctx.get_checkpoint() in a worker (where restore() also restores this rank's generator).
class Checkpoint {
 public:
  Checkpoint() = default;

  /// Opens the checkpoint at `dir` after verifying its manifest (every file's size and CRC-32);
  /// nothing when it is damaged or incomplete, with the reason in `*why`.
  /// `verify_files = false` skips the CRC-32s (for a checkpoint another rank verified just now).
  static std::optional<Checkpoint> open(const std::filesystem::path& dir, std::string* why = nullptr,
                                        bool verify_files = true) {
    std::string reason = verify_files ? verify(dir)
                         : std::filesystem::exists(dir / files::manifest) ? std::string()
                                                                          : std::string("no manifest.json");
    if (reason.empty()) {
      try {
        Checkpoint c;
        c.path_ = dir;
        const auto state = nlohmann::json::parse(detail::read_text(dir / files::state));
        c.iteration_ = state.at("iteration").get<std::int64_t>();
        c.epoch_ = state.at("epoch").get<std::int64_t>();
        c.steps_ = state.at("steps").get<std::int64_t>();
        c.world_size_ = state.at("world_size").get<int>();
        c.metrics_ = state.at("metrics").get<Metrics>();
        c.extras_ = state.at("extras").get<Metrics>();
        return c;
      } catch (const std::exception& e) {
        reason = std::string(files::state) + " is unreadable (" + e.what() + ")";
      }
    }
    if (why) *why = reason;
    return std::nullopt;
  }

  /// Why the checkpoint at `dir` cannot be used, or "" when its manifest verifies.
  static std::string verify(const std::filesystem::path& dir) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return "not a directory";
    if (!fs::exists(dir / files::manifest, ec)) return "no manifest.json (an incomplete write?)";
    nlohmann::json manifest;
    try {
      manifest = nlohmann::json::parse(detail::read_text(dir / files::manifest));
      const int world = manifest.at("world_size").get<int>();
      std::map<std::string, bool> listed;
      for (const auto& f : manifest.at("files")) {
        const auto name = f.at("name").get<std::string>();
        listed[name] = true;
        const auto p = dir / name;
        if (!fs::exists(p, ec)) return name + " is missing";
        const auto size = fs::file_size(p, ec);
        if (ec || size != f.at("size").get<std::uint64_t>())
          return name + " has " + std::to_string(size) + " bytes, the manifest says " +
                 std::to_string(f.at("size").get<std::uint64_t>()) + " (truncated?)";
        if (detail::crc32_of_file(p).first != f.at("crc32").get<std::uint32_t>())
          return name + " fails its CRC-32 check (corrupted)";
      }
      for (const std::string need : {files::model, files::optimizer, files::state})
        if (!listed.count(need)) return "the manifest lists no " + need;
      for (int r = 0; r < world; ++r)
        if (!listed.count(files::rank(r))) return "the manifest lists no " + files::rank(r);
    } catch (const std::exception& e) {
      return std::string("manifest.json is unreadable (") + e.what() + ")";
    }
    return {};
  }

  const std::filesystem::path& path() const { return path_; }
  /// The metrics reported with this checkpoint (with iteration, epoch, step and timestamp).
  const Metrics& metrics() const { return metrics_; }
  /// The extras passed to ctx.checkpoint(model, optimizer, extras).
  const Metrics& extras() const { return extras_; }
  /// The report() call that saved it (1 for the first report).
  std::int64_t iteration() const { return iteration_; }
  std::int64_t epoch() const { return epoch_; }
  /// Optimizer steps (ctx.step) taken before it was saved.
  std::int64_t steps() const { return steps_; }
  int world_size() const { return world_size_; }

  /// The model's parameters and buffers by name, as saved.
  std::map<std::string, torch::Tensor> model_state() const {
    std::ifstream in(path_ / files::model, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    const auto value = torch::jit::pickle_load(bytes);
    std::map<std::string, torch::Tensor> out;
    for (const auto& kv : value.toGenericDict()) out.emplace(kv.key().toStringRef(), kv.value().toTensor());
    return out;
  }

  /// Copies the saved parameters and buffers into `module` (a torch::nn::Module, its holder or a
  /// shared_ptr to one). Throws Error naming any name that is missing or has another shape.
  template <class M>
  void load_model(M& module) const {
    torch::nn::Module& m = as_module(module);
    const auto state = model_state();
    // A model the worker context prepared under a sharding strategy loads through it.
    if (model_loader_ && model_loader_(m, state, (path_ / files::model).string())) return;
    torch::NoGradGuard no_grad;
    auto load = [&](const std::string& name, torch::Tensor& dst) {
      auto it = state.find(name);
      if (it == state.end())
        throw Error((path_ / files::model).string() + " has no tensor \"" + name +
                    "\"; was it saved from another model?");
      if (it->second.sizes() != dst.sizes())
        throw Error((path_ / files::model).string() + ": \"" + name + "\" has shape " +
                    c10::str(it->second.sizes()) + ", the model " + c10::str(dst.sizes()));
      dst.copy_(it->second);
    };
    for (auto& p : m.named_parameters(true)) load(p.key(), p.value());
    for (auto& b : m.named_buffers(true)) load(b.key(), b.value());
  }

  /// Loads the saved optimizer state into `optimizer` (built over the same parameters).
  ///
  /// The optimizer state of a strategy::fsdp<> checkpoint is sharded: rank r loads its own piece,
  /// which needs the same world size and an optimizer over ctx.parameters(model) under fsdp<>.
  /// Loading sharded state into an optimizer over full parameters (ddp<>), or the reverse, throws
  /// ConfigError: load the weights only (restore(model) or load_model(model)) and let the optimizer
  /// start afresh.
  template <class Optimizer>
  void load_optimizer(Optimizer& optimizer) const {
    const bool saved_sharded = std::filesystem::exists(path_ / files::rank_optimizer(0));
    if (saved_sharded != sharded_optimizer_)
      throw ConfigError(path_.string() + ": its optimizer state was saved " +
                        (saved_sharded ? "sharded over " + std::to_string(world_size_) + " ranks (strategy::fsdp<>)"
                                       : std::string("whole (strategy::ddp<>)")) +
                        ", and this optimizer is over " +
                        (sharded_optimizer_ ? "this rank's fsdp<> shards" : "full parameters") +
                        "; the two do not convert. Load the weights only with restore(model) or load_model(model) "
                        "(model.pt converts between ddp<> and fsdp<>), and let the optimizer start afresh");
    std::filesystem::path file = path_ / files::optimizer;
    if (saved_sharded) {
      if (rank_ < 0 || rank_ >= world_size_)
        throw ConfigError(path_.string() + ": its optimizer state is sharded over " + std::to_string(world_size_) +
                          " ranks and this group's rank " + std::to_string(rank_) +
                          " has no piece; resume with the same number of workers, or load the weights only "
                          "with restore(model)");
      file = path_ / files::rank_optimizer(rank_);
    }
    torch::serialize::InputArchive archive;
    archive.load_from(file.string());
    optimizer.load(archive);
  }

  /// The model, the optimizer, and (in a worker) this rank's default CPU generator as saved:
  /// `if (auto ck = ctx.get_checkpoint()) ck->restore(model, optimizer);`
  template <class M, class Optimizer>
  void restore(M& module, Optimizer& optimizer) const {
    load_model(module);
    load_optimizer(optimizer);
    restore_generator();
  }
  template <class M>
  void restore(M& module) const {
    load_model(module);
    restore_generator();
  }

  /// In a worker: this rank's generator state, as saved; a no-op elsewhere or when the checkpoint
  /// was saved by a group of another size.
  void restore_generator() const {
    if (rank_ < 0 || rank_ >= world_size_) return;
    const auto j = nlohmann::json::parse(detail::read_text(path_ / files::rank(rank_)));
    auto bytes = detail::from_hex(j.at("rng").get<std::string>());
    auto t = torch::empty({static_cast<std::int64_t>(bytes.size())}, torch::kUInt8);
    std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    detail::set_default_generator_state(t);
  }

  /// The per-rank state (sampler epoch and position) `rank` saved, when it is there.
  std::optional<std::pair<std::int64_t, std::int64_t>> sampler_state(int rank) const {
    if (rank < 0 || rank >= world_size_) return std::nullopt;
    const auto j = nlohmann::json::parse(detail::read_text(path_ / files::rank(rank)));
    return std::pair{j.at("epoch").get<std::int64_t>(), j.at("position").get<std::int64_t>()};
  }

  /// The rank restore() restores the generator of (-1: none); set by the worker context.
  void set_rank(int rank) { rank_ = rank; }

  /// Set by the worker context (ctx.attach): whether optimizers here step sharded state, and a
  /// loader for models prepared under a sharding strategy (returns false for other modules).
  void set_sharded_optimizer(bool on) { sharded_optimizer_ = on; }
  using model_loader = std::function<bool(torch::nn::Module&, const std::map<std::string, torch::Tensor>&,
                                          const std::string&)>;
  void set_model_loader(model_loader loader) { model_loader_ = std::move(loader); }

 private:
  template <class M>
  static torch::nn::Module& as_module(M& m) {
    if constexpr (std::is_base_of_v<torch::nn::Module, M>) return m;
    else return static_cast<torch::nn::Module&>(*m);
  }

  std::filesystem::path path_;
  Metrics metrics_, extras_;
  std::int64_t iteration_ = 0, epoch_ = 0, steps_ = 0;
  int world_size_ = 1;
  int rank_ = -1;
  bool sharded_optimizer_ = false;
  model_loader model_loader_;
};

/// The checkpoint directories under `run_dir`, newest first (by iteration; not verified).
inline std::vector<std::pair<std::int64_t, std::filesystem::path>> list(const std::filesystem::path& run_dir) {
  std::vector<std::pair<std::int64_t, std::filesystem::path>> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(run_dir, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(run_dir, ec))
    if (auto it = iteration_of(e.path().filename().string()); it && e.is_directory()) out.emplace_back(*it, e.path());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

/// The newest checkpoint under `run_dir` whose manifest verifies. Each newer one that does not is
/// reported on stderr with its path and the reason, and skipped.
inline std::optional<Checkpoint> latest_valid(const std::filesystem::path& run_dir, bool warn = true) {
  for (const auto& [it, dir] : list(run_dir)) {
    std::string why;
    if (auto c = Checkpoint::open(dir, &why)) return c;
    if (warn)
      std::fprintf(stderr, "dtrain: warning: checkpoint %s is damaged (%s); falling back to an older one\n",
                   dir.c_str(), why.c_str());
  }
  return std::nullopt;
}

/// Whether checkpoint `a` scores better than `b` by `attribute` in `order`; a checkpoint without
/// the attribute (or with text there) scores worst; ties go to the newer.
inline bool scores_better(const Metrics& a, std::int64_t a_iter, const Metrics& b, std::int64_t b_iter,
                          const std::string& attribute, bool higher_is_better) {
  if (attribute.empty()) return a_iter > b_iter;
  auto score = [&](const Metrics& m) -> std::optional<double> {
    auto it = m.find(attribute);
    if (it == m.end() || !it->second.is_number()) return std::nullopt;
    const double v = it->second.number();
    if (v != v) return std::nullopt;  // NaN
    return v;
  };
  const auto sa = score(a), sb = score(b);
  if (sa && sb && *sa != *sb) return higher_is_better ? *sa > *sb : *sa < *sb;
  if (sa.has_value() != sb.has_value()) return sa.has_value();
  return a_iter > b_iter;
}

}  // namespace checkpointer

DTRAIN_NAMESPACE_END
