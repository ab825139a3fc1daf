// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of hub_config.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <algorithm>

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
DTRAIN_INLINE void HubJsonReader::take(const char* key, std::int64_t& field, bool required) {
  used.emplace_back(key);
  if (!j.contains(key) || j[key].is_null()) {
    if (required) throw fail(std::string("\"") + key + "\" is missing; the model's config.json names its sizes");
    return;
  }
  if (!j[key].is_number_integer()) throw fail(std::string("\"") + key + "\" is " + j[key].dump() + ", which is not an integer");
  field = j[key].get<std::int64_t>();
}

DTRAIN_INLINE void HubJsonReader::take(const char* key, double& field) {
  used.emplace_back(key);
  if (!j.contains(key) || j[key].is_null()) return;
  if (!j[key].is_number()) throw fail(std::string("\"") + key + "\" is " + j[key].dump() + ", which is not a number");
  field = j[key].get<double>();
}

DTRAIN_INLINE void HubJsonReader::take(const char* key, bool& field) {
  used.emplace_back(key);
  if (!j.contains(key) || j[key].is_null()) return;
  if (!j[key].is_boolean()) throw fail(std::string("\"") + key + "\" is " + j[key].dump() + ", which is not true or false");
  field = j[key].get<bool>();
}

DTRAIN_INLINE void HubJsonReader::take(const char* key, std::string& field) {
  used.emplace_back(key);
  if (!j.contains(key) || j[key].is_null()) return;
  if (!j[key].is_string()) throw fail(std::string("\"") + key + "\" is " + j[key].dump() + ", which is not a string");
  field = j[key].get<std::string>();
}

DTRAIN_INLINE void HubJsonReader::take(const char* key, std::optional<std::int64_t>& field) {
  used.emplace_back(key);
  if (!j.contains(key) || j[key].is_null()) return field.reset();
  if (!j[key].is_number_integer()) throw fail(std::string("\"") + key + "\" is " + j[key].dump() + ", which is not an integer id");
  field = j[key].get<std::int64_t>();
}

DTRAIN_INLINE void HubJsonReader::take(const char* key, std::vector<std::int64_t>& field) {
  used.emplace_back(key);
  field.clear();
  if (!j.contains(key) || j[key].is_null()) return;
  const auto& v = j[key];
  const auto bad = [&] { return fail(std::string("\"") + key + "\" is " + v.dump() + ", which is not an id or a list of ids"); };
  if (v.is_number_integer()) return field.push_back(v.get<std::int64_t>());
  if (!v.is_array()) throw bad();
  for (const auto& id : v) {
    if (!id.is_number_integer()) throw bad();
    field.push_back(id.get<std::int64_t>());
  }
}

DTRAIN_INLINE nlohmann::json HubJsonReader::rest() const {
  nlohmann::json extra = nlohmann::json::object();
  static const char* const written[] = {"_name_or_path", "architectures", "transformers_version", "model_type",
                                        "torch_dtype", "dtype"};
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    if (std::find(used.begin(), used.end(), key) == used.end() &&
        std::none_of(std::begin(written), std::end(written), [&](const char* w) { return key == w; }))
      extra[key] = item.value();
  }
  return extra;
}

DTRAIN_INLINE void HubJsonReader::at_least(const char* key, std::int64_t value, std::int64_t least) const {
  if (value < least)
    throw fail(std::string("\"") + key + "\" is " + std::to_string(value) + "; it must be at least " + std::to_string(least));
}

DTRAIN_INLINE nlohmann::json ids_json(const std::vector<std::int64_t>& ids) {
  if (ids.empty()) return nullptr;
  if (ids.size() == 1) return ids.front();
  return ids;
}

}  // namespace detail
}  // namespace nn
DTRAIN_NAMESPACE_END
