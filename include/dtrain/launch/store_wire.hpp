// SPDX-License-Identifier: Apache-2.0
#pragma once
// What dtrain's rendezvous store (store.hpp, store_server.hpp) sends over the wire, and the run
// secret that a client proves before the server counts its requests (docs/security.md).
//
// On connect the server sends a hello: the magic "DTRSTOR1", a flags byte (1: a secret is
// required) and a fresh 32-byte nonce. The client answers with 32 bytes, HMAC-SHA256(secret,
// "dtrain-store-auth" + nonce) (zeros when it has no secret); the server answers 'K' (accepted) or
// 'R' (refused, and closes). A recorded answer is worth nothing: the next connection gets another
// nonce. Then requests and replies, each a frame: a little-endian u32 length and that many bytes.
// A request is an op byte and its fields (byte strings: u32 length + bytes; integers: i64); a reply
// is a status byte (ok, timeout, error) and its fields.

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include <dtrain/detail/sha256.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

/// The environment variables that carry a run's secret to every process of the run: the secret
/// itself, or the path of a file (mode 0600 or stricter) that holds it.
inline constexpr const char* env_run_secret = "DTRAIN_RUN_SECRET";
inline constexpr const char* env_run_secret_file = "DTRAIN_RUN_SECRET_FILE";

namespace store_wire {

inline constexpr char magic[8] = {'D', 'T', 'R', 'S', 'T', 'O', 'R', '1'};
inline constexpr std::size_t nonce_bytes = 32, hello_bytes = sizeof magic + 1 + nonce_bytes, proof_bytes = 32;
inline constexpr std::uint8_t flag_secret_required = 1;
inline constexpr char accepted = 'K', refused = 'R';
/// The largest frame either side accepts (a key and a value of the run: small; c10d's own values,
/// Gloo's addresses and NCCL's unique id, are bytes to kilobytes).
inline constexpr std::uint32_t max_frame = 64u << 20;
/// The shortest run secret accepted from the environment.
inline constexpr std::size_t min_secret_chars = 16;

enum class op : std::uint8_t { set = 1, get, add, compare_set, check, wait, erase, num_keys };
enum class status : std::uint8_t { ok = 0, timeout = 1, error = 2 };

/// Appends fields to a frame body.
struct writer {
  std::string out;
  writer& u8(std::uint8_t v) { return out += static_cast<char>(v), *this; }
  writer& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out += static_cast<char>(v >> (8 * i));
    return *this;
  }
  writer& i64(std::int64_t v) {
    for (int i = 0; i < 8; ++i) out += static_cast<char>(static_cast<std::uint64_t>(v) >> (8 * i));
    return *this;
  }
  writer& bytes(std::string_view b) { return u32(static_cast<std::uint32_t>(b.size())), out += b, *this; }
  /// The frame: length, then the body.
  std::string frame() const { return writer{}.u32(static_cast<std::uint32_t>(out.size())).out + out; }
};

/// Reads fields from a frame body; a field past the end is a malformed frame (std::runtime_error).
struct reader {
  std::string_view in;
  std::size_t at = 0;
  void need(std::size_t n) const {
    if (in.size() - at < n) throw std::runtime_error("malformed frame: a field runs past its end");
  }
  std::uint8_t u8() { return need(1), static_cast<std::uint8_t>(in[at++]); }
  std::uint32_t u32() {
    need(4);
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t(static_cast<std::uint8_t>(in[at + i])) << (8 * i);
    return at += 4, v;
  }
  std::int64_t i64() {
    need(8);
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t(static_cast<std::uint8_t>(in[at + i])) << (8 * i);
    return at += 8, static_cast<std::int64_t>(v);
  }
  std::string bytes() {
    const auto n = u32();
    need(n);
    std::string s(in.substr(at, n));
    return at += n, s;
  }
  bool done() const { return at == in.size(); }
};

/// The client's answer to `nonce`: HMAC-SHA256 under the run secret, or zeros without one.
inline dtrain::detail::sha256_digest proof(const std::optional<std::string>& secret, std::string_view nonce) {
  if (!secret) return {};
  return dtrain::detail::hmac_sha256(*secret, std::string("dtrain-store-auth") + std::string(nonce));
}

inline std::string random_bytes(std::size_t n) {
  std::string s(n, '\0');
  std::size_t got = 0;
  while (got < n) {
    const auto r = ::getrandom(s.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw std::runtime_error(std::string("getrandom failed: ") + std::strerror(errno));
    got += static_cast<std::size_t>(r);
  }
  return s;
}

/// "address:port" of a socket's peer, as a refusal names it.
inline std::string peer_name(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "an unknown peer";
  char host[NI_MAXHOST] = {}, port[NI_MAXSERV] = {};
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown peer";
  return a.ss_family == AF_INET6 ? "[" + std::string(host) + "]:" + port : std::string(host) + ":" + port;
}

}  // namespace store_wire

/// A fresh secret for one run (64 hex digits from the kernel's random source).
inline std::string make_run_secret() {
  const auto b = store_wire::random_bytes(32);
  return dtrain::detail::to_hex(reinterpret_cast<const std::uint8_t*>(b.data()), b.size());
}

/// The run secret the environment gives (DTRAIN_RUN_SECRET, else the file DTRAIN_RUN_SECRET_FILE
/// names), or nothing. Throws ConfigError for a secret too short to guess at, an unreadable file, or
/// a file that others than its owner may read or write (chmod 600 it).
inline std::optional<std::string> run_secret_from_environment() {
  std::string secret, from = env_run_secret;
  if (const char* v = std::getenv(env_run_secret); v != nullptr && *v != '\0') {
    secret = v;
  } else if (const char* f = std::getenv(env_run_secret_file); f != nullptr && *f != '\0') {
    from = std::string(env_run_secret_file) + "=" + f;
    struct stat st {};
    if (::stat(f, &st) != 0)
      throw ConfigError(from + ": cannot read the run secret file (" + std::strerror(errno) +
                        "); create it with `umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > FILE`");
    if (!S_ISREG(st.st_mode)) throw ConfigError(from + " is not a regular file; point it at the run secret file");
    if ((st.st_mode & 077) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
      throw ConfigError(from + " has mode " + mode + ": others than its owner may read or change the run "
                        "secret; run `chmod 600 " + f + "`");
    }
    std::ifstream in(f, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) throw ConfigError(from + ": cannot read the run secret file");
    secret = text.str();
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r' || secret.back() == ' '))
      secret.pop_back();
  } else {
    return std::nullopt;
  }
  if (secret.size() < store_wire::min_secret_chars)
    throw ConfigError(from + ": the run secret has " + std::to_string(secret.size()) + " characters; give at least " +
                      std::to_string(store_wire::min_secret_chars) +
                      " (e.g. `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'`)");
  return secret;
}

}  // namespace launch

DTRAIN_NAMESPACE_END
