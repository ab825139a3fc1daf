// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of rendezvous.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/launch/rendezvous.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace launch {

DTRAIN_INLINE void check_local_address(const std::string& addr) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(addr.c_str(), nullptr, &hints, &found); rc != 0)
    throw RendezvousError("MASTER_ADDR=" + addr + " cannot be resolved (" + ::gai_strerror(rc) +
                          "); set it to this host's name or address (or 127.0.0.1), or unset it");
  bool local = false;
  for (auto* a = found; a != nullptr && !local; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    // Port 0: binding only asks whether the address is one of this host's.
    if (a->ai_family == AF_INET) reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_port = 0;
    if (a->ai_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_port = 0;
    local = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (!local)
    throw RendezvousError("MASTER_ADDR=" + addr + " is not reachable as an address of this host, which hosts the "
                          "rendezvous store (dtrain's driver, or rank 0 under torchrun, Slurm or Open MPI); set it "
                          "to this host's name or address, or unset it");
}

DTRAIN_INLINE bool name_resolves_to_loopback(const std::string& addr) {
  in6_addr literal{};
  if (::inet_pton(AF_INET, addr.c_str(), &literal) == 1 || ::inet_pton(AF_INET6, addr.c_str(), &literal) == 1)
    return false;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(addr.c_str(), nullptr, &hints, &found) != 0) return false;
  bool all = found != nullptr;
  for (auto* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET)
      all = all && (ntohl(reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    else if (a->ai_family == AF_INET6)
      all = all && IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
  }
  ::freeaddrinfo(found);
  return all;
}

DTRAIN_INLINE c10::intrusive_ptr<Store> host_store(const std::string& addr, int port, std::chrono::milliseconds timeout,
                                                   std::optional<std::string> secret) {
  if (port < 0 || port > 65535)
    throw ConfigError("MASTER_PORT=" + std::to_string(port) + " is not a port (1-65535)");
  check_local_address(addr);
  return Store::host(addr, port, std::move(secret), timeout);
}

DTRAIN_INLINE c10::intrusive_ptr<c10d::Store> store_client(const WorkerIdentity& w, std::chrono::milliseconds timeout) {
  try {
    if (!w.store_on_agent) return c10::make_intrusive<Store>(w.master_addr, w.master_port, run_secret_from_environment(), timeout);
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(w.master_port);
    o.isServer = false;
    o.waitWorkers = false;
    o.timeout = timeout;
    QuietC10dLog quiet;
    return c10::make_intrusive<c10d::TCPStore>(w.master_addr, o);
  } catch (const ConfigError&) {  // a bad secret file
    throw;
  } catch (const RendezvousError&) {  // not dtrain's store there, or it refused this process's secret
    throw;
  } catch (const std::exception& e) {
    throw RendezvousError("rank " + std::to_string(w.rank) + " could not reach the rendezvous store at " +
                          w.master_addr + ":" + std::to_string(w.master_port) + " within " +
                          std::to_string(timeout.count()) + " ms (" + std::string(e.what()).substr(0, 300) +
                          "); check MASTER_ADDR and MASTER_PORT and that rank 0 is running");
  }
}

DTRAIN_INLINE c10::intrusive_ptr<c10d::Store> connect_store(const WorkerIdentity& w,
                                                            std::chrono::milliseconds timeout) {
  if (!w.store_on_driver && !w.store_on_agent && w.rank == 0) {
    auto secret = run_secret_from_environment();
    if (!secret && w.local_world_size < w.world_size)
      std::fprintf(stderr, "dtrain: the rendezvous store at %s:%d admits any client that reaches it: set "
                   "DTRAIN_RUN_SECRET_FILE (or DTRAIN_RUN_SECRET) for every process of a run across hosts "
                   "(docs/security.md)\n", w.master_addr.c_str(), w.master_port);
    // Debian's /etc/hosts names the host 127.0.1.1: the other hosts resolve the name to its network
    // address, and reach the store there only if it listens on every address, as c10d's did.
    // (An address, 127.0.0.1 itself, is taken as written: it is what the other ranks were given.)
    std::string listen_on = w.master_addr;
    if (w.local_world_size < w.world_size && name_resolves_to_loopback(w.master_addr)) {
      std::fprintf(stderr, "dtrain: MASTER_ADDR=%s is a loopback address on this host while ranks run on other "
                   "hosts: the rendezvous store listens on every address of this host; name this host's network "
                   "address in MASTER_ADDR (or in /etc/hosts) to keep it to one (docs/security.md)\n",
                   w.master_addr.c_str());
      listen_on = "0.0.0.0";
    }
    return host_store(listen_on, w.master_port, timeout, std::move(secret));
  }
  return store_client(w, timeout);
}

DTRAIN_INLINE void rendezvous(c10d::Store& store, const WorkerIdentity& w, std::chrono::milliseconds timeout) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host;
  const auto holder = store.compareSet(key(w.attempt, "arrived/" + std::to_string(w.rank)), {}, to_bytes(me));
  if (std::string(holder.begin(), holder.end()) != me)
    throw RankTaken("rank " + std::to_string(w.rank) + " of this run is already held by " +
                    std::string(holder.begin(), holder.end()) + ", so this process (" + me +
                    ") leaves the run alone: two processes were started with RANK=" + std::to_string(w.rank) +
                    ", or one of another run shares this run's secret and MASTER_PORT (give each run its own)");
  store.add(key(w.attempt, "arrived"), 1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(200);
  while (store.add(key(w.attempt, "arrived"), 0) < w.world_size) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::string missing;
      for (int r = 0; r < w.world_size; ++r)
        if (!store.check({key(w.attempt, "arrived/" + std::to_string(r))}))
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      throw RendezvousError("rendezvous incomplete after " + std::to_string(timeout.count()) +
                            " ms: rank(s) " + missing + " of world size " +
                            std::to_string(w.world_size) +
                            " never arrived; check that every worker was started and reaches "
                            "fit(), or raise RunConfig::rendezvous_timeout");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}
}  // namespace launch
DTRAIN_NAMESPACE_END
