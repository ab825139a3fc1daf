// SPDX-License-Identifier: Apache-2.0
#pragma once
// dtrain's rendezvous store: a c10d::Store whose server (store_server.hpp) listens on exactly one
// address and counts only clients that prove the run secret (store_wire.hpp, docs/security.md).
// ProcessGroupGloo, the hierarchical allreduce and dtrain's own keys use it as they would c10d's
// TCPStore: get() waits until the key exists, up to the store's timeout; wait() too; a timeout
// throws (c10::Error, naming the keys). Under torchrun the store is the agent's TCPStore and
// dtrain's workers are its clients (rendezvous.hpp): that path is not this one.
//
// One connection per Store object; calls from several threads take turns on it (a get() that
// waits holds the connection: a thread that must not wait behind it opens a Store of its own, as
// the heartbeat does).

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <dtrain/error.hpp>
#include <dtrain/launch/store_server.hpp>
#include <dtrain/launch/store_wire.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

class Store : public c10d::Store {
 public:
  /// Connects to the store at `addr`:`port`, retrying until `timeout` (the server may not listen
  /// yet), and proves `secret`. Throws RendezvousError when what listens there is not dtrain's store
  /// or refuses `secret`, std::runtime_error when nothing answers within `timeout`.
  Store(std::string addr, int port, std::optional<std::string> secret, std::chrono::milliseconds timeout);
  /// Hosts the store at `addr`:`port` (0: a free port) and connects to it.
  static c10::intrusive_ptr<Store> host(const std::string& addr, int port, std::optional<std::string> secret,
                                        std::chrono::milliseconds timeout);
  ~Store() override {
    if (fd_ >= 0) ::close(fd_);
  }

  int getPort() const { return port_; }
  const std::string& address() const { return addr_; }
  /// The server this Store hosts (host()), or null.
  const StoreServer* server() const { return server_.get(); }

  void set(const std::string& key, const std::vector<std::uint8_t>& value) override;
  std::vector<std::uint8_t> get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t value) override;
  std::vector<std::uint8_t> compareSet(const std::string& key, const std::vector<std::uint8_t>& expected,
                                       const std::vector<std::uint8_t>& desired) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  std::int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  /// A new connection to the same store. Declared without `override`: LibTorch 2.x's c10d::Store
  /// has a virtual clone() (which this overrides), 1.13's has none (this is then a plain member).
  c10::intrusive_ptr<c10d::Store> clone() { return c10::make_intrusive<Store>(addr_, port_, secret_, timeout_); }

 private:
  static std::uint8_t op(store_wire::op o) { return static_cast<std::uint8_t>(o); }
  static std::string bytes(const std::vector<std::uint8_t>& v) { return {v.begin(), v.end()}; }
  static std::vector<std::uint8_t> to_vector(const std::string& s) { return {s.begin(), s.end()}; }
  std::string where() const { return addr_ + ":" + std::to_string(port_); }

  // The fields of reply `body`, past its status byte.
  static store_wire::reader fields(const std::string& body) { return store_wire::reader{body, 1}; }

  // Sends `request` and returns the reply (an ok status: fields() reads it). A reply that does not come
  // within `wait` (plus a margin for the server's own deadline) throws, as does a timeout the
  // server answers; 0 waits without end, as c10d's kNoTimeout does.
  std::string call(const store_wire::writer& request, std::chrono::milliseconds wait,
                          const std::string& keys = {});

  [[noreturn]] void fail(const std::string& what);

  void send_all(const std::string& data);

  std::string recv_exact(std::size_t n, std::chrono::milliseconds limit);

  // One attempt: connect and do the handshake. Returns an error to retry on, or throws one not to.
  std::optional<std::string> try_connect(std::chrono::milliseconds left);

  void connect();

  std::string addr_;
  int port_;
  std::optional<std::string> secret_;
  int fd_ = -1;
  std::mutex mutex_;
  std::shared_ptr<StoreServer> server_;
};

}  // namespace launch

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/launch/impl/store.ipp>
#endif
