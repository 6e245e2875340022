#include "disagg/net_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

namespace oasis::disagg {

StatusOr<SockAddr> ResolveHostPort(std::string_view host_port) {
  std::string host;
  std::string port;
  if (!host_port.empty() && host_port.front() == '[') {
    const size_t close = host_port.find(']');
    if (close == std::string_view::npos || close + 1 >= host_port.size() ||
        host_port[close + 1] != ':') {
      return InvalidArgument("address '" + std::string(host_port) + "': expected [v6]:port");
    }
    host = std::string(host_port.substr(1, close - 1));
    port = std::string(host_port.substr(close + 2));
  } else {
    const size_t colon = host_port.rfind(':');
    if (colon == std::string_view::npos) {
      return InvalidArgument("address '" + std::string(host_port) + "': expected host:port");
    }
    host = std::string(host_port.substr(0, colon));
    port = std::string(host_port.substr(colon + 1));
  }
  if (host.empty() || port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(port) > 65535) {
    return InvalidArgument("address '" + std::string(host_port) + "': expected host:port");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    return InvalidArgument("address '" + std::string(host_port) + "': " + gai_strerror(rc));
  }
  SockAddr out;
  std::memcpy(&out.storage, result->ai_addr, result->ai_addrlen);
  out.length = result->ai_addrlen;
  freeaddrinfo(result);
  return out;
}

std::string FormatSockAddr(const sockaddr* addr) {
  char host[INET6_ADDRSTRLEN] = {0};
  uint16_t port = 0;
  if (addr->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "<unknown address family>";
}

bool IsLoopback(const SockAddr& addr) {
  const sockaddr* sa = addr.get();
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;  // 127.0.0.0/8
  }
  if (sa->sa_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;                // ::1
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;  // ::ffff:127.0.0.0/104
  }
  return false;
}

}  // namespace oasis::disagg
