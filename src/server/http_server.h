// HttpFrontend: the OpenAI-compatible HTTP API on cpp-httplib — /v1/completions,
// /v1/chat/completions (JSON or SSE streams ending in `data: [DONE]`), /v1/models, /health,
// /tokenize, /detokenize, /metrics, /version. Every error is OpenAI error JSON; every handler
// catches everything (the server never dies on a request); a client that disconnects has its
// engine requests aborted.
//
// Owns its HttpListener (common/http_listener.h: the httplib::Server and its worker threads).
// Bind() then Run() (blocking) on one thread; Stop() from any other. Handlers run concurrently on
// the worker threads and only use the thread-safe Service.
#pragma once

#include <memory>
#include <string>

#include "oasis/status.h"
#include "server/serving.h"

namespace oasis {
class HttpListener;
}

namespace oasis::server {

class HttpFrontend {
 public:
  explicit HttpFrontend(Service& service);
  ~HttpFrontend();

  // Binds host:port (port 0: any free port); returns the bound port.
  StatusOr<int> Bind(const std::string& host, int port);
  // Serves until Stop(). Returns false when the server failed.
  bool Run();
  // Stops Run(). Safe before Run() has started listening: it waits (up to a few seconds)
  // for the listener to come up first, so that the server cannot start after being stopped.
  void Stop();

 private:
  void Routes();
  Service& service_;
  std::unique_ptr<HttpListener> listener_;
};

}  // namespace oasis::server
