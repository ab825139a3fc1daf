// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of store_server.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/launch/store_server.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace launch {

DTRAIN_INLINE StoreServer::StoreServer(const std::string& addr, int port, std::optional<std::string> secret) : secret_(std::move(secret)) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &found); rc != 0)
    throw RendezvousError("cannot host the rendezvous store at " + addr + ": the address does not resolve (" +
                          ::gai_strerror(rc) + ")");
  std::string why = "no address";
  for (auto* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 512) == 0) {
      listen_fd_ = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0)
    throw RendezvousError("cannot host the rendezvous store on port " + std::to_string(port) + " at " + addr +
                          ": the port is in use or not ours to take (" + why +
                          "). Choose another MASTER_PORT, or unset it and dtrain picks a free port.");
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(listen_fd_);
    throw RendezvousError(std::string("cannot host the rendezvous store: pipe2 failed: ") + std::strerror(errno));
  }
  thread_ = std::thread([this] { serve(); });
}

DTRAIN_INLINE StoreServer::~StoreServer() {
  stop_ = true;
  (void)!::write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  for (auto& c : conns_) ::close(c.fd);
  ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

DTRAIN_INLINE void StoreServer::serve() {
  std::vector<pollfd> fds;
  while (!stop_) {
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto& c : conns_) fds.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
    ::poll(fds.data(), fds.size(), poll_ms());
    if (stop_) break;
    if (fds[1].revents & POLLIN) accept_all();
    std::size_t i = 2;
    for (auto it = conns_.begin(); it != conns_.end(); ++i) {
      auto& c = *it;
      bool alive = true;
      if (i < fds.size() && fds[i].fd == c.fd) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) alive = read_from(c);
        if (alive && (fds[i].revents & POLLOUT)) alive = flush(c);
      }
      if (alive) alive = expire(c);
      if (!alive) {
        ::close(c.fd);
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

DTRAIN_INLINE int StoreServer::poll_ms() const {
  auto next = clock::time_point::max();
  for (const auto& c : conns_) {
    next = std::min(next, c.deadline);
    if (!c.proven) next = std::min(next, c.since + handshake_timeout);
  }
  if (next == clock::time_point::max()) return 1000;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - clock::now()).count() + 1;
  return static_cast<int>(std::clamp<long long>(ms, 0, 1000));
}

DTRAIN_INLINE void StoreServer::refuse(const std::string& peer, const std::string& why) {
  const int n = ++refused_;
  if (n <= refusals_logged)
    std::fprintf(stderr, "dtrain: the rendezvous store refused a connection from %s: %s; the run goes on%s\n",
                 peer.c_str(), why.c_str(), n == refusals_logged ? " (further refusals are not logged)" : "");
}

DTRAIN_INLINE void StoreServer::accept_all() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;  // EAGAIN, or out of descriptors: the rest wait in the backlog
    const auto peer = store_wire::peer_name(fd);
    const auto unproven = std::count_if(conns_.begin(), conns_.end(), [](const Conn& c) { return !c.proven; });
    if (static_cast<std::size_t>(unproven) >= max_unproven) {  // the oldest goes: a worker that
      auto oldest = std::find_if(conns_.begin(), conns_.end(), [](const Conn& c) { return !c.proven; });
      refuse(oldest->peer, "it waited in the handshake while " + std::to_string(max_unproven) +
                               " others did, and a new connection came");  // connects now gets in
      ::close(oldest->fd);
      conns_.erase(oldest);
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Conn c;
    c.fd = fd;
    c.peer = peer;
    c.since = clock::now();
    c.nonce = store_wire::random_bytes(store_wire::nonce_bytes);
    c.out.assign(store_wire::magic, sizeof store_wire::magic);
    c.out += static_cast<char>(secret_ ? store_wire::flag_secret_required : 0);
    c.out += c.nonce;
    conns_.push_back(std::move(c));
    flush(conns_.back());
  }
}

DTRAIN_INLINE bool StoreServer::flush(Conn& c) {
  while (!c.out.empty()) {
    const auto n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    c.out.erase(0, static_cast<std::size_t>(n));
  }
  return !c.closing;
}

DTRAIN_INLINE bool StoreServer::read_from(Conn& c) {
  char buf[65536];
  for (;;) {
    const auto n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n == 0) {
      if (!c.proven) refuse(c.peer, "it closed the connection before proving the run secret");
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    c.in.append(buf, static_cast<std::size_t>(n));
    if (!c.proven && c.in.size() > store_wire::proof_bytes) {
      refuse(c.peer, "it sent " + std::to_string(c.in.size()) + "+ bytes where a 32-byte proof belongs (not a dtrain client)");
      return false;
    }
    if (c.in.size() > store_wire::max_frame + 4u) break;
  }
  if (!c.proven) {
    if (c.in.size() < store_wire::proof_bytes) return true;
    const auto expected = store_wire::proof(secret_, c.nonce);
    dtrain::detail::sha256_digest got{};
    std::copy(c.in.begin(), c.in.begin() + store_wire::proof_bytes, got.begin());
    c.in.erase(0, store_wire::proof_bytes);
    if (secret_ && !dtrain::detail::digests_equal(got, expected)) {
      refuse(c.peer, "it did not prove the run secret (a process of another run, or no process of a run)");
      c.out += store_wire::refused;
      c.closing = true;
      return flush(c);
    }
    c.proven = true;
    c.out += store_wire::accepted;
  }
  return serve_requests(c) && flush(c);
}

