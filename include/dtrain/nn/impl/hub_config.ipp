// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of hub_config.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/nn/hub_config.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {
namespace detail {

DTRAIN_INLINE std::pair<nlohmann::json, std::string> read_hub_json(const std::filesystem::path& path, const std::string& name) {
  std::error_code ec;
  // A directory, or a path that is not there and is not named like a file: the directory's `name`.
  const bool directory = std::filesystem::is_directory(path, ec) ||
                         (!std::filesystem::exists(path, ec) && path.extension() != ".json");
  const auto file = directory ? path / name : path;
  std::ifstream in(file);
  if (!in)
    throw ConfigError(file.string() + ": cannot be read; a Hugging Face model directory has its " + name +
                      " beside model.safetensors");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return {nlohmann::json::parse(text.str()), file.string()};
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(file.string() + ": not JSON (" + e.what() + ")");
  }
}

DTRAIN_INLINE void write_hub_labels(nlohmann::json& j, const std::vector<std::string>& id2label) {
  j["id2label"] = nlohmann::json::object();
  j["label2id"] = nlohmann::json::object();
  for (std::size_t i = 0; i < id2label.size(); ++i) {
    j["id2label"][std::to_string(i)] = id2label[i];
    j["label2id"][id2label[i]] = i;
  }
}
}  // namespace detail
}  // namespace nn
DTRAIN_NAMESPACE_END
