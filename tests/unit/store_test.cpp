// SPDX-License-Identifier: Apache-2.0
// dtrain's rendezvous store (launch/store.hpp, store_server.hpp, store_wire.hpp, detail/sha256.hpp):
// SHA-256 and HMAC against the published vectors, the c10d::Store semantics callers rely on, the
// address it listens on, the run secret, hostile clients, and ProcessGroupGloo over it; and the
// agreement on a stop request that rides on it (launch/stop.hpp).

#include "../dtrain_catch.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/torch.h>

#include <dtrain/detail/sha256.hpp>
#include <dtrain/launch/stop.hpp>
#include <dtrain/launch/store.hpp>

namespace d = dtrain;
using namespace std::chrono_literals;

namespace {

std::string hex(const d::detail::sha256_digest& x) { return d::detail::to_hex(x.data(), x.size()); }
std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

const std::string secret = "0123456789abcdef0123456789abcdef";

// A raw TCP connection to 127.0.0.1:port, as an intruder makes one.
int raw_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// Listening TCP sockets of this network namespace, "address:port" as /proc/net/tcp{,6} give them (hex).
std::vector<std::string> listeners_on_port(int port) {
  std::vector<std::string> found;
  char want[8];
  std::snprintf(want, sizeof want, ":%04X", port);
  for (const char* f : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(f);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream l(line);
      std::string slot, local, remote, state;
      l >> slot >> local >> remote >> state;
      if (state == "0A" && local.size() > 5 && local.substr(local.size() - 5) == want) found.push_back(local);
    }
  }
  return found;
}

}  // namespace

