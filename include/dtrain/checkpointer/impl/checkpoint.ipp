// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of checkpoint.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/nn/lora_layer.hpp>

#include <fstream>

// Only the bodies read pickles: the header stays without the JIT's pickler and its frontend.
#include <torch/csrc/jit/serialization/pickle.h>

DTRAIN_NAMESPACE_BEGIN
namespace checkpointer {

DTRAIN_INLINE std::optional<Checkpoint> Checkpoint::open(const std::filesystem::path& dir, std::string* why,
                                                         bool verify_files) {
  std::string reason;
  try {
    const auto manifest = detail::read_manifest(dir);
    if (verify_files) detail::verify_files(dir, manifest);
    const auto state = detail::StateFile::read(dir);
    std::vector<detail::RankFile> ranks;
    if (verify_files)
      for (int r = 0; r < state.world_size && r < manifest.world_size; ++r) ranks.push_back(detail::RankFile::read(dir, r));
    detail::check_agreement(dir, manifest, state, ranks);
    Checkpoint c;
    c.path_ = dir;
    c.iteration_ = state.iteration;
    c.epoch_ = state.epoch;
    c.steps_ = state.steps;
    c.world_size_ = state.world_size;
    c.metrics_ = state.metrics;
    c.extras_ = state.extras;
    return c;
  } catch (const std::exception& e) {  // DamagedFile, or a file that cannot be read
    reason = e.what();
  }
  if (why) *why = reason;
  return std::nullopt;
}

DTRAIN_INLINE std::string Checkpoint::verify(const std::filesystem::path& dir) {
  try {
    detail::verify_files(dir, detail::read_manifest(dir));
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

DTRAIN_INLINE std::map<std::string, torch::Tensor> Checkpoint::model_state() const {
  std::ifstream in(path_ / files::model, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  const auto value = torch::jit::pickle_load(bytes);
  std::map<std::string, torch::Tensor> out;
  for (const auto& kv : value.toGenericDict()) out.emplace(kv.key().toStringRef(), kv.value().toTensor());
  return out;
}

DTRAIN_INLINE void Checkpoint::load_tensors(torch::nn::Module& m, const std::map<std::string, torch::Tensor>& tensors,
                                            const std::string& source) {
  torch::NoGradGuard no_grad;
  // An adapted model's checkpoint holds what trains; its frozen base is the base model's files.
  const bool adapters_only = detail::saves_trainable_only(m);
  auto load = [&](const std::string& name, torch::Tensor& dst) {
    auto it = tensors.find(name);
    if (it == tensors.end() && adapters_only && !dst.requires_grad()) return;
    if (it == tensors.end())
      throw Error(source + " has no tensor \"" + name + "\"; was it saved from another model?");
    if (it->second.sizes() != dst.sizes())
      throw Error(source + ": \"" + name + "\" has shape " + c10::str(it->second.sizes()) + ", the model " +
                  c10::str(dst.sizes()));
    dst.copy_(it->second);
  };
  // LoRA adapters the model lacks would be dropped without a word: the served model would be the base.
  const auto own = m.named_parameters(true);
  for (const auto& [name, tensor] : tensors)
    if ((name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos) && !own.contains(name))
      throw Error(source + " holds LoRA adapters (\"" + name + "\") that the model has not; serve the checkpoint with "
                  "nn::from_lora_checkpoint<Model>(checkpoint), or add them first with the LoraConfig it was trained with "
                  "(nn::add_lora), then load");
  for (auto& p : m.named_parameters(true)) load(p.key(), p.value());
  for (auto& b : m.named_buffers(true)) load(b.key(), b.value());
}

DTRAIN_INLINE void Checkpoint::check_adapter_base(const torch::nn::Module& m) const {
  const auto file = path_ / files::adapter_config;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return;
  nlohmann::json saved;
  try {
    std::ifstream in(file);
    saved = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(file.string() + ": not JSON (" + e.what() + ")");
  }
  const auto ours = nn::detail::lora_config_of(m);
  if (!ours)
    throw Error(path_.string() + " holds LoRA adapters and the model has none; serve it with "
                "nn::from_lora_checkpoint<Model>(checkpoint), or add them first with the LoraConfig it was trained with "
                "(nn::add_lora), then load");
  if (!saved.contains("dtrain_base_files")) return;  // trained without LoraConfig::base_model: nothing to check
  const auto base = saved.value("base_model_name_or_path", std::string());
  if (ours->base_files.empty())
    throw ConfigError(file.string() + ": the adapters were trained on the base model " + base +
                      " and this model's adapters name no base; add them with LoraConfig::base_model set to the directory "
                      "the model's weights came from, so that the base can be checked");
  const auto mine = nlohmann::json::parse(ours->base_files);
  const auto& theirs = saved["dtrain_base_files"];
  if (mine == theirs) return;
  std::string differs;
  for (const auto& [name, id] : theirs.items())
    if (!mine.contains(name) || mine[name] != id) {
      differs = name + (mine.contains(name) ? " differs" : " is missing");
      break;
    }
  if (differs.empty()) differs = "it has other files";
  if (std::filesystem::path(base).lexically_normal() == std::filesystem::path(ours->base_model).lexically_normal())
    throw ConfigError(path_.string() + ": its LoRA adapters were trained on the base model " + base +
                      ", whose files have changed since: " + differs + ". Adapters fit only the weights they were "
                      "trained on; restore that base's files (or train the adapters again on these)");
  throw ConfigError(path_.string() + ": its LoRA adapters were trained on the base model " + base + " and this model's base (" +
                    ours->base_model + ") is another: " + differs + ". Adapters fit only the weights they were trained "
                    "on; load that base (or train the adapters again on this one)");
}

DTRAIN_INLINE std::vector<std::filesystem::path> Checkpoint::sharded_optimizer_files() const {
  optimizer_saved_sharded(true);
  std::vector<std::filesystem::path> out;
  for (int r = 0; r < world_size_; ++r) out.push_back(path_ / files::rank_optimizer(r));
  return out;
}

DTRAIN_INLINE void Checkpoint::restore_generator(int rank) const {
  if (rank < 0 || rank >= world_size_) return;
  auto bytes = detail::from_hex(rank_file(rank).rng);
  auto t = torch::empty({static_cast<std::int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  detail::set_default_generator_state(t);
}

DTRAIN_INLINE std::optional<std::pair<std::int64_t, std::int64_t>> Checkpoint::sampler_state(int rank) const {
  if (rank < 0 || rank >= world_size_) return std::nullopt;
  const auto r = rank_file(rank);
  return std::pair{r.epoch, r.position};
}

DTRAIN_INLINE std::optional<std::int64_t> Checkpoint::sample_offset(int rank) const {
  if (rank < 0 || rank >= world_size_) return std::nullopt;
  const auto offset = rank_file(rank).offset;
  return offset >= 0 ? std::optional<std::int64_t>(offset) : std::nullopt;
}

DTRAIN_INLINE std::optional<std::int64_t> Checkpoint::shard_samples(int rank) const {
  if (rank < 0 || rank >= world_size_) return std::nullopt;
  const auto samples = rank_file(rank).samples;
  return samples >= 0 ? std::optional<std::int64_t>(samples) : std::nullopt;
}

DTRAIN_INLINE std::filesystem::path Checkpoint::file(const std::string& name) const {
  const auto p = as_directory() / name;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec))
    throw Error("checkpoint " + path_.string() + " has no file \"" + name + "\" (it holds: " +
                names_in(files::user_files, "") + "); save it with ctx.checkpoint(...).with_file(\"" + name +
                "\", path)");
  return p;
}

DTRAIN_INLINE void Checkpoint::restore_device_generator(int rank, torch::Device device) const {
  if (rank < 0 || rank >= world_size_ || !device.is_cuda()) return;
  const auto cuda_rng = rank_file(rank).cuda_rng;
  if (cuda_rng.empty()) return;
  auto bytes = detail::from_hex(cuda_rng);
  auto t = torch::empty({static_cast<std::int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  detail::set_device_generator_state(device, t);
}

DTRAIN_INLINE detail::RankFile Checkpoint::rank_file(int rank) const {
  try {
    return detail::RankFile::read(path_, rank);
  } catch (const detail::DamagedFile& e) {
    throw Error("checkpoint " + path_.string() + ": " + e.what() +
                "; it changed after the checkpoint was verified. Resume from another checkpoint "
                "(RunConfig::resume_from) or restore the file");
  }
}

DTRAIN_INLINE bool Checkpoint::optimizer_saved_sharded(bool sharded) const {
  bool saved_sharded = std::filesystem::exists(path_ / files::rank_optimizer(0));
  if (!saved_sharded) {
    torch::serialize::InputArchive marker;
    torch::Tensor world;
    try {
      marker.load_from((path_ / files::optimizer).string());
      saved_sharded = marker.try_read(detail::sharded_optimizer_key, world);
    } catch (const c10::Error&) {
    }
  }
  if (saved_sharded != sharded)
    throw ConfigError(path_.string() + ": its optimizer state was saved " +
                      (saved_sharded ? "sharded over " + std::to_string(world_size_) + " ranks (strategy::fsdp<>)"
                                     : std::string("whole (strategy::ddp<>)")) +
                      ", and this optimizer is over " +
                      (sharded ? "this rank's fsdp<> shards" : "full parameters") +
                      "; the two do not convert. Load the weights only (ctx.restore(ck, model) in a train loop, "
                      "Checkpoint::restore(model) or load_model(model) elsewhere: model.pt converts between ddp<> "
                      "and fsdp<>), and let the optimizer start afresh");
  return saved_sharded;
}

DTRAIN_INLINE void Checkpoint::require_object(const std::string& name) const {
  if (!has_object(name))
    throw Error("checkpoint " + path_.string() + " has no object \"" + name + "\" (it holds: " +
                names_in(files::user_objects, ".pt") + "); save it with ctx.checkpoint(...).with_object(\"" + name +
                "\", object)");
}

DTRAIN_INLINE std::string Checkpoint::object_kind(const std::string& name) const {
  require_object(name);
  const auto p = object_path(name);
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(p.string());
    c10::IValue kind;
    if (!archive.try_read("kind", kind) || !kind.isString()) return "";
    return kind.toStringRef();
  } catch (const c10::Error& e) {
    throw Error(p.string() + ": cannot read the object \"" + name + "\" (" + e.what_without_backtrace() + ")");
  }
}

DTRAIN_INLINE std::string Checkpoint::names_in(const char* dir, const std::string& suffix) const {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(path_ / dir, ec)) {
    auto n = e.path().filename().string();
    if (!suffix.empty() && n.size() > suffix.size()) n.resize(n.size() - suffix.size());
    names.push_back("\"" + n + "\"");
  }
  if (names.empty()) return "none";
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

DTRAIN_INLINE double Checkpoint::extra(std::string_view key, double fallback) const {
  const auto it = extras_.find(key);
  if (it == extras_.end()) return fallback;
  const auto& v = it->second;
  if (v.is_number()) return v.number();
  std::string why = (path_ / files::state).string() + ": the extra \"" + std::string(key) + "\" is \"" + v.text() +
                    "\", not a number; the checkpoint is damaged (its writer saved ctx.checkpoint(model, optimizer, "
                    "{{\"" + std::string(key) + "\", number}}))";
  if (damaged_) damaged_(why);
  throw Error(why + (damaged_ ? ". The group restarts from an older checkpoint if there is one" : ""));
}

DTRAIN_INLINE double Checkpoint::extra(std::string_view key) const {
  if (extras_.find(key) == extras_.end()) {
    std::string held;
    for (const auto& [k, v] : extras_) held += (held.empty() ? "\"" : ", \"") + k + "\"";
    throw Error((path_ / files::state).string() + ": the checkpoint has no extra \"" + std::string(key) +
                "\" (it has: " + (held.empty() ? std::string("none") : held) +
                "); it was saved without it, by an earlier version of the program? Read it with a fallback: "
                "ck.extra(\"" + std::string(key) + "\", value)");
  }
  return extra(key, 0.0);
}

DTRAIN_INLINE void Checkpoint::refuse_in_worker(const char* call) const {
  if (in_worker_)
    throw ConfigError(std::string("checkpoint ") + path_.string() + ": " + call +
                      " on the checkpoint ctx.get_checkpoint() returned; in a train loop restore through "
                      "the context: ctx.restore(*ck, model, optimizer) (or ctx.restore(*ck, model)), which "
                      "loads through the Strategy and restores this rank's generator");
}
}  // namespace checkpointer
DTRAIN_NAMESPACE_END