DTRAIN_INLINE bool StoreServer::serve_requests(Conn& c) {
  while (c.waiting.empty() && c.in.size() >= 4) {
    const auto len = store_wire::reader{c.in}.u32();
    if (len > store_wire::max_frame) {
      refuse(c.peer, "it sent a frame of " + std::to_string(len) + " bytes, over the store's limit");
      return false;
    }
    if (c.in.size() < 4u + len) break;
    const std::string body = c.in.substr(4, len);
    c.in.erase(0, 4u + len);
    try {
      handle(c, body);
    } catch (const std::exception& e) {
      reply(c, store_wire::status::error, [&](auto& w) { w.bytes(e.what()); });
    }
  }
  return true;
}

DTRAIN_INLINE std::int64_t StoreServer::to_int(const std::string& v, const std::string& key) {
  std::size_t used = 0;
  std::int64_t n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size()) throw std::runtime_error("add: the value of key " + key + " is not an integer");
  return n;
}

DTRAIN_INLINE void StoreServer::handle(Conn& c, const std::string& body) {
  using store_wire::op;
  store_wire::reader r{body};
  const auto o = static_cast<op>(r.u8());
  auto ok = [&](auto&& fill) { reply(c, store_wire::status::ok, fill); };
  switch (o) {
    case op::set: {
      auto k = r.bytes();
      data_[k] = r.bytes();
      ok([](auto&) {});
      wake_waiters();
      return;
    }
    case op::add: {
      auto k = r.bytes();
      const auto delta = r.i64();
      auto it = data_.find(k);
      const auto v = (it == data_.end() ? 0 : to_int(it->second, k)) + delta;
      data_[k] = std::to_string(v);
      ok([&](auto& w) { w.i64(v); });
      if (it == data_.end()) wake_waiters();
      return;
    }
    case op::compare_set: {
      auto k = r.bytes();
      auto expected = r.bytes(), desired = r.bytes();
      auto it = data_.find(k);
      std::string now;
      if (it == data_.end()) {
        now = expected.empty() ? desired : expected;  // as c10d's TCPStore answers
        if (expected.empty()) data_[k] = desired;
      } else {
        if (it->second == expected) it->second = desired;
        now = it->second;
      }
      ok([&](auto& w) { w.bytes(now); });
      wake_waiters();
      return;
    }
    case op::check: {
      const auto n = r.u32();
      bool all = true;
      for (std::uint32_t i = 0; i < n; ++i) all = data_.count(r.bytes()) > 0 && all;
      ok([&](auto& w) { w.u8(all ? 1 : 0); });
      return;
    }
    case op::get:
    case op::wait: {
      const auto n = r.u32();
      if ((o == op::get && n != 1) || n > 100000) throw std::runtime_error("get or wait: a bad key count");
      for (std::uint32_t i = 0; i < n; ++i) c.waiting.push_back(r.bytes());
      const auto ms = r.i64();
      c.deadline = ms > 0 ? clock::now() + std::chrono::milliseconds(ms) : clock::time_point::max();
      c.wants_value = o == op::get;
      answer_if_ready(c);
      return;
    }
    case op::erase: {
      const bool gone = data_.erase(r.bytes()) > 0;
      ok([&](auto& w) { w.u8(gone ? 1 : 0); });
      return;
    }
    case op::num_keys:
      ok([&](auto& w) { w.i64(static_cast<std::int64_t>(data_.size())); });
      return;
  }
  throw std::runtime_error("unknown request " + std::to_string(static_cast<int>(o)));
}

DTRAIN_INLINE bool StoreServer::answer_if_ready(Conn& c) {
  for (const auto& k : c.waiting)
    if (!data_.count(k)) return false;
  const auto value = c.wants_value ? data_[c.waiting.front()] : std::string();
  reply(c, store_wire::status::ok, [&](auto& w) {
    if (c.wants_value) w.bytes(value);
  });
  c.waiting.clear();
  c.deadline = clock::time_point::max();
  return true;
}

DTRAIN_INLINE void StoreServer::wake_waiters() {
  for (auto& c : conns_)
    if (!c.waiting.empty() && answer_if_ready(c)) {
      serve_requests(c);
      flush(c);
    }
}

DTRAIN_INLINE bool StoreServer::expire(Conn& c) {
  const auto now = clock::now();
  if (!c.proven && now - c.since > handshake_timeout) {
    refuse(c.peer, "it did not finish the handshake within " + std::to_string(handshake_timeout.count()) + " ms");
    return false;
  }
  if (!c.waiting.empty() && now >= c.deadline) {
    std::string keys;
    for (const auto& k : c.waiting) keys += (keys.empty() ? "" : ", ") + k;
    reply(c, store_wire::status::timeout, [&](auto& w) { w.bytes(keys); });
    c.waiting.clear();
    c.deadline = clock::time_point::max();
    return serve_requests(c) && flush(c);
  }
  return true;
}
}  // namespace launch
DTRAIN_NAMESPACE_END
