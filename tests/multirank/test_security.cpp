// SPDX-License-Identifier: Apache-2.0
// Issue 33 ("let no one in"), on real 2-worker runs of the scenarios program: what the run listens
// on (loopback only, when every rank is on this host), and intruders at its store (garbage,
// requests without the run secret, a flood of connections, a stalled handshake) that leave the run's
// result bitwise as an undisturbed run's, with no hang, and the intruder named.

#include "../dtrain_catch.hpp"
#include "../loopback_port.hpp"
#include "../run_command.hpp"
#include "../scratch.hpp"
#include "saved_params.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include <dtrain/launch/store_wire.hpp>

namespace fs = std::filesystem;

namespace {

std::string tag_of(const char* what) {
  std::random_device rd;
  return std::string(what) + std::to_string(rd()) + std::to_string(::getpid());
}

dtrain_test::CommandResult security_scenario(const std::string& args, const std::string& tag, const std::string& env = "") {
  const fs::path dir = dtrain_test::scratch_directory("dtrain_security_" + tag);
  return dtrain_test::run_command("cd '" + dir.string() + "' && " + env + " '" + SCENARIOS_BIN + "' " + args +
                                  " --tag " + tag);
}

std::vector<int> pids_with(const std::string& tag) {
  std::vector<int> pids;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(in)), {});
    if (cmdline.find(tag) != std::string::npos && cmdline.find("/bin/sh") == std::string::npos) pids.push_back(std::stoi(name));
  }
  return pids;
}

// "address:port" (as /proc/net/tcp{,6} write them, hex) of every listening socket that one of `pids` holds.
std::set<std::string> listeners_of(const std::vector<int>& pids) {
  std::set<std::string> inodes;
  for (const int pid : pids) {
    std::error_code ec;
    for (const auto& fd : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
      const auto target = fs::read_symlink(fd.path(), ec).string();
      if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::set<std::string> found;
  for (const char* f : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(f);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream l(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
      l >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state == "0A" && inodes.count(inode)) found.insert(local);
    }
  }
  return found;
}

// 127.0.0.0/8 ("..7F:" in /proc's little-endian hex), ::1, or ::ffff:127.x.y.z.
bool loopback(const std::string& local) {
  const auto addr = local.substr(0, local.find(':'));
  if (addr.size() == 8) return addr.substr(6, 2) == "7F";
  return addr == "00000000000000000000000001000000" ||
         (addr.substr(0, 24) == "0000000000000000FFFF0000" && addr.substr(30, 2) == "7F");
}

using dtrain_test::load_params;

int try_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
  ::close(fd);
  return -1;
}

}  // namespace

