// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of gloo_peers.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/backend/detail/gloo_peers.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace detail {

DTRAIN_INLINE std::string network_identity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char ns[64] = {};
  const auto n = ::readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  char name[256] = {};
  if (n <= 0) ::gethostname(name, sizeof name - 1);  // no /proc: the host name stands in
  return boot + "/" + (n > 0 ? std::string(ns, static_cast<std::size_t>(n)) : std::string(name));
}

DTRAIN_INLINE bool is_loopback(const ip_address& a) {
  static const ip_address v6_loopback = std::string(15, '\0') + '\1';
  return (a.size() == 4 && static_cast<unsigned char>(a[0]) == 127) || a == v6_loopback;
}

DTRAIN_INLINE std::vector<ip_address> host_addresses() {
  std::vector<ip_address> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (const ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    if (i->ifa_addr->sa_family == AF_INET) {
      const auto& a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
      out.emplace_back(reinterpret_cast<const char*>(&a), 4);
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      const auto& a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr;
      out.emplace_back(reinterpret_cast<const char*>(&a), 16);
    }
  }
  ::freeifaddrs(list);
  return out;
}

DTRAIN_INLINE std::vector<std::pair<ino_t, int>> tcp_listeners() {
  std::vector<std::pair<ino_t, int>> out;
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return out;
  const int own = ::dirfd(dir);
  while (const dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (*end || end == e->d_name || fd == own) continue;
    struct stat st {};
    int listening = 0, domain = 0, protocol = 0;
    socklen_t n = sizeof(int), m = sizeof(int), k = sizeof(int);
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &n) != 0 || !listening) continue;
    if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_DOMAIN, &domain, &m) != 0 ||
        ::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_PROTOCOL, &protocol, &k) != 0)
      continue;
    if ((domain == AF_INET || domain == AF_INET6) && protocol == IPPROTO_TCP) out.emplace_back(st.st_ino, static_cast<int>(fd));
  }
  ::closedir(dir);
  return out;
}

DTRAIN_INLINE std::vector<sock_filter> source_filter(const std::vector<ip_address>& allowed) {
  constexpr std::uint32_t keep = 0xffffffffu, drop = 0;
  constexpr auto ip = static_cast<std::uint32_t>(SKF_NET_OFF);  // where the IP header starts
  const auto word = [](const ip_address& a, std::size_t i) {
    std::uint32_t w = 0;
    for (std::size_t b = 0; b < 4; ++b) w = (w << 8) | static_cast<unsigned char>(a[4 * i + b]);
    return w;
  };
  std::vector<sock_filter> v4, v6;
  for (const auto& a : allowed) {
    if (a.size() == 4) {
      v4.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, word(a, 0), 0, 1));
      v4.push_back(BPF_STMT(BPF_RET | BPF_K, keep));
    } else {  // the 16 bytes at offset 8 of the IPv6 header, a word at a time
      for (std::uint8_t i = 0; i < 4; ++i) {
        v6.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ip + 8 + 4u * i));
        v6.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, word(a, i), 0, static_cast<std::uint8_t>(7 - 2 * i)));
      }
      v6.push_back(BPF_STMT(BPF_RET | BPF_K, keep));
    }
  }
  std::vector<sock_filter> p{
      BPF_STMT(BPF_LD | BPF_B | BPF_ABS, ip),  // the IP version, in the high nibble
      BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xf0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x60, 0, 1),
      BPF_STMT(BPF_JMP | BPF_JA | BPF_K, static_cast<std::uint32_t>(v4.size() + 2)),  // over the IPv4 part
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ip + 12),  // the IPv4 source
  };
  p.insert(p.end(), v4.begin(), v4.end());
  p.push_back(BPF_STMT(BPF_RET | BPF_K, drop));
  p.insert(p.end(), v6.begin(), v6.end());
  p.push_back(BPF_STMT(BPF_RET | BPF_K, drop));
  return p;
}

