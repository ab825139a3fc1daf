// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of write.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/checkpointer/write.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace checkpointer {
namespace detail {

DTRAIN_INLINE void check_user_name(const std::string& name, const char* call) {
  bool ok = !name.empty() && name.size() <= 200 && name[0] != '.';
  for (const char c : name)
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                c == '-');
  if (!ok)
    throw ConfigError(std::string(call) + ": \"" + name +
                      "\" cannot name a file in a checkpoint; use 1 to 200 letters, digits, '.', '_' or '-', "
                      "not starting with '.' (e.g. \"vocab.txt\")");
}
}  // namespace detail

DTRAIN_INLINE Snapshot& Snapshot::with_file(const std::string& name, const std::filesystem::path& source) & {
  detail::check_user_name(name, "with_file");
  if (user_files.count(name)) throw ConfigError("with_file: \"" + name + "\" is added twice to one checkpoint");
  if (!has_model) return *this;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(source, ec))
    throw ConfigError("with_file(\"" + name + "\", \"" + source.string() +
                      "\"): not a regular file; pass the path of the file to save in the checkpoint");
  user_files.emplace(name, detail::read_text(source));
  return *this;
}

namespace detail {

DTRAIN_INLINE std::string sharded_optimizer_marker(int world_size) {
  torch::serialize::OutputArchive archive;
  archive.write(sharded_optimizer_key, torch::tensor(static_cast<std::int64_t>(world_size)));
  std::ostringstream os;
  archive.save_to(os);
  return os.str();
}

DTRAIN_INLINE void write_rank_file(const std::filesystem::path& tmp, int rank, const Snapshot& s) {
  const auto gen = s.generator.contiguous();
  nlohmann::json j = {{"rank", rank},
                      {"epoch", s.epoch},
                      {"position", s.position},
                      {"offset", s.offset},
                      {"samples", s.samples},
                      {"rng", to_hex(gen.data_ptr<std::uint8_t>(), static_cast<std::size_t>(gen.numel()))}};
  if (s.cuda_generator.defined()) {
    const auto cuda = s.cuda_generator.contiguous();
    j["cuda_rng"] = to_hex(cuda.data_ptr<std::uint8_t>(), static_cast<std::size_t>(cuda.numel()));
  }
  write_file(tmp / files::rank(rank), j.dump());
  if (s.sharded_optimizer) write_file(tmp / files::rank_optimizer(rank), s.optimizer);
}
}  // namespace detail
}  // namespace checkpointer
DTRAIN_NAMESPACE_END
