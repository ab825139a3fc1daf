// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of run_directory.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/run_directory.hpp>

DTRAIN_NAMESPACE_BEGIN

DTRAIN_INLINE std::string RunDirectory::experiment_name() const {
  std::error_code ec;
  const auto parent = root_.parent_path();
  return std::filesystem::exists(parent / "tuner.json", ec) ? parent.filename().string() : root_.filename().string();
}

DTRAIN_INLINE void RunDirectory::create() const {
  std::error_code ec;
  std::filesystem::create_directories(root_, ec);
  if (ec || !std::filesystem::is_directory(root_))
    throw ConfigError(root_.string() + ": the run directory cannot be created (" +
                      (ec ? ec.message() : std::string("a file of that name is in the way")) +
                      "); choose a RunConfig::storage_path that is a writable directory");
}

DTRAIN_INLINE std::optional<std::filesystem::path> RunDirectory::move_aside() const {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(root_, ec))) return std::nullopt;
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  const std::string base = root_.filename().string() + ".old-" + stamp;
  auto target = root_.parent_path() / base;
  for (int i = 1; std::filesystem::exists(std::filesystem::symlink_status(target, ec)); ++i)
    target = root_.parent_path() / (base + "-" + std::to_string(i));
  std::filesystem::rename(root_, target, ec);
  if (ec)
    throw ConfigError(root_.string() + ": the earlier run cannot be moved aside to " + target.string() + " (" +
                      ec.message() + ") for a fresh start; move or remove it yourself, or resume it "
                      "(" + start_advice(Start::resume) + ")");
  return target;
}

DTRAIN_INLINE std::string RunDirectory::checkpoint_name(std::int64_t iteration) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "checkpoint_%06lld", static_cast<long long>(iteration));
  return buf;
}

DTRAIN_INLINE std::optional<std::int64_t> RunDirectory::iteration_of(std::string_view dir_name) {
  static constexpr std::string_view prefix = "checkpoint_";
  if (dir_name.size() <= prefix.size() || dir_name.substr(0, prefix.size()) != prefix) return std::nullopt;
  const auto digits = dir_name.substr(prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string_view::npos || digits.size() > 18) return std::nullopt;
  return std::stoll(std::string(digits));
}

DTRAIN_INLINE std::vector<std::pair<std::int64_t, std::filesystem::path>> RunDirectory::checkpoints() const {
  std::vector<std::pair<std::int64_t, std::filesystem::path>> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(root_, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(root_, ec))
    if (auto it = iteration_of(e.path().filename().string()); it && e.is_directory(ec)) out.emplace_back(*it, e.path());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

DTRAIN_INLINE std::string RunDirectory::remove_unfinished_writes() const {
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root_, ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind(temporary_prefix, 0) == 0 ||
        (name.size() > 4 && std::string_view(name).ends_with(".tmp") && e.is_regular_file(ec)))
      found.push_back(e.path());
  }
  std::string removed;
  for (const auto& p : found) {
    std::filesystem::remove_all(p, ec);
    removed += (removed.empty() ? "" : ", ") + p.filename().string();
  }
  return removed;
}

DTRAIN_INLINE void RunDirectory::remove_unfinished_checkpoints() const {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root_, ec))
    if (e.path().filename().string().rfind(temporary_prefix, 0) == 0) std::filesystem::remove_all(e.path(), ec);
}
DTRAIN_NAMESPACE_END
