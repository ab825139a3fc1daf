// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of collective.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/collective.hpp>

DTRAIN_NAMESPACE_BEGIN

DTRAIN_INLINE std::array<std::int64_t, CollectiveCall::words> CollectiveCall::encode() const {
  return {static_cast<std::int64_t>(operation), argument, static_cast<std::int64_t>(dtype), count,
          static_cast<std::int64_t>(seq)};
}

DTRAIN_INLINE CollectiveCall CollectiveCall::decode(const std::int64_t* w) {
  return {static_cast<op>(w[0]), w[1], static_cast<c10::ScalarType>(w[2]), w[3], static_cast<std::uint64_t>(w[4])};
}

DTRAIN_INLINE std::string CollectiveCall::describe() const {
  static constexpr const char* reductions[] = {"sum", "mean", "max", "min"};
  std::string s;
  switch (operation) {
    case op::allreduce: s = "allreduce"; break;
    case op::broadcast: s = "broadcast"; break;
    case op::allgather: s = "allgather"; break;
    case op::reduce_scatter: s = "reduce_scatter"; break;
    case op::barrier: s = "barrier"; break;
    default: s = "an unknown collective (code " + std::to_string(static_cast<std::int64_t>(operation)) + ")";
  }
  if ((operation == op::allreduce || operation == op::reduce_scatter) && argument >= 0 && argument < 4)
    s += std::string("(") + reductions[argument] + ")";
  if (operation == op::broadcast) s += " from rank " + std::to_string(argument);
  if (operation != op::barrier)
    s += " of " + std::to_string(count) + " " + c10::toString(dtype) + (count == 1 ? " value" : " values");
  return s + " (collective #" + std::to_string(seq) + ")";
}

DTRAIN_INLINE void verify_same_call(int rank, const CollectiveCall& mine, const std::int64_t* all, int world) {
  for (int r = 0; r < world; ++r) {
    const auto theirs = CollectiveCall::decode(all + r * CollectiveCall::words);
    if (theirs == mine) continue;
    throw CollectiveMismatch("collectives do not match: rank " + std::to_string(rank) + " called " + mine.describe() +
                             " while rank " + std::to_string(r) + " called " + theirs.describe() +
                             ". Every rank must issue the same collectives (operation, dtype, element count) in "
                             "the same order; look for a collective inside a branch on the rank or on data that "
                             "differs between ranks");
  }
}

DTRAIN_INLINE Work::Work(std::shared_future<void> done, std::function<void()> help, std::string what)
    : done_(std::move(done)), help_(std::move(help)), what_(std::move(what)) {
  detail::note_progress();
}

DTRAIN_INLINE void Work::wait() {
  if (verify_) {
    try {
      if (exchange_) exchange_->wait();
    } catch (const std::exception& e) {
      throw WorkerError(what_ + " failed while the ranks exchanged their calls: " + e.what() +
                        " (a peer died or hung past RunConfig::collective_timeout)");
    }
    exchange_.reset();
    std::exchange(verify_, nullptr)();
  }
  try {
    if (work_) work_->wait();
    if (help_) std::exchange(help_, nullptr)();
    if (done_.valid()) done_.get();
  } catch (const CollectiveMismatch&) {
    work_.reset();
    done_ = {};
    completion_.reset();
    throw;  // it names both calls already
  } catch (const std::exception& e) {
    work_.reset();
    done_ = {};
    completion_.reset();
    throw WorkerError(what_ + " failed: " + e.what() +
                      " (a peer died, hung past RunConfig::collective_timeout, or the ranks "
                      "issued different collectives)");
  }
  work_.reset();
  done_ = {};
  // A device completion's errors name the collective and the rank already.
  if (auto c = std::move(completion_)) c->wait();
  if (then_) std::exchange(then_, nullptr)();
  detail::note_progress();
}

DTRAIN_INLINE bool Work::completed() const {
  return (!exchange_ || exchange_->isCompleted()) && (!work_ || work_->isCompleted()) &&
         (!done_.valid() || done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) &&
         (!completion_ || completion_->completed());
}

DTRAIN_INLINE Work Collectives::unsupported(const char* what) {
  throw Error(std::string("this Backend's communicator has no flat ") + what +
              ", which this Strategy needs (see concept/backend.hpp)");
}

DTRAIN_NAMESPACE_END
