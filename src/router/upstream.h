// UpstreamCall: one HTTP request from the router to a prefill or decode instance, run on its
// own thread so that the caller can wait for the response headers, then take the body in
// pieces as it arrives (the router relays SSE streams without buffering them) and cancel the
// call at any moment (a client that went away, or the router stopping): Cancel() shuts the
// upstream socket down, which the instance sees as a disconnect.
//
// Timeouts (router.h §7): the connect timeout; the first-byte timeout, from the call's start
// to the first byte of the answer's body (or the answer's end); then the idle timeout, the
// longest the instance may stay silent between two pieces of the body. The waiting functions
// below enforce the last two every 50 ms (each consumer polls them): a call past one is
// cancelled and fails with kFirstByteTimeout / kIdleTimeout. Time the receiving thread waits
// for the consumer (a slow client, the buffer below full) is not the instance's silence.
// httplib's own read timeout is only a backstop behind them.
//
// The response body is buffered in the call up to `max_buffered_bytes` not yet taken; past
// that the receiving thread waits for the consumer (so a slow client slows the instance down
// through TCP instead of growing the router's memory). Thread-safe: one producer thread (its
// own), any number of consumers; the destructor cancels and joins (shutting the socket down
// again until the thread ended, so a cancel that raced the connect cannot leave it blocked).
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
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
  double write_timeout_s = 600;       // sending the request
  double first_byte_timeout_s = 300;  // start -> first byte of the body (or the end)
  double idle_timeout_s = 60;         // between two pieces of the body
  size_t max_buffered_bytes = 4 << 20;
};

// Why a call did not complete.
enum class UpstreamFailure {
  kNone,              // complete, or still running
  kConnect,           // no connection (refused, unreachable, connect timeout)
  kClosed,            // the connection was closed or reset before the answer was complete
  kFirstByteTimeout,  // no byte of the body within the first-byte timeout
  kIdleTimeout,       // silent for the idle timeout once the body had started
  kCancelled,         // Cancel() (the client went away, the router is stopping, given up)
};
// "connect", "closed", "first_byte_timeout", "idle_timeout", "cancelled" ("none").
const char* UpstreamFailureLabel(UpstreamFailure failure);
bool IsTimeout(UpstreamFailure failure);

class UpstreamCall {
 public:
  // Starts the call to host:port at once.
  UpstreamCall(std::string host, int port, UpstreamRequest request, UpstreamOptions options);
  ~UpstreamCall();
  UpstreamCall(const UpstreamCall&) = delete;
  UpstreamCall& operator=(const UpstreamCall&) = delete;

  // Called every 50 ms while waiting: true gives the wait up (the call is cancelled).
  using GiveUp = std::function<bool()>;

  // Waits until the response headers arrived (true) or the call ended without them, timed
  // out, or `give_up` said so (false; cancelled).
  bool WaitHeaders(const GiveUp& give_up = nullptr);
  // Waits until the whole call ended (any outcome, timeouts included: true) or `give_up`
  // said so, or `deadline` passed (false; not cancelled).
  bool WaitDone(const GiveUp& give_up = nullptr, std::chrono::steady_clock::time_point deadline =
                                                     std::chrono::steady_clock::time_point::max());

  // Moves the body bytes received so far into `out` (replacing its contents), waiting up to
  // `wait` for some. `*finished` becomes true once no more bytes will come (the call ended
  // and everything has been taken).
  void Next(std::string* out, std::chrono::milliseconds wait, bool* finished);
  // The whole remaining body; call after WaitDone().
  std::string TakeBody();

  // Closes the connection (thread-safe, idempotent); the body ends where it is. The call's
  // thread ends soon after (failure() kCancelled unless a timeout came first).
  void Cancel();

  // After WaitHeaders() returned true:
  int status() const;
  std::string content_type() const;
  // After the call ended: whether the response was received completely, and why not.
  bool complete() const;
  UpstreamFailure failure() const;
  std::string ErrorText() const;
  // Whether any byte of the body arrived.
  bool body_started() const;
  // Whether the call failed before any response header arrived (the instance could not be
  // reached, reset the connection, or timed out before answering).
  bool failed_before_headers() const;

 private:
  using Clock = std::chrono::steady_clock;

  void Run();
  // Under mu_: whether a timeout has passed (then it is recorded in timed_out_ and the caller
  // cancels the call after unlocking).
  bool TimedOutLocked(Clock::time_point now);
  // Cancel(), then waits for the call's thread to end.
  void CancelAndWait();

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
  const Clock::time_point start_ = Clock::now();
  Clock::time_point last_progress_;  // the headers or the last body bytes received
  bool body_started_ = false;
  bool receiver_waiting_ = false;  // the receiving thread waits for the consumer to take bytes
  UpstreamFailure timed_out_ = UpstreamFailure::kNone;  // a timeout that cancelled the call
  std::atomic<bool> cancelled_{false};
  std::thread thread_;
};

}  // namespace oasis::router
