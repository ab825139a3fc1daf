// SPDX-License-Identifier: Apache-2.0
#pragma once
// The server of dtrain's rendezvous store: one thread, poll(), listening on exactly the address it
// is given (LibTorch 1.13's TCPStore listens on every address, IPv4 and IPv6). With a run secret,
// a connection's requests count only once it has proved the secret (store_wire.hpp); one that
// cannot, or sends what is no handshake, or stalls in it, is closed and named on stderr
// (address:port), and the run goes on. At most `max_unproven` connections wait in the handshake at
// once: a new one closes the oldest, so a flood of idle connections cannot keep a worker out.

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/error.hpp>
#include <dtrain/launch/store_wire.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

class StoreServer {
 public:
  static constexpr std::size_t max_unproven = 64;
  static constexpr std::chrono::milliseconds handshake_timeout{5000};
  static constexpr int refusals_logged = 20;

  /// Listens on `addr`:`port` (0: the kernel picks); `secret` empty: every client counts. Throws
  /// RendezvousError naming the port when it cannot listen there.
  StoreServer(const std::string& addr, int port, std::optional<std::string> secret);
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  ~StoreServer();

  int port() const { return port_; }
  /// Connections refused so far (a wrong or missing proof, garbage, a stalled handshake, too many).
  int refused() const { return refused_.load(); }

 private:
  using clock = std::chrono::steady_clock;
  struct Conn {
    int fd = -1;
    std::string peer, nonce, in, out;
    bool proven = false;
    clock::time_point since;
    // A get or wait that waits for keys: the keys, the deadline (max: none), whether to reply the value.
    std::vector<std::string> waiting;
    clock::time_point deadline = clock::time_point::max();
    bool wants_value = false;
    bool closing = false;  // close once `out` is sent
  };

  void serve();

  int poll_ms() const;

  void refuse(const std::string& peer, const std::string& why);

  void accept_all();

  bool flush(Conn& c);

  bool read_from(Conn& c);

  // Runs every complete request in `c.in`, unless one waits for keys.
  bool serve_requests(Conn& c);

  template <class Fill>
  void reply(Conn& c, store_wire::status s, Fill&& fill) {
    store_wire::writer w;
    w.u8(static_cast<std::uint8_t>(s));
    fill(w);
    c.out += w.frame();
  }

  static std::int64_t to_int(const std::string& v, const std::string& key);

  void handle(Conn& c, const std::string& body);

  // Replies to `c`'s get or wait when its keys are all there; true when it did.
  bool answer_if_ready(Conn& c);

  void wake_waiters();

  // False when `c` is to be closed: a handshake that stalled. A wait past its deadline is answered.
  bool expire(Conn& c);

  std::optional<std::string> secret_;
  int listen_fd_ = -1, port_ = 0;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  std::atomic<int> refused_{0};
  std::list<Conn> conns_;
  std::map<std::string, std::string> data_;
  std::thread thread_;
};

}  // namespace launch

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/launch/impl/store_server.ipp>
#endif
