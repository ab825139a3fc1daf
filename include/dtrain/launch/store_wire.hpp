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
  writer& u32(std::uint32_t v);
  writer& i64(std::int64_t v);
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
  std::uint32_t u32();
  std::int64_t i64();
  std::string bytes();
  bool done() const { return at == in.size(); }
};

/// The client's answer to `nonce`: HMAC-SHA256 under the run secret, or zeros without one.
dtrain::detail::sha256_digest proof(const std::optional<std::string>& secret, std::string_view nonce);

std::string random_bytes(std::size_t n);

/// "address:port" of a socket's peer, as a refusal names it.
std::string peer_name(int fd);

}  // namespace store_wire

/// A fresh secret for one run (64 hex digits from the kernel's random source).
std::string make_run_secret();

/// The run secret the environment gives (DTRAIN_RUN_SECRET, else the file DTRAIN_RUN_SECRET_FILE
/// names), or nothing. Throws ConfigError for a secret too short to guess at, an unreadable file, or
/// a file that others than its owner may read or write (chmod 600 it).
std::optional<std::string> run_secret_from_environment();

}  // namespace launch

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/launch/impl/store_wire.ipp>
#endif
