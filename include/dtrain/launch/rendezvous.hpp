// SPDX-License-Identifier: Apache-2.0
#pragma once
// Rendezvous over dtrain's store (store.hpp; c10d's TCPStore under torchrun, whose agent hosts
// it): the driver (or rank 0) hosts it; every worker announces itself and waits for the rest, with
// a deadline and an error that names the ranks that never came.

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <dtrain/error.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/store.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

inline std::vector<std::uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }
inline std::string to_string(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

/// The store keys of one attempt (a restart gets fresh keys).
inline std::string key(int attempt, const std::string& name) {
  return "dtrain/" + std::to_string(attempt) + "/" + name;
}

/// Throws RendezvousError unless `addr` (MASTER_ADDR) resolves to an address of this host: the
/// process hosting the store reaches it there, and an address of another machine would only time
/// out (after the rendezvous timeout, blaming the port).
void check_local_address(const std::string& addr);

/// Whether `addr` is a host name (not an address) that resolves to loopback addresses only
/// (127.0.0.0/8, ::1) here.
bool name_resolves_to_loopback(const std::string& addr);

/// While it lives, c10's log level lets only fatal messages through: c10d logs a failed bind or
/// connect (two warnings and an error, through glog) before it throws, and dtrain's error then
/// says it all, naming the port and the fix. c10d's messages obey FLAGS_caffe2_log_level in
/// LibTorch 1.13 and 2.x alike (a plain int there when c10 is built without gflags). Left alone
/// when TORCH_CPP_LOG_LEVEL is set: whoever set it wants c10's messages.
class QuietC10dLog {
 public:
  QuietC10dLog() : saved_(::FLAGS_caffe2_log_level) {
    if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) ::FLAGS_caffe2_log_level = 3;  // FATAL
  }
  ~QuietC10dLog() { ::FLAGS_caffe2_log_level = saved_; }
  QuietC10dLog(const QuietC10dLog&) = delete;
  QuietC10dLog& operator=(const QuietC10dLog&) = delete;

 private:
  int saved_;
};

/// Hosts dtrain's store (store.hpp) on `port` (0: a free port the kernel picks) at exactly `addr`,
/// which must be this host's; with a `secret`, only clients that prove it count. Throws
/// RendezvousError when the port cannot be listened on, naming it.
c10::intrusive_ptr<Store> host_store(const std::string& addr, int port, std::chrono::milliseconds timeout,
                                     std::optional<std::string> secret = std::nullopt);

/// A new client connection to the run's store: c10d's TCPStore when torchrun's agent hosts it
/// (the agent's store is c10d's: dtrain cannot add a secret to it; docs/security.md), dtrain's own
/// store otherwise, proving the run secret the environment gives (DTRAIN_RUN_SECRET or
/// DTRAIN_RUN_SECRET_FILE) when it gives one.
c10::intrusive_ptr<c10d::Store> store_client(const WorkerIdentity& w, std::chrono::milliseconds timeout);

/// The store this worker uses: a client of the driver's or of torchrun's agent's (its static
/// rendezvous hosts one on MASTER_PORT), or under another launcher hosted by rank 0 at
/// MASTER_ADDR:MASTER_PORT as torch's env:// does (dtrain's store, bound to that address only).
c10::intrusive_ptr<c10d::Store> connect_store(const WorkerIdentity& w,
                                              std::chrono::milliseconds timeout);

/// Claims this rank and waits until all `world_size` ranks have, or throws RendezvousError naming
/// the ranks that did not arrive within `timeout`. A rank is claimed once: a second process with the
/// same rank is refused (RankTaken), naming the process that holds it, and the run goes on.
void rendezvous(c10d::Store& store, const WorkerIdentity& w, std::chrono::milliseconds timeout);

}  // namespace launch

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/launch/impl/rendezvous.ipp>
#endif
