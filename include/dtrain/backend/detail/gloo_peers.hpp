// SPDX-License-Identifier: Apache-2.0
#pragma once
// Gloo's data connections accept only the group's hosts (docs/security.md). Gloo's TCP transport takes
// whoever connects first to a listening socket as the peer: LibTorch 1.13's Gloo opens one listener
// per pair and accepts a single connection on it, 2.x's opens one per device and matches a sequence
// number the client sends. A stranger who finds the port (a scan) takes the pair or fails the
// group. gloo_peer_guard is the store Gloo's rendezvous goes through: before this rank announces
// its listeners, the ranks exchange their hosts' addresses through the store (whose clients prove
// the run secret), and every listener Gloo opened for the group gets a socket filter that drops, in
// the kernel, each packet whose source is not another rank's host.

#include <dirent.h>
#include <ifaddrs.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {

/// This process's network namespace on this machine (the kernel's boot id and the namespace's
/// inode): processes with the same one reach each other over loopback. Not DTRAIN_HOST_ID, which
/// may split one machine into "hosts" for the hierarchical allreduce.
std::string network_identity();

/// An IP address as the filter compares it: 4 or 16 bytes in network order.
using ip_address = std::string;

bool is_loopback(const ip_address& a);

/// Every address of this host's interfaces, IPv4 and IPv6, loopback included.
std::vector<ip_address> host_addresses();

/// The inodes of this process's listening TCP sockets (IPv4 and IPv6), with their descriptors.
std::vector<std::pair<ino_t, int>> tcp_listeners();

/// A classic BPF socket filter that keeps the packets whose IP source is one of `allowed` and drops
/// the rest (for a listening socket: the SYNs of anyone else; its connections inherit the filter).
/// Each address is tested by a block that ends in "keep", so every jump is short, whatever the count.
std::vector<sock_filter> source_filter(const std::vector<ip_address>& allowed);

/// Attaches source_filter(allowed) to the socket `fd`; throws naming the cause when it cannot.
void restrict_sources(int fd, const std::vector<ip_address>& allowed);

/// The store a ProcessGroupGloo rendezvouses through (its keys under `prefix`), which restricts
/// Gloo's listeners to the other ranks' hosts before this rank announces them. `before`: the
/// listening sockets the process had before the group's Gloo device was made (the listeners that
/// are new at the announcement are the group's). A peer in this network namespace may come from
/// loopback too.
class gloo_peer_guard final : public c10d::PrefixStore {
 public:
  gloo_peer_guard(const std::string& prefix, c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                  const std::vector<std::pair<ino_t, int>>& before);

  /// Drops every connection to the listeners opened since `before`, until the announcement lets
  /// the group's hosts in: a peer cannot know their ports before, and nobody else may connect.
  void seal();

  /// The group's hosts' addresses that this rank's listeners accept (after the announcement).
  const std::vector<ip_address>& allowed() const { return allowed_; }
  /// How many listening sockets were restricted.
  int restricted() const { return restricted_; }

  void set(const std::string& key, const std::vector<std::uint8_t>& value) override;

 private:
  // Entry: the network identity, a NUL, then each address as its length (4 or 16) and its bytes.
  void guard();

  int rank_, size_;
  std::set<ino_t> before_;
  bool guarded_ = false;
  std::vector<ip_address> allowed_;
  int restricted_ = 0;
};

/// A Gloo group of `size` ranks whose keys live under `prefix` in `store` and whose listeners take
/// connections from the other ranks' hosts only (gloo_peer_guard). `make_device` runs after the
/// process's listeners are listed, so the device's own listener (2.x's Gloo) is the group's, sealed
/// at once.
c10::intrusive_ptr<c10d::ProcessGroupGloo> guarded_gloo_group(
    const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size,
    std::chrono::milliseconds timeout, int threads, const std::function<std::shared_ptr<::gloo::transport::Device>()>& make_device);

}  // namespace detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/backend/detail/impl/gloo_peers.ipp>
#endif
