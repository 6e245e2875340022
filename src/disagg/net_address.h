// Socket addresses of the staging listener and its peers, without UCX (the server's settings
// check them before any UCX exists): "host:port" parsing and resolution, formatting, and
// whether an address is loopback. Pure functions; thread-safe.
#pragma once

#include <sys/socket.h>

#include <string>
#include <string_view>

#include "oasis/status.h"

namespace oasis::disagg {

// "host:port" (IPv4 literal, hostname, or "[v6]:port") → a socket address (the first that
// getaddrinfo gives). Port 0 is allowed (a listener then picks one).
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};
StatusOr<SockAddr> ResolveHostPort(std::string_view host_port);
std::string FormatSockAddr(const sockaddr* addr);  // "host:port"
// 127.0.0.0/8, ::1 or ::ffff:127.0.0.0/104: only this machine can reach a listener bound
// there. The wildcard addresses (0.0.0.0, ::) are not loopback.
bool IsLoopback(const SockAddr& addr);

}  // namespace oasis::disagg
