// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of group.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/launch/group.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace launch {

DTRAIN_INLINE Group::Group(const WorkerIdentity& who, c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds timeout,
                           std::chrono::milliseconds heartbeat_timeout,
                           std::chrono::milliseconds progress_timeout)
    : who_(who), store_(std::move(store)), timeout_(timeout),
      heartbeat_(std::make_unique<Heartbeat>(who, *store_, heartbeat_timeout, progress_timeout)) {}

DTRAIN_INLINE void Group::arrive(const std::string& name, const std::string& what, std::int64_t reports, bool finishing) const {
  const auto k = key(name);
  store_->add(k, 1);
  wait_until([&] { return store_->add(k, 0) >= who_.world_size; }, what, reports, finishing);
}

DTRAIN_INLINE void Group::await_decision(const std::string& name, const std::string& what) const {
  const auto k = key(name);
  wait_until([&] { return store_->check({k}); }, what, -1, false);
}

DTRAIN_INLINE void Group::check_errors(const std::string& what) const {
  if (store_->add(key("errors"), 0) > 0)
    throw WorkerError("another rank failed while rank " + std::to_string(who_.rank) + " waited at " + what);
}

DTRAIN_INLINE void Group::check_peers(const std::string& what, std::int64_t reports) const {
  check_errors(what);
  heartbeat_->watch(*store_, what);
  for (int r = 0; r < who_.world_size; ++r) {
    const auto fk = key(finished_key(r));
    if (r == who_.rank || !store_->check({fk})) continue;
    const auto n = std::stoll(to_string(store_->get(fk)));
    if (reports < 0 || n < reports)
      throw WorkerError("rank " + std::to_string(r) + " returned from the train loop after " + std::to_string(n) +
                        " report() calls while rank " + std::to_string(who_.rank) + " waits at " + what +
                        "; every rank must make the same report() calls and collectives");
  }
}

DTRAIN_INLINE void Group::finish(std::int64_t reports) const {
  store_->set(key(finished_key(who_.rank)), to_bytes(std::to_string(reports)));
  arrive("finished", "the end of the train loop", reports, /*finishing=*/true);
  for (int r = 0; r < who_.world_size; ++r) {
    const auto n = std::stoll(to_string(store_->get(key(finished_key(r)))));
    if (n != reports)
      throw WorkerError("rank " + std::to_string(r) + " called report() " + std::to_string(n) + " times and rank " +
                        std::to_string(who_.rank) + " " + std::to_string(reports) +
                        " times; every rank must call report() equally often");
  }
}
}  // namespace launch
DTRAIN_NAMESPACE_END
