// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of model_config.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/checkpointer/model_config.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace checkpointer {

DTRAIN_INLINE std::optional<SavedModelConfig> SavedModelConfig::of(const Checkpoint& checkpoint) {
  const auto path = checkpoint.path() / files::model_config;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  const std::string text = detail::read_text(path);
  try {
    const auto j = nlohmann::json::parse(text);
    if (j.at("format").get<int>() != 1) throw ConfigError("format " + j.at("format").dump() + " is not 1");
    return SavedModelConfig{j.at("model").get<std::string>(), j.at("config")};
  } catch (const std::exception& e) {
    throw ConfigError(path.string() + " is malformed (" + e.what() +
                      "); it holds {\"format\": 1, \"model\": type, \"config\": {...}} as ctx.checkpoint() wrote it");
  }
}
}  // namespace checkpointer
DTRAIN_NAMESPACE_END
