// httplib::Server with a real listen backlog, for both HTTP front ends (oasis-server,
// oasis-router). Header-only; its users link cpp-httplib.
//
// httplib 0.11 listens with a backlog of CPPHTTPLIB_LISTEN_BACKLOG = 5, compiled into Debian's
// libcpp-httplib (defining the macro here changes nothing). A burst of more connects than that
// (a benchmark opening 16-64 connections at once) overflows the SYN queue, so the kernel
// answers with SYN cookies while the accept queue is full; the client's connect() succeeds and
// it writes the request, but a segment that reaches the listener first other than the one right
// after the handshake (httplib's client writes the headers and the body separately) fails the
// cookie check and is answered with a RST. The client sees its connection reset before any
// response byte, and the server never sees the request. listen() on a listening socket only
// changes its backlog, so the socket httplib bound is re-listened with a real one.
#pragma once

#include <httplib.h>
#include <sys/socket.h>

namespace oasis {

// The listen backlog (the kernel caps it at net.core.somaxconn).
inline constexpr int kListenBacklog = 4096;

class HttpListener : public httplib::Server {
 public:
  // After bind: listen() again on the bound socket with `backlog`.
  bool RaiseBacklog(int backlog = kListenBacklog) {
    const auto sock = svr_sock_.load();
    return sock != INVALID_SOCKET && ::listen(sock, backlog) == 0;
  }
};

}  // namespace oasis
