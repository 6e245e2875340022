// HttpListener: the HTTP listening and start/stop sequence both front ends (oasis-server,
// oasis-router) share, over a cpp-httplib server configured the same way for both (a worker
// pool, a body limit, keep-alive 5 s, read/write timeouts 30 s, TCP_NODELAY, a real listen
// backlog); plus the route helpers both use (GuardHandler, HasBearerKey).
//
// Header of a library (oasis_http) whose users link cpp-httplib. Owns the httplib::Server and its
// worker threads. Routes are installed on server() before
// Run(); Bind() then Run() (blocking) on one thread, Stop() from any other. Handlers run
// concurrently on the worker threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <memory>
#include <string>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "oasis/status.h"

namespace oasis {

// The listen backlog (the kernel caps it at net.core.somaxconn).
inline constexpr int kListenBacklog = 4096;

struct HttpListenerOptions {
  size_t threads = 64;              // worker threads (each open request holds one)
  size_t max_body_bytes = 8 << 20;  // larger request bodies get 413
};

class HttpListener {
 public:
  explicit HttpListener(const HttpListenerOptions& options);
  ~HttpListener();
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  httplib::Server& server();
  // Binds host:port (port 0: any free port) and listens with kListenBacklog; returns the
  // bound port.
  StatusOr<int> Bind(const std::string& host, int port);
  // Serves until Stop(). False when the server failed. Returns at once (true) when Stop()
  // came first.
  bool Run();
  // Stops Run(). Safe before Run() has started listening: it waits (up to a few seconds) for
  // the listener to come up or Run() to return first, so that the server cannot start after
  // being stopped.
  void Stop();

 private:
  class Server;  // httplib::Server that can raise its listen backlog
  std::unique_ptr<Server> server_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> run_exited_{false};
};

// The request carries "Authorization: Bearer KEY" with `key` (compared in constant time).
bool HasBearerKey(const httplib::Request& req, const std::string& key);

// Wraps a route handler: whatever it throws is logged and answered with
// `send_internal_error(res, message)` (the front end never dies on a request).
template <class Handler, class SendInternalError>
auto GuardHandler(Handler handler, SendInternalError send_internal_error) {
  return [handler, send_internal_error](const httplib::Request& req, httplib::Response& res) {
    try {
      handler(req, res);
    } catch (const std::exception& e) {
      spdlog::error("{} {}: {}", req.method, req.path, e.what());
      send_internal_error(res, std::string("internal error: ") + e.what());
    } catch (...) {
      send_internal_error(res, std::string("internal error"));
    }
  };
}

}  // namespace oasis
