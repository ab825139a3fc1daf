// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of store_wire.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/launch/store_wire.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace launch {
namespace store_wire {

DTRAIN_INLINE writer& writer::u32(std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>(v >> (8 * i));
  return *this;
}

DTRAIN_INLINE writer& writer::i64(std::int64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>(static_cast<std::uint64_t>(v) >> (8 * i));
  return *this;
}

DTRAIN_INLINE std::uint32_t reader::u32() {
  need(4);
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t(static_cast<std::uint8_t>(in[at + i])) << (8 * i);
  return at += 4, v;
}

DTRAIN_INLINE std::int64_t reader::i64() {
  need(8);
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t(static_cast<std::uint8_t>(in[at + i])) << (8 * i);
  return at += 8, static_cast<std::int64_t>(v);
}

DTRAIN_INLINE std::string reader::bytes() {
  const auto n = u32();
  need(n);
  std::string s(in.substr(at, n));
  return at += n, s;
}

DTRAIN_INLINE dtrain::detail::sha256_digest proof(const std::optional<std::string>& secret, std::string_view nonce) {
  if (!secret) return {};
  return dtrain::detail::hmac_sha256(*secret, std::string("dtrain-store-auth") + std::string(nonce));
}

DTRAIN_INLINE std::string random_bytes(std::size_t n) {
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

DTRAIN_INLINE std::string peer_name(int fd) {
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

DTRAIN_INLINE std::string make_run_secret() {
  const auto b = store_wire::random_bytes(32);
  return dtrain::detail::to_hex(reinterpret_cast<const std::uint8_t*>(b.data()), b.size());
}

DTRAIN_INLINE std::optional<std::string> run_secret_from_environment() {
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
