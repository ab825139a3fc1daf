// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of fresh_start.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/launch/fresh_start.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace launch {

DTRAIN_INLINE void start_fresh_under_launcher(c10d::Store& store, const WorkerIdentity& who,
                                              const std::filesystem::path& run_dir, std::chrono::milliseconds timeout) {
  if (who.attempt > 0) return;
  const auto k = key(0, "fresh_start");
  if (who.rank == 0) {
    std::string moved;
    try {
      if (const auto old = RunDirectory(run_dir).move_aside()) moved = old->string();
    } catch (const std::exception& e) {  // the others must not wait for an answer that never comes
      store.set(k, to_bytes("!" + std::string(e.what())));
      throw;
    }
    store.set(k, to_bytes("moved " + moved));
    if (!moved.empty())
      std::fprintf(stderr, "dtrain: a fresh start of %s: the earlier run was moved to %s\n", run_dir.c_str(),
                   moved.c_str());
    return;
  }
  try {
    store.wait({k}, timeout);
  } catch (const std::exception&) {
    throw RendezvousError("rank " + std::to_string(who.rank) + " waited " + std::to_string(timeout.count()) +
                          " ms for rank 0 to move the earlier run " + run_dir.string() +
                          " aside (RunConfig::start = fresh); is rank 0 alive and does it use the same RunConfig?");
  }
  const auto answer = to_string(store.get(k));
  if (!answer.empty() && answer[0] == '!')
    throw ConfigError("rank 0 could not move the earlier run " + run_dir.string() + " aside for a fresh start: " +
                      answer.substr(1));
}
}  // namespace launch
DTRAIN_NAMESPACE_END
