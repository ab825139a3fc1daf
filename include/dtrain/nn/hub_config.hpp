// SPDX-License-Identifier: Apache-2.0
#pragma once
// What every Hugging Face model family here (BERT, ViT, CLIP, Llama, GPT-2) shares about reading a
// model directory's config.json: the file itself, a reader of its keys with errors that name file,
// key and value, and its labels (id2label, label2id, num_labels) read and written as transformers'
// PretrainedConfig does.

#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

namespace detail {

/// The JSON of `path`: a Hugging Face model directory's `name` (config.json) or that file itself.
/// Returns the object and the file's path (for errors). ConfigError naming the file when it
/// cannot be read or is not JSON.
std::pair<nlohmann::json, std::string> read_hub_json(const std::filesystem::path& path, const std::string& name);

/// config.json's labels: id2label ({"0": "neg", ...}, ids 0..n-1), else num_labels (LABEL_0 ...),
/// else `fallback`; label2id, where present, must be id2label's inverse and num_labels its size.
/// `fail(what)` makes the exception (naming the file).
template <class Fail>
std::vector<std::string> read_hub_labels(const nlohmann::json& j, std::vector<std::string> fallback, const Fail& fail) {
  std::vector<std::string> id2label = std::move(fallback);
  if (j.contains("id2label")) {
    const auto& m = j["id2label"];
    if (!m.is_object()) throw fail("\"id2label\" must be an object {\"0\": label, ...}, got " + m.dump());
    std::vector<std::optional<std::string>> labels(m.size());
    for (const auto& [key, value] : m.items()) {
      std::size_t at = 0;
      std::int64_t id = -1;
      try {
        id = std::stoll(key, &at);
      } catch (const std::exception&) {
      }
      if (at != key.size() || id < 0 || id >= static_cast<std::int64_t>(m.size()) || !value.is_string() ||
          labels[static_cast<std::size_t>(id)])
        throw fail("\"id2label\" must map the ids 0.." + std::to_string(m.size() - 1) + " to label names; \"" + key +
                   "\": " + value.dump() + " does not");
      labels[static_cast<std::size_t>(id)] = value.template get<std::string>();
    }
    id2label.clear();
    for (auto& l : labels) id2label.push_back(*l);  // m.size() distinct ids below m.size(): all present
  } else if (j.contains("num_labels")) {
    if (!j["num_labels"].is_number_integer() || j["num_labels"].template get<std::int64_t>() < 1)
      throw fail("\"num_labels\" is " + j["num_labels"].dump() + "; it must be a positive integer");
    id2label.clear();
    for (std::int64_t i = 0; i < j["num_labels"].template get<std::int64_t>(); ++i) id2label.push_back("LABEL_" + std::to_string(i));
  }
  if (j.contains("label2id")) {
    const auto& m = j["label2id"];
    bool agrees = m.is_object() && m.size() == id2label.size();
    for (std::size_t i = 0; agrees && i < id2label.size(); ++i)
      agrees = m.contains(id2label[i]) && m[id2label[i]].is_number_integer() &&
               m[id2label[i]].template get<std::int64_t>() == static_cast<std::int64_t>(i);
    if (!agrees) throw fail("\"label2id\" " + m.dump() + " is not the inverse of \"id2label\"");
  }
  if (j.contains("num_labels") && j["num_labels"] != static_cast<std::int64_t>(id2label.size()))
    throw fail("\"num_labels\" " + j["num_labels"].dump() + " disagrees with \"id2label\"'s " +
               std::to_string(id2label.size()) + " labels");
  return id2label;
}

/// A config.json key's value read into `field` when present, else the field keeps its default
/// (`required`: a ConfigError). `used` collects the keys read; `fail(what)` makes the error. What
/// every family's config reader shares.
struct HubJsonReader {
  const nlohmann::json& j;
  std::string source;
  std::vector<std::string> used;

  ConfigError fail(const std::string& what) const { return ConfigError(source + ": " + what); }
  void take(const char* key, std::int64_t& field, bool required = false);
  void take(const char* key, double& field);
  void take(const char* key, bool& field);
  void take(const char* key, std::string& field);
  /// An optional id (null or absent: none).
  void take(const char* key, std::optional<std::int64_t>& field);
  /// One id or a list of ids (null or absent: none).
  void take(const char* key, std::vector<std::int64_t>& field);
  /// Keys not read, into `extra` (keys that say what a file was are dropped).
  nlohmann::json rest() const;
  /// ConfigError unless `value` >= `least`.
  void at_least(const char* key, std::int64_t value, std::int64_t least) const;
};

/// One id, or the list, or null: as config.json spells eos_token_id.
nlohmann::json ids_json(const std::vector<std::int64_t>& ids);


/// id2label and label2id written into config.json's object `j`.
void write_hub_labels(nlohmann::json& j, const std::vector<std::string>& id2label);

}  // namespace detail

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/hub_config.ipp>
#endif