TEST_CASE("sha256 and hmac_sha256 give FIPS 180-4 and RFC 4231 results", "[store][sha256]") {
  CHECK(hex(d::detail::sha256_of("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex(d::detail::sha256_of("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(d::detail::sha256_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(hex(d::detail::sha256_of(std::string(1000000, 'a'))) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  CHECK(hex(d::detail::hmac_sha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(hex(d::detail::hmac_sha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(hex(d::detail::hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST_CASE("the store keeps c10d::Store's semantics: get waits, timeouts throw, add, compareSet, check, delete", "[store]") {
  auto host = d::launch::Store::host("127.0.0.1", 0, std::nullopt, 5s);
  auto other = c10::make_intrusive<d::launch::Store>("127.0.0.1", host->getPort(), std::nullopt, 5s);
  host->set("a", bytes("1"));
  CHECK(text(other->get("a")) == "1");
  host->set("empty", bytes(""));
  CHECK(text(other->get("empty")).empty());
  // get() waits for a key another client sets later.
  std::thread later([&] {
    std::this_thread::sleep_for(200ms);
    host->set("late", bytes("here"));
  });
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(text(other->get("late")) == "here");
  CHECK(std::chrono::steady_clock::now() - t0 >= 150ms);
  later.join();
  // A key that never comes: get() and wait() throw within their timeouts, and the connection goes on.
  other->setTimeout(300ms);
  CHECK_THROWS_WITH(other->get("never"), Catch::Contains("never") && Catch::Contains("timed out"));
  CHECK_THROWS_WITH(other->wait({"a", "never2"}, 200ms), Catch::Contains("never2"));
  other->wait({"a", "late"}, 200ms);
  CHECK(other->add("n", 2) == 2);
  CHECK(host->add("n", 3) == 5);
  CHECK(text(other->get("n")) == "5");  // counters are decimal text, as c10d's TCPStore keeps them
  CHECK_THROWS_WITH(other->add("late", 1), Catch::Contains("not an integer"));
  CHECK(other->check({"a", "n"}));
  CHECK_FALSE(other->check({"a", "nope"}));
  // compareSet as TCPStore answers it: a missing key takes `desired` only when `expected` is empty.
  CHECK(text(other->compareSet("cas", bytes("x"), bytes("y"))) == "x");
  CHECK_FALSE(other->check({"cas"}));
  CHECK(text(other->compareSet("cas", bytes(""), bytes("y"))) == "y");
  CHECK(text(other->compareSet("cas", bytes("z"), bytes("w"))) == "y");
  CHECK(text(other->compareSet("cas", bytes("y"), bytes("w"))) == "w");
  const auto keys = other->getNumKeys();
  CHECK(other->deleteKey("cas"));
  CHECK_FALSE(other->deleteKey("cas"));
  CHECK(other->getNumKeys() == keys - 1);
  // A value of a few MiB, as a state could be.
  const std::string big(3 << 20, 'q');
  other->set("big", bytes(big));
  CHECK(text(host->get("big")) == big);
}

TEST_CASE("the store listens on the address it is given and nowhere else", "[store][loopback]") {
  auto host = d::launch::Store::host("127.0.0.1", 0, std::nullopt, 5s);
  const auto found = listeners_on_port(host->getPort());
  REQUIRE(found.size() == 1);
  CHECK(found[0] == "0100007F:" + [&] {
    char p[8];
    std::snprintf(p, sizeof p, "%04X", host->getPort());
    return std::string(p);
  }());
  // A port taken on every address is reported, naming the port.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  CHECK_THROWS_WITH(d::launch::Store::host("127.0.0.1", port, std::nullopt, 1s),
                    Catch::Contains("port " + std::to_string(port)) && Catch::Contains("in use"));
  ::close(fd);
}

TEST_CASE("a client without the run secret is refused and the run's clients go on", "[store][secret]") {
  auto host = d::launch::Store::host("127.0.0.1", 0, secret, 5s);
  const int port = host->getPort();
  auto good = c10::make_intrusive<d::launch::Store>("127.0.0.1", port, secret, 5s);
  good->set("k", bytes("v"));
  CHECK_THROWS_WITH(d::launch::Store("127.0.0.1", port, std::string("another-secret-of-16+"), 2s),
                    Catch::Contains("refused this process") && Catch::Contains("DTRAIN_RUN_SECRET"));
  CHECK_THROWS_WITH(d::launch::Store("127.0.0.1", port, std::nullopt, 2s),
                    Catch::Contains("requires the run secret"));
  CHECK(host->server()->refused() >= 1);
  CHECK(text(good->get("k")) == "v");
}

TEST_CASE("hostile clients: garbage, requests without the proof, floods and stalls leave the store serving", "[store][hostile]") {
  auto host = d::launch::Store::host("127.0.0.1", 0, secret, 5s);
  const int port = host->getPort();
  auto good = c10::make_intrusive<d::launch::Store>("127.0.0.1", port, secret, 5s);
  std::vector<int> open;
  // Garbage at once.
  int fd = raw_connect(port);
  const std::string garbage(4096, '\x7f');
  CHECK(::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL) > 0);
  open.push_back(fd);
  // A well-formed set request, without the proof first.
  d::launch::store_wire::writer w;
  w.u8(static_cast<std::uint8_t>(d::launch::store_wire::op::set)).bytes("dtrain/0/stop").bytes("1");
  fd = raw_connect(port);
  const auto frame = w.frame();
  CHECK(::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) > 0);
  open.push_back(fd);
  // A stall mid-handshake (half a proof), and 200 idle connections.
  fd = raw_connect(port);
  CHECK(::send(fd, "0123456789", 10, MSG_NOSIGNAL) == 10);
  open.push_back(fd);
  for (int i = 0; i < 200; ++i) open.push_back(raw_connect(port));
  // The run's clients still connect and are served at once.
  const auto t0 = std::chrono::steady_clock::now();
  auto late = c10::make_intrusive<d::launch::Store>("127.0.0.1", port, secret, 5s);
  late->set("x", bytes("y"));
  CHECK(text(good->get("x")) == "y");
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  CHECK_FALSE(good->check({"dtrain/0/stop"}));  // the unproven request did not count
  CHECK(host->server()->refused() >= 2 + 200 - 64);
  // The stalled ones go after the handshake timeout.
  std::this_thread::sleep_for(d::launch::StoreServer::handshake_timeout + 1500ms);
  CHECK(host->server()->refused() >= 2 + 200 + 1);
  CHECK(text(late->get("x")) == "y");
  for (int f : open) ::close(f);
}

TEST_CASE("ProcessGroupGloo runs over dtrain's store", "[store][gloo]") {
  auto host = d::launch::Store::host("127.0.0.1", 0, secret, 10s);
  std::vector<torch::Tensor> results(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      auto store = c10::make_intrusive<d::launch::Store>("127.0.0.1", host->getPort(), secret, 10s);
      auto options = c10d::ProcessGroupGloo::Options::create(10s);
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      c10d::ProcessGroupGloo group(c10::make_intrusive<c10d::PrefixStore>("pg", store), r, 2, options);
      std::vector<torch::Tensor> t{torch::full({4}, static_cast<float>(r + 1))};
      group.allreduce(t)->wait();
      results[r] = t[0];
    });
  for (auto& t : ranks) t.join();
  CHECK(torch::equal(results[0], torch::full({4}, 3.0f)));
  CHECK(torch::equal(results[1], torch::full({4}, 3.0f)));
}

TEST_CASE("the run secret file must be the owner's alone and the secret long enough", "[store][secret]") {
  const auto dir = std::filesystem::temp_directory_path() / ("dtrain_secret_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "secret";
  std::ofstream(file) << secret << "\n";
  ::unsetenv(d::launch::env_run_secret);
  ::setenv(d::launch::env_run_secret_file, file.c_str(), 1);
  ::chmod(file.c_str(), 0644);
  CHECK_THROWS_WITH(d::launch::run_secret_from_environment(), Catch::Contains("mode 644") && Catch::Contains("chmod 600"));
  ::chmod(file.c_str(), 0600);
  CHECK(d::launch::run_secret_from_environment() == secret);
  ::setenv(d::launch::env_run_secret_file, (dir / "missing").c_str(), 1);
  CHECK_THROWS_WITH(d::launch::run_secret_from_environment(), Catch::Contains("cannot read"));
  ::setenv(d::launch::env_run_secret, "short", 1);
  CHECK_THROWS_WITH(d::launch::run_secret_from_environment(), Catch::Contains("at least 16"));
  ::unsetenv(d::launch::env_run_secret);
  ::unsetenv(d::launch::env_run_secret_file);
  CHECK_FALSE(d::launch::run_secret_from_environment().has_value());
  CHECK(d::launch::make_run_secret().size() == 64);
  CHECK(d::launch::make_run_secret() != d::launch::make_run_secret());
  std::filesystem::remove_all(dir);
}

TEST_CASE("store connection cost with and without the run secret", "[store][cost]") {
  // A rendezvous costs each worker two connections (its store and its heartbeat's): measure 200.
  for (const bool with_secret : {false, true}) {
    const auto s = with_secret ? std::optional<std::string>(secret) : std::nullopt;
    auto host = d::launch::Store::host("127.0.0.1", 0, s, 5s);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) {
      d::launch::Store c("127.0.0.1", host->getPort(), s, 5s);
      c.add("n", 1);
    }
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    std::printf("store connect + handshake + one add, %s the run secret: %.1f us each\n", with_secret ? "with" : "without",
                us / 200.0);
    CHECK(host->add("n", 0) == 200);
  }
}

namespace {

// Two ranks as threads over one store, in lock step (a std::barrier where an allreduce would be):
// each asks should_stop() after every step, `pause(rank, step)` long, until it answers true.
// Returns the step each rank stopped at (-1: it threw; `errors` gets the message).
std::vector<std::int64_t> stop_steps(const std::function<std::chrono::microseconds(int, std::int64_t)>& pause,
                                     const std::function<bool(int, std::int64_t)>& asks, std::atomic<std::int64_t>& step0,
                                     std::vector<std::string>& errors) {
  auto host = d::launch::Store::host("127.0.0.1", 0, std::nullopt, 10s);
  std::barrier step_done(2);
  std::vector<std::int64_t> stopped(2, -1);
  errors.assign(2, "");
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      d::launch::WorkerIdentity who;
      who.rank = r;
      who.world_size = 2;
      d::launch::Group group(who, c10::make_intrusive<d::launch::Store>("127.0.0.1", host->getPort(), std::nullopt, 10s), 10s);
      d::launch::StopRequest stop(group, 100ms);
      try {
        for (std::int64_t steps = 1; steps < 10'000'000; ++steps) {
          std::this_thread::sleep_for(pause(r, steps));
          step_done.arrive_and_wait();
          if (r == 0) step0 = steps;
          if (asks(r, steps) && stop.should_stop(steps)) {
            stopped[r] = steps;
            break;
          }
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
      step_done.arrive_and_drop();
    });
  // The driver's request, once the ranks have sped up.
  for (const auto until = std::chrono::steady_clock::now() + 30s; step0 < 40 && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(1ms);
  host->set(d::launch::stop_key(0), bytes("1"));
  for (auto& t : ranks) t.join();
  return stopped;
}

}  // namespace

TEST_CASE("a stop request stops every rank at the same step, however fast the steps turn", "[store][stop]") {
  // 20 slow steps (20 ms), then steps as fast as the threads go (a few microseconds): a rate
  // measured on the slow ones is thousands of times too low. The ranks still agree.
  std::atomic<std::int64_t> step0{0};
  std::vector<std::string> errors;
  const auto start = std::chrono::steady_clock::now();
  const auto stopped = stop_steps([](int, std::int64_t s) { return s <= 20 ? std::chrono::microseconds(20'000) : 0us; },
                                  [](int, std::int64_t) { return true; }, step0, errors);
  INFO(errors[0] << " | " << errors[1]);
  CHECK(errors == std::vector<std::string>{"", ""});
  CHECK(stopped[0] > 40);
  CHECK(stopped[0] == stopped[1]);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
}

TEST_CASE("a rank that asks whether to stop at other steps than rank 0 is named, not left behind", "[store][stop]") {
  std::atomic<std::int64_t> step0{0};
  std::vector<std::string> errors;
  // Rank 1 asks at even steps only: at rank 0's first check (step 1) it is at step 2.
  const auto stopped = stop_steps([](int, std::int64_t) { return 100us; },
                                  [](int r, std::int64_t s) { return r == 0 || s % 2 == 0; }, step0, errors);
  CHECK(stopped[1] == -1);
  CHECK_THAT(errors[1], Catch::Contains("rank 1 asked whether to stop at step 2 where rank 0 asked at step 1") &&
                            Catch::Contains("every rank must ask ctx.should_stop() at the same steps"));
  CHECK(errors[0].empty());
  CHECK(stopped[0] > 40);
}
