// SPDX-License-Identifier: Apache-2.0
#pragma once
// A loopback port that was free a moment ago, for tests that start ranks under a launcher's
// variables (MASTER_PORT): the socket is closed again, so rank 0 can host the store there.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "dtrain_catch.hpp"

namespace dtrain_test {

inline std::string free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return std::to_string(ntohs(addr.sin_port));
}

}  // namespace dtrain_test
