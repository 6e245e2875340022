#include "common/http_listener.h"

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/http_util.h"

namespace oasis {

// httplib 0.11 listens with a backlog of CPPHTTPLIB_LISTEN_BACKLOG = 5, compiled into Debian's
// libcpp-httplib (defining the macro here changes nothing). A burst of more connects than that
// (a benchmark opening 16-64 connections at once) overflows the SYN queue, so the kernel
// answers with SYN cookies while the accept queue is full; the client's connect() succeeds and
// it writes the request, but a segment that reaches the listener first other than the one right
// after the handshake (httplib's client writes the headers and the body separately) fails the
// cookie check and is answered with a RST. The client sees its connection reset before any
// response byte, and the server never sees the request. listen() on a listening socket only
// changes its backlog, so the socket httplib bound is re-listened with a real one.
class HttpListener::Server : public httplib::Server {
 public:
  // After bind: listen() again on the bound socket with `backlog`.
  bool RaiseBacklog(int backlog) {
    const auto sock = svr_sock_.load();
    return sock != INVALID_SOCKET && ::listen(sock, backlog) == 0;
  }
};

HttpListener::HttpListener(const HttpListenerOptions& options)
    : server_(std::make_unique<Server>()) {
  const size_t threads = options.threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_payload_max_length(options.max_body_bytes);
  server_->set_keep_alive_timeout(5);
  server_->set_read_timeout(30);
  server_->set_write_timeout(30);
  server_->set_tcp_nodelay(true);
}

HttpListener::~HttpListener() = default;

httplib::Server& HttpListener::server() { return *server_; }

StatusOr<int> HttpListener::Bind(const std::string& host, int port) {
  int bound = port;
  if (port == 0) {
    bound = server_->bind_to_any_port(host);
    if (bound <= 0) return Unavailable("cannot bind an HTTP port on " + host);
  } else if (!server_->bind_to_port(host, port)) {
    return Unavailable("cannot bind HTTP " + host + ":" + std::to_string(port) +
                       " (in use, or a bad --host)");
  }
  if (!server_->RaiseBacklog(kListenBacklog)) {
    return Unavailable("cannot set the listen backlog of HTTP " + host + ":" +
                       std::to_string(bound) + ": " + std::strerror(errno));
  }
  return bound;
}

bool HttpListener::Run() {
  const bool ok = stopping_.load() ? true : server_->listen_after_bind();
  run_exited_ = true;
  return ok;
}

void HttpListener::Stop() {
  stopping_ = true;
  // httplib's stop() is a no-op until listen_after_bind() runs; a listener that came up later
  // would serve forever.
  for (int i = 0; i < 500 && !server_->is_running() && !run_exited_.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  server_->stop();
}

bool HasBearerKey(const httplib::Request& req, const std::string& key) {
  const std::string auth = req.get_header_value("Authorization");
  return auth.rfind("Bearer ", 0) == 0 && KeyMatches(auth.substr(7), key);
}

}  // namespace oasis
