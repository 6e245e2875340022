// ConnectionProbe: tells whether the client of an HTTP request has gone away, so that its
// engine request can be aborted. cpp-httplib 0.11 has no Request::is_connection_closed and
// does not expose the socket, so the probe finds the request's socket among the process's
// descriptors by its (local, remote) address and port pair, then polls it for POLLRDHUP /
// POLLHUP without reading.
//
// Owns nothing (the descriptor stays httplib's; it cannot be reused while the handler that
// owns the probe runs). One per request; not thread-safe.
#pragma once

#include <string>

namespace oasis::server {

class ConnectionProbe {
 public:
  ConnectionProbe(std::string local_addr, int local_port, std::string remote_addr, int remote_port)
      : local_addr_(std::move(local_addr)),
        local_port_(local_port),
        remote_addr_(std::move(remote_addr)),
        remote_port_(remote_port) {}

  // True once the peer has closed or reset the connection; false while it is open or when
  // the socket cannot be found.
  bool PeerClosed();

 private:
  int FindSocket() const;

  std::string local_addr_;
  int local_port_;
  std::string remote_addr_;
  int remote_port_;
  int fd_ = -1;
  bool searched_ = false;
};

}  // namespace oasis::server
