// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of store.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/launch/store.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace launch {

DTRAIN_INLINE Store::Store(std::string addr, int port, std::optional<std::string> secret, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), addr_(std::move(addr)), port_(port), secret_(std::move(secret)) {
  connect();
}

DTRAIN_INLINE c10::intrusive_ptr<Store> Store::host(const std::string& addr, int port, std::optional<std::string> secret,
                                                    std::chrono::milliseconds timeout) {
  auto server = std::make_shared<StoreServer>(addr, port, secret);
  auto s = c10::make_intrusive<Store>(addr, server->port(), std::move(secret), timeout);
  s->server_ = std::move(server);
  return s;
}

DTRAIN_INLINE void Store::set(const std::string& key, const std::vector<std::uint8_t>& value) {
  call(store_wire::writer{}.u8(op(store_wire::op::set)).bytes(key).bytes(bytes(value)), timeout_);
}

DTRAIN_INLINE std::vector<std::uint8_t> Store::get(const std::string& key) {
  const auto b = call(store_wire::writer{}.u8(op(store_wire::op::get)).u32(1).bytes(key).i64(timeout_.count()),
                      timeout_, key);
  return to_vector(fields(b).bytes());
}

DTRAIN_INLINE std::int64_t Store::add(const std::string& key, std::int64_t value) {
  const auto b = call(store_wire::writer{}.u8(op(store_wire::op::add)).bytes(key).i64(value), timeout_);
  return fields(b).i64();
}

DTRAIN_INLINE std::vector<std::uint8_t> Store::compareSet(const std::string& key, const std::vector<std::uint8_t>& expected,
                                                          const std::vector<std::uint8_t>& desired) {
  auto w = store_wire::writer{}.u8(op(store_wire::op::compare_set)).bytes(key).bytes(bytes(expected)).bytes(bytes(desired));
  const auto b = call(w, timeout_);
  return to_vector(fields(b).bytes());
}

DTRAIN_INLINE bool Store::deleteKey(const std::string& key) {
  const auto b = call(store_wire::writer{}.u8(op(store_wire::op::erase)).bytes(key), timeout_);
  return fields(b).u8() != 0;
}

DTRAIN_INLINE bool Store::check(const std::vector<std::string>& keys) {
  store_wire::writer w;
  w.u8(op(store_wire::op::check)).u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) w.bytes(k);
  const auto b = call(w, timeout_);
  return fields(b).u8() != 0;
}

DTRAIN_INLINE std::int64_t Store::getNumKeys() {
  const auto b = call(store_wire::writer{}.u8(op(store_wire::op::num_keys)), timeout_);
  return fields(b).i64();
}

DTRAIN_INLINE void Store::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  store_wire::writer w;
  w.u8(op(store_wire::op::wait)).u32(static_cast<std::uint32_t>(keys.size()));
  std::string names;
  for (const auto& k : keys) w.bytes(k), names += (names.empty() ? "" : ", ") + k;
  w.i64(timeout.count());
  call(w, timeout, names);
}

DTRAIN_INLINE std::string Store::call(const store_wire::writer& request, std::chrono::milliseconds wait,
                                      const std::string& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) throw std::runtime_error("dtrain store: the connection to " + where() + " was lost before");
  send_all(request.frame());
  const auto limit = wait.count() > 0 ? wait + std::chrono::milliseconds(5000) : std::chrono::milliseconds(0);
  const auto len = store_wire::reader{recv_exact(4, limit)}.u32();
  if (len < 1 || len > store_wire::max_frame) fail("a malformed reply");
  auto body = recv_exact(len, limit);
  store_wire::reader r{body};
  const auto s = static_cast<store_wire::status>(r.u8());
  if (s == store_wire::status::timeout)
    TORCH_CHECK(false, "dtrain store: wait for key(s) ", keys, " at ", where(), " timed out after ", wait.count(), " ms");
  if (s != store_wire::status::ok) TORCH_CHECK(false, "dtrain store at ", where(), ": ", r.bytes());
  return body;
}

DTRAIN_INLINE void Store::fail(const std::string& what) {
if (fd_ >= 0) ::close(fd_);
fd_ = -1;
throw std::runtime_error("dtrain store: " + what + " from " + where() + "; the store's host may have ended");
}

DTRAIN_INLINE void Store::send_all(const std::string& data) {
  std::size_t sent = 0;
  while (sent < data.size()) {
    const auto n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(std::string("cannot send (") + std::strerror(errno) + ")");
    sent += static_cast<std::size_t>(n);
  }
}

DTRAIN_INLINE std::string Store::recv_exact(std::size_t n, std::chrono::milliseconds limit) {
  std::string out(n, '\0');
  std::size_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (got < n) {
    int ms = -1;
    if (limit.count() > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) fail("no reply within " + std::to_string(limit.count()) + " ms");
      ms = static_cast<int>(std::min<long long>(left.count(), 1 << 30));
    }
    pollfd p{fd_, POLLIN, 0};
    const int rc = ::poll(&p, 1, ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) continue;  // the deadline check above ends it
    const auto r = ::recv(fd_, out.data() + got, n - got, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) fail("the connection closed");
    got += static_cast<std::size_t>(r);
  }
  return out;
}

DTRAIN_INLINE std::optional<std::string> Store::try_connect(std::chrono::milliseconds left) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(addr_.c_str(), std::to_string(port_).c_str(), &hints, &found); rc != 0)
    return std::string("the address does not resolve (") + ::gai_strerror(rc) + ")";
  std::string why = "no address";
  for (auto* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) fd_ = fd;
    else why = std::strerror(errno), ::close(fd);
  }
  ::freeaddrinfo(found);
  if (fd_ < 0) return why;
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  try {
    const auto limit = std::clamp(left, std::chrono::milliseconds(1), std::chrono::milliseconds(10000));
    const auto hello = recv_exact(store_wire::hello_bytes, limit);
    if (hello.compare(0, sizeof store_wire::magic, store_wire::magic, sizeof store_wire::magic) != 0)
      throw RendezvousError("the process listening at " + where() + " is not dtrain's rendezvous store (a "
                            "c10d TCPStore, or another program): check MASTER_ADDR and MASTER_PORT");
    if ((hello[sizeof store_wire::magic] & store_wire::flag_secret_required) && !secret_)
      throw RendezvousError("the rendezvous store at " + where() + " requires the run secret and this process has "
                            "none: set DTRAIN_RUN_SECRET or DTRAIN_RUN_SECRET_FILE as for every process of the run "
                            "(docs/security.md)");
    const auto p = store_wire::proof(secret_, hello.substr(sizeof store_wire::magic + 1));
    send_all(std::string(p.begin(), p.end()));
    if (recv_exact(1, limit)[0] != store_wire::accepted)
      throw RendezvousError("the rendezvous store at " + where() + " refused this process: its run secret differs "
                            "from the store's (DTRAIN_RUN_SECRET or DTRAIN_RUN_SECRET_FILE must give every process "
                            "of the run the same secret; docs/security.md)");
    return std::nullopt;
  } catch (const RendezvousError&) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    throw;
  } catch (const std::exception& e) {  // closed in the handshake (a busy server): try again
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return std::string(e.what());
  }
}

DTRAIN_INLINE void Store::connect() {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  auto pause = std::chrono::milliseconds(10);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const auto why = try_connect(left);
    if (!why) return;
    if (std::chrono::steady_clock::now() + pause > deadline)
      throw std::runtime_error("could not reach the rendezvous store at " + where() + " within " +
                            std::to_string(timeout_.count()) + " ms (" + *why + ")");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}
}  // namespace launch
DTRAIN_NAMESPACE_END
