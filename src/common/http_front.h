// HttpFront: an event-driven HTTP/1.1 server (Boost.Beast's parser on Asio, C++20 coroutines)
// for oasis-server's OpenAI API. No thread is held per connection or per stream: a few I/O
// threads run every connection; handlers that do real work (parsing, tokenizing, rendering)
// run on a small worker pool; a response may be answered later from any thread, or streamed
// chunk by chunk (server-sent events) as tokens arrive.
//
// What a hostile client meets (docs/server.md, "Limits and timeouts"):
//   - at most `max_connections` open connections; past that, the oldest idle keep-alive
//     connection is closed to make room, and with none idle the new one gets a fast 503 with
//     `Retry-After` and is closed;
//   - the request line and headers must arrive within `header_timeout` of their first byte,
//     the body within `body_timeout`, and an idle keep-alive connection is closed after
//     `idle_timeout` (slowloris and idle floods cannot starve anyone);
//   - headers above `max_header_bytes` get 431, bodies above `max_body_bytes` get 413 on every
//     transfer encoding (Content-Length or chunked), conflicting framing (two different
//     Content-Lengths, Content-Length with chunked, a Transfer-Encoding other than chunked)
//     gets 400;
//   - a response write that makes no progress for `write_timeout` cuts the connection;
//   - a client that closes or resets its connection while its request runs is noticed at
//     once: the exchange's close callback runs (the server aborts the generation).
// Routes marked inline (/health, /metrics) run on the I/O threads and never wait for a worker,
// so they answer while every worker and every engine slot is busy.
//
// Thread-safety: Route/SetHooks before Start(); Bind, Start, Stop from one control thread.
// HttpExchange is thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "oasis/status.h"

namespace oasis {

struct HttpFrontOptions {
  size_t io_threads = 2;      // threads running every connection's I/O
  size_t worker_threads = 4;  // threads running handlers marked kWorker
  size_t max_connections = 4096;
  size_t max_header_bytes = 64 << 10;
  size_t max_body_bytes = 8 << 20;
  std::chrono::milliseconds header_timeout{10'000};  // first byte → end of headers
  std::chrono::milliseconds body_timeout{60'000};    // end of headers → end of body
  std::chrono::milliseconds idle_timeout{5'000};     // keep-alive: between requests
  std::chrono::milliseconds write_timeout{30'000};   // one response write, no progress
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without the query
  std::string query;   // after '?', raw
  HttpHeaders headers;
  std::string body;
  std::string remote;  // "address:port"
  // The first header named `name` (case-insensitive); nullptr when absent.
  const std::string* Header(std::string_view name) const;
};

// Whether `req` carries "Authorization: Bearer <key>" (compared in constant time).
bool HasBearerKey(const HttpRequest& req, const std::string& key);

// One request's response side. Answer once with Reply, or StartStream then Write... End.
// Any thread may call it; calls after the connection closed are dropped.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  // A whole response (Content-Length framed).
  virtual void Reply(int status, std::string content_type, std::string body,
                     HttpHeaders extra = {}) = 0;
  // A chunked response: the head now, chunks by Write, the last chunk by End.
  virtual void StartStream(int status, std::string content_type, HttpHeaders extra = {}) = 0;
  virtual void Write(std::string chunk) = 0;
  virtual void End() = 0;
  // Ends a streamed response as broken: the connection is closed without the last chunk (a
  // relayed answer that broke off must not look complete to the client). Bytes not yet sent
  // may be lost.
  virtual void Abort() = 0;
  // The client closed or reset the connection (or the server is cutting it) before the
  // response ended.
  virtual bool closed() const = 0;
  // Runs once, on an I/O thread, when the connection closes before the response ended (at
  // once if it already has). Set it before the work it must stop starts.
  virtual void OnClose(std::function<void()> callback) = 0;
  // Bytes written by Write/Reply that the socket has not taken yet (a slow reader's backlog).
  virtual size_t pending_bytes() const = 0;
};

using HttpHandler = std::function<void(HttpRequest&, std::shared_ptr<HttpExchange>)>;

enum class HttpDispatch {
  kInline,  // on the I/O thread: quick handlers only (no blocking, no heavy work)
  kWorker,  // on the worker pool
};

struct HttpFrontHooks {
  // Before routing: true when it answered the request itself (e.g. 401).
  std::function<bool(const HttpRequest&, HttpExchange&)> before;
  // The body of an error the front end answers itself (404, 408, 413, 431, 400, 503):
  // (status, code, message) → (content type, body).
  std::function<std::pair<std::string, std::string>(int, const std::string&, const std::string&)>
      error_body;
  // After each response head is sent (or the request failed): method, path, status.
  std::function<void(const std::string&, const std::string&, int)> log;
};

struct HttpFrontStats {
  uint64_t connections_open = 0;
  uint64_t connections_accepted = 0;
  uint64_t refused_over_limit = 0;  // 503 at accept
  uint64_t idle_evicted = 0;        // idle keep-alive closed to make room
  uint64_t slow_evicted = 0;        // still sending its request after 1 s, closed to make room
  uint64_t timeouts = 0;            // header, body, idle-in-request or write deadlines
  uint64_t bad_requests = 0;        // framing, header or body limits
  uint64_t client_disconnects = 0;  // closed before the response ended
};

class HttpFront {
 public:
  explicit HttpFront(const HttpFrontOptions& options);
  ~HttpFront();
  HttpFront(const HttpFront&) = delete;
  HttpFront& operator=(const HttpFront&) = delete;

  void Route(std::string method, std::string path, HttpDispatch dispatch, HttpHandler handler);
  void SetHooks(HttpFrontHooks hooks);

  // Binds host:port (port 0: any free port) and listens; returns the bound port.
  StatusOr<int> Bind(const std::string& host, int port);
  // Starts the I/O and worker threads; returns at once.
  void Start();
  // Stops accepting, closes idle connections, lets responses in progress end until
  // `deadline` from now, then cuts every connection and joins the threads. Idempotent.
  void Stop(std::chrono::milliseconds deadline);
  // Runs `task` on the worker pool (work a handler's answer needs later, e.g. formatting the
  // tokens a generation produced).
  void Post(std::function<void()> task);
  HttpFrontStats Stats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace oasis
