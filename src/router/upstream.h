// UpstreamCall: one HTTP request from the router to a prefill or decode instance, run on its
// own thread so that the caller can wait for the response headers, then take the body in
// pieces as it arrives (the router relays SSE streams without buffering them) and cancel the
// call at any moment (a client that went away, or the router stopping): Cancel() shuts the
// upstream socket down, which the instance sees as a disconnect.
//
// The response body is buffered in the call up to `max_buffered_bytes` not yet taken; past
// that the receiving thread waits for the consumer (so a slow client slows the instance down
// through TCP instead of growing the router's memory). Thread-safe: one producer thread (its
// own), any number of consumers; the destructor cancels and joins.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace oasis::router {

struct UpstreamRequest {
  std::string method = "POST";  // "GET" or "POST"
  std::string path;             // "/v1/completions"
  std::string body;             // sent as application/json when non-empty or POST
  std::string authorization;    // the client's Authorization header, forwarded when non-empty
};

struct UpstreamOptions {
  double connect_timeout_s = 5;
  double read_timeout_s = 600;
  size_t max_buffered_bytes = 4 << 20;
};

class UpstreamCall {
 public:
  // Starts the call to host:port at once.
  UpstreamCall(std::string host, int port, UpstreamRequest request, UpstreamOptions options);
  ~UpstreamCall();
  UpstreamCall(const UpstreamCall&) = delete;
  UpstreamCall& operator=(const UpstreamCall&) = delete;

  // Waits until the response headers arrived (true) or the call ended without them (false),
  // or `stop` became true (false; the call is cancelled). Polls `stop` every 50 ms.
  bool WaitHeaders(const std::atomic<bool>* stop = nullptr);
  // Waits until the whole call ended (any outcome) or `stop` became true, or `deadline`
  // passed (returns false in the last two cases).
  bool WaitDone(const std::atomic<bool>* stop = nullptr,
                std::chrono::steady_clock::time_point deadline =
                    std::chrono::steady_clock::time_point::max());

  // Moves the body bytes received so far into `out` (replacing its contents), waiting up to
  // `wait` for some. `*finished` becomes true once no more bytes will come (the call ended
  // and everything has been taken).
  void Next(std::string* out, std::chrono::milliseconds wait, bool* finished);
  // The whole remaining body; call after WaitDone().
  std::string TakeBody();

  // Closes the connection (thread-safe, idempotent); the body ends where it is.
  void Cancel();

  // After WaitHeaders() returned true:
  int status() const;
  std::string content_type() const;
  // After the call ended: whether the response was received completely, and why not.
  bool complete() const;
  std::string ErrorText() const;
  // Whether the call failed before any response header arrived (the instance could not be
  // reached, reset the connection, or timed out before answering).
  bool failed_before_headers() const;

 private:
  void Run();

  std::string host_;
  int port_;
  UpstreamRequest request_;
  UpstreamOptions options_;
  std::unique_ptr<httplib::Client> client_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool headers_ = false;
  bool done_ = false;
  bool ok_ = false;
  httplib::Error error_ = httplib::Error::Success;
  int status_ = 0;
  std::string content_type_;
  std::string pending_;  // received, not yet taken
  std::atomic<bool> cancelled_{false};
  std::thread thread_;
};

}  // namespace oasis::router