TEST_CASE("a run on one host listens on loopback only", "[multirank][security][loopback]") {
  const auto tag = tag_of("l");
  std::atomic<bool> done{false};
  dtrain_test::CommandResult r;
  std::thread run([&] {
    r = security_scenario("equivalence --workers 2 --steps 30", tag);
    done = true;
  });
  std::set<std::string> seen;
  while (!done) {
    const auto now = listeners_of(pids_with(tag));
    seen.insert(now.begin(), now.end());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  run.join();
  INFO(r.output);
  REQUIRE(r.status == 0);
  REQUIRE_FALSE(seen.empty());  // the store at least was seen
  for (const auto& l : seen) {
    INFO("listening on " << l << " (hex, as /proc/net/tcp writes it)");
    CHECK(loopback(l));
  }
}

TEST_CASE("intruders at the store change nothing in the run's result and are named", "[multirank][security][hostile]") {
  const auto tag = tag_of("h"), quiet_tag = tag_of("q");
  const fs::path quiet = dtrain_test::scratch_directory("dtrain_security_" + quiet_tag) / "quiet.pt",
                 attacked = dtrain_test::scratch_directory("dtrain_security_" + tag) / "attacked.pt";
  auto r1 = security_scenario("equivalence --workers 2 --steps 30 --out " + quiet.string(), quiet_tag);
  INFO(r1.output);
  REQUIRE(r1.status == 0);

  const int port = std::stoi(dtrain_test::free_loopback_port());
  std::atomic<bool> done{false};
  dtrain_test::CommandResult r2;
  std::thread run([&] {
    r2 = security_scenario("equivalence --workers 2 --steps 30 --out " + attacked.string(), tag, "MASTER_PORT=" + std::to_string(port));
    done = true;
  });
  std::vector<int> open;
  int attacks = 0;
  while (!done) {
    const int fd = try_connect(port);
    if (fd < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    switch (attacks++ % 4) {
      case 0: {  // garbage
        const std::string junk(1000, '\x5a');
        (void)::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
        break;
      }
      case 1: {  // a well-formed request to stop the run, without the proof
        dtrain::launch::store_wire::writer w;
        w.u8(static_cast<std::uint8_t>(dtrain::launch::store_wire::op::set)).bytes("dtrain/0/stop/all-ranks-now").bytes("1");
        const auto f = w.frame();
        (void)::send(fd, f.data(), f.size(), MSG_NOSIGNAL);
        break;
      }
      case 2:  // a stall mid-handshake
        (void)::send(fd, "abc", 3, MSG_NOSIGNAL);
        break;
      default:  // a flood of idle connections
        for (int i = 0; i < 50; ++i)
          if (const int extra = try_connect(port); extra >= 0) open.push_back(extra);
    }
    open.push_back(fd);
    if (open.size() > 600) {
      for (int f : open) ::close(f);
      open.clear();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  run.join();
  for (int f : open) ::close(f);
  INFO(r2.output);
  REQUIRE(r2.status == 0);
  CHECK(attacks >= 4);
  CHECK_THAT(r2.output, Catch::Contains("the rendezvous store refused a connection from 127.0.0.1:"));
  const auto a = load_params(quiet), b = load_params(attacked);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i], b[i]));
  CHECK(pids_with(tag).empty());
}

TEST_CASE("a run started under umask 000 leaves nothing world-writable", "[multirank][security][files]") {
  const auto tag = tag_of("u");
  auto r = security_scenario("fsdp_train --strategy ddp --workers 2 --steps 4 --checkpoint 1", tag, "umask 000 &&");
  INFO(r.output);
  REQUIRE(r.status == 0);
  const fs::path dir = dtrain_test::scratch_directory("dtrain_security_" + tag) / "multirank_runs";
  int checked = 0, checkpoints = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    INFO(e.path().string());
    if (e.is_symlink()) continue;  // a link's own mode is always 777; its target is checked
    CHECK((e.symlink_status().permissions() & fs::perms::others_write) == fs::perms::none);
    checkpoints += e.path().filename().string().rfind("checkpoint_", 0) == 0;
    ++checked;
  }
  CHECK(checked > 5);
  CHECK(checkpoints >= 1);
}

TEST_CASE("under a launcher a rank with another run secret is refused with the fix and named by rank 0", "[multirank][security][secret]") {
  const auto tag = tag_of("s");
  const std::string port = dtrain_test::free_loopback_port();
  const fs::path dir = dtrain_test::scratch_directory("dtrain_security_" + tag);
  std::string cmd = "cd '" + dir.string() + "' && (";
  for (int r = 0; r < 2; ++r)
    cmd += "env RANK=" + std::to_string(r) + " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port +
           " DTRAIN_RUN_SECRET=" + (r == 0 ? "the-secret-of-this-run" : "the-secret-of-another-run") + " '" +
           SCENARIOS_BIN + "' equivalence --rendezvous-ms 3000 --tag " + tag + " & p" + std::to_string(r) + "=$!; ";
  cmd += "wait $p0; s0=$?; wait $p1; echo status $s0 $?)";
  const auto out = dtrain_test::run_command(cmd).output;
  INFO(out);
  CHECK_THAT(out, Catch::Contains("refused this process: its run secret differs"));
  CHECK_THAT(out, Catch::Contains("the rendezvous store refused a connection from 127.0.0.1:"));
  CHECK_THAT(out, Catch::Contains("rank(s) 1 of world size 2 never arrived"));
  CHECK_THAT(out, Catch::Contains("status 1 1"));
  CHECK(pids_with(tag).empty());
}