DTRAIN_INLINE void restrict_sources(int fd, const std::vector<ip_address>& allowed) {
  auto program = source_filter(allowed);
  if (program.size() > BPF_MAXINSNS)
    throw WorkerError("Gloo's group spans " + std::to_string(allowed.size()) + " host addresses, more than a socket "
                      "filter of " + std::to_string(BPF_MAXINSNS) + " instructions can list; run fewer hosts per Gloo group");
  const sock_fprog f{static_cast<unsigned short>(program.size()), program.data()};
  if (::setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &f, sizeof f) != 0)
    throw WorkerError(std::string("could not restrict Gloo's listening socket to the group's hosts "
                                  "(setsockopt SO_ATTACH_FILTER: ") + std::strerror(errno) + ")");
}

DTRAIN_INLINE gloo_peer_guard::gloo_peer_guard(const std::string& prefix, c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                               const std::vector<std::pair<ino_t, int>>& before)
    : c10d::PrefixStore(prefix, std::move(store)), rank_(rank), size_(size) {
  for (const auto& l : before) before_.insert(l.first);
}

DTRAIN_INLINE void gloo_peer_guard::seal() {
  for (const auto& [inode, fd] : tcp_listeners())
    if (!before_.count(inode)) restrict_sources(fd, {});
}

DTRAIN_INLINE void gloo_peer_guard::set(const std::string& key, const std::vector<std::uint8_t>& value) {
  // Gloo announces this rank's listeners under a key whose last part is the rank (1.13: "0/<rank>").
  const auto slash = key.rfind('/');
  if (!guarded_ && key.substr(slash == std::string::npos ? 0 : slash + 1) == std::to_string(rank_)) {
    guard();
    guarded_ = true;
  }
  c10d::PrefixStore::set(key, value);
}

DTRAIN_INLINE void gloo_peer_guard::guard() {
  seal();  // the other ranks may take a while to arrive
  const auto self = network_identity();
  std::string mine = self + '\0';
  for (const auto& a : host_addresses()) mine += static_cast<char>(a.size()) + a;
  c10d::PrefixStore::set("hosts/" + std::to_string(rank_), std::vector<std::uint8_t>(mine.begin(), mine.end()));
  std::set<ip_address> allowed;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const auto v = c10d::PrefixStore::get("hosts/" + std::to_string(r));  // waits for rank r
    const std::string entry(v.begin(), v.end());
    const auto nul = entry.find('\0');
    const bool same_host = entry.substr(0, nul) == self;
    for (std::size_t i = nul + 1; nul != std::string::npos && i < entry.size();) {
      const std::size_t n = static_cast<unsigned char>(entry[i]);
      if ((n != 4 && n != 16) || i + 1 + n > entry.size()) break;
      ip_address a = entry.substr(i + 1, n);
      if (same_host || !is_loopback(a)) allowed.insert(std::move(a));  // another host's loopback is ours
      i += 1 + n;
    }
  }
  allowed_.assign(allowed.begin(), allowed.end());
  for (const auto& [inode, fd] : tcp_listeners())
    if (!before_.count(inode)) restrict_sources(fd, allowed_), ++restricted_;
  if (restricted_ == 0 && size_ > 1)
    std::fprintf(stderr, "dtrain: warning: rank %d found none of Gloo's listening sockets in /proc/self/fd, so its "
                 "connections are not restricted to the group's hosts (docs/security.md)\n", rank_);
}

DTRAIN_INLINE c10::intrusive_ptr<c10d::ProcessGroupGloo> guarded_gloo_group(
    const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size,
    std::chrono::milliseconds timeout, int threads, const std::function<std::shared_ptr<::gloo::transport::Device>()>& make_device) {
  auto guard = c10::make_intrusive<gloo_peer_guard>(prefix, store, rank, size, tcp_listeners());
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(make_device());
  options->threads = threads;
  guard->seal();
  return c10::make_intrusive<c10d::ProcessGroupGloo>(guard, rank, size, options);
}
}  // namespace detail
DTRAIN_NAMESPACE_END
