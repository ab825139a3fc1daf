// SPDX-License-Identifier: Apache-2.0
// Gloo's listeners take connections from the group's hosts only (backend/detail/gloo_peers.hpp):
// the socket filter keeps the allowed sources' connections and drops the others', in IPv4 and IPv6;
// the guard store restricts the listeners that are new when Gloo announces them, to the other
// ranks' hosts (loopback only for a rank in this network namespace); a Gloo group made through it runs.

#include "../dtrain_catch.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include <dtrain/backend/detail/gloo_peers.hpp>
#include <dtrain/launch/store.hpp>

namespace d = dtrain;
using namespace std::chrono_literals;

namespace {

const std::string run_secret = "0123456789abcdef0123456789abcdef";
const std::vector<std::uint8_t> one_byte{1};  // a value (LibTorch 2.x's set() also takes a string: no braces)

d::detail::ip_address v4(const char* text) {
  in_addr a{};
  REQUIRE(::inet_pton(AF_INET, text, &a) == 1);
  return {reinterpret_cast<const char*>(&a), 4};
}
d::detail::ip_address v6(const char* text) {
  in6_addr a{};
  REQUIRE(::inet_pton(AF_INET6, text, &a) == 1);
  return {reinterpret_cast<const char*>(&a), 16};
}

// A listening socket on the loopback address of `family`, port chosen by the kernel.
struct listener {
  int fd = -1;
  sockaddr_storage addr{};
  socklen_t len = 0;
  explicit listener(int family) {
    fd = ::socket(family, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    if (family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      len = sizeof(sockaddr_in);
    } else {
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_loopback;
      len = sizeof(sockaddr_in6);
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 4) != 0) {
      ::close(fd);
      fd = -1;
      return;
    }
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  }
  ~listener() {
    if (fd >= 0) ::close(fd);
  }
  // Whether a connection from loopback completes within `wait` (a dropped SYN never completes).
  bool admits(std::chrono::milliseconds wait) const {
    const int c = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
    (void)::connect(c, reinterpret_cast<const sockaddr*>(&addr), len);
    pollfd p{c, POLLOUT, 0};
    const bool done = ::poll(&p, 1, static_cast<int>(wait.count())) == 1 && (p.revents & POLLOUT);
    int err = 0;
    socklen_t n = sizeof err;
    ::getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &n);
    ::close(c);
    return done && err == 0;
  }
};

// An entry as gloo_peer_guard publishes it: host identity, NUL, then (length, bytes) per address.
std::vector<std::uint8_t> host_entry(const std::string& identity, const std::vector<d::detail::ip_address>& addrs) {
  std::string e = identity + '\0';
  for (const auto& a : addrs) e += static_cast<char>(a.size()) + a;
  return {e.begin(), e.end()};
}

}  // namespace

TEST_CASE("the Gloo socket filter keeps the allowed sources' connections and drops the others', IPv4 and IPv6",
          "[store][gloo][peers]") {
  // Many addresses before the right one: every jump of the program stays in range.
  std::vector<d::detail::ip_address> many;
  for (int i = 1; i < 200; ++i) many.push_back(v4(("192.0.2." + std::to_string(i)).c_str()));
  for (int i = 1; i < 40; ++i) many.push_back(v6(("2001:db8::" + std::to_string(i)).c_str()));

  listener a(AF_INET);
  REQUIRE(a.fd >= 0);
  REQUIRE(a.admits(2000ms));
  d::detail::restrict_sources(a.fd, many);
  CHECK_FALSE(a.admits(700ms));  // 127.0.0.1 is not listed: its SYN is dropped

  listener b(AF_INET);
  auto with_loopback = many;
  with_loopback.push_back(v4("127.0.0.1"));
  d::detail::restrict_sources(b.fd, with_loopback);
  CHECK(b.admits(2000ms));

  listener c(AF_INET6);
  if (c.fd < 0) {
    WARN("no IPv6 loopback here: the IPv6 half is not checked");
    return;
  }
  d::detail::restrict_sources(c.fd, with_loopback);  // ::1 not listed (127.0.0.1 is IPv4)
  CHECK_FALSE(c.admits(700ms));
  listener e(AF_INET6);
  auto with_v6_loopback = many;
  with_v6_loopback.push_back(v6("::1"));
  d::detail::restrict_sources(e.fd, with_v6_loopback);
  CHECK(e.admits(2000ms));
}

TEST_CASE("the Gloo guard restricts the listeners new at the announcement to the other ranks' hosts",
          "[store][gloo][peers]") {
  auto host = d::launch::Store::host("127.0.0.1", 0, run_secret, 10s);
  auto store = c10::make_intrusive<d::launch::Store>("127.0.0.1", host->getPort(), run_secret, 10s);
  listener old_one(AF_INET);  // a listener of the process before the group: left alone
  const auto before = d::detail::tcp_listeners();

  SECTION("a rank in another network namespace: only its addresses, not its loopback") {
    store->set("g/hosts/1", host_entry("elsewhere/boot", {v4("192.0.2.77"), v4("127.0.0.1"), v6("::1")}));
    listener gloos(AF_INET);  // what Gloo opens for the group
    auto guard = c10::make_intrusive<d::detail::gloo_peer_guard>("g", store, 0, 2, before);
    CHECK(gloos.admits(2000ms));
    guard->seal();  // as the group is made: nobody until the announcement
    CHECK_FALSE(gloos.admits(700ms));
    CHECK(old_one.admits(2000ms));
    guard->set("0/rank_0", one_byte);  // not the announcement: nothing restricted yet
    CHECK(guard->restricted() == 0);
    guard->set("0/0", one_byte);  // the announcement
    CHECK(guard->restricted() == 1);
    CHECK(guard->allowed() == std::vector<d::detail::ip_address>{v4("192.0.2.77")});
    CHECK_FALSE(gloos.admits(700ms));
    CHECK(old_one.admits(2000ms));
  }
  SECTION("a rank in this network namespace (whatever DTRAIN_HOST_ID says): its addresses with loopback") {
    store->set("g/hosts/1", host_entry(d::detail::network_identity(), {v4("127.0.0.1"), v4("192.0.2.78")}));
    listener gloos(AF_INET);
    auto guard = c10::make_intrusive<d::detail::gloo_peer_guard>("g", store, 0, 2, before);
    guard->set("0/0", one_byte);
    CHECK(guard->restricted() == 1);
    CHECK(gloos.admits(2000ms));
  }
  CHECK(store->get("g/0/0").size() >= 1);  // the announcement itself went through
}

TEST_CASE("a Gloo group made through the guard connects and reduces", "[store][gloo][peers]") {
  auto host = d::launch::Store::host("127.0.0.1", 0, run_secret, 10s);
  std::vector<torch::Tensor> results(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.emplace_back([&, r] {
      auto store = c10::make_intrusive<d::launch::Store>("127.0.0.1", host->getPort(), run_secret, 10s);
      auto group = d::detail::guarded_gloo_group(store, "pg", r, 3, 10s, 2, [] {
        return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
      });
      std::vector<torch::Tensor> t{torch::full({4}, static_cast<float>(r + 1))};
      group->allreduce(t)->wait();
      results[r] = t[0];
    });
  for (auto& t : ranks) t.join();
  for (const auto& t : results) CHECK(torch::equal(t, torch::full({4}, 6.0f)));
}
