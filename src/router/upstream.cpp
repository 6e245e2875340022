#include "router/upstream.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace oasis::router {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);

template <typename Set>
void SetTimeout(double seconds, Set set) {
  const double s = std::max(seconds, 0.001);
  const auto whole = static_cast<time_t>(std::floor(s));
  set(whole, static_cast<time_t>((s - static_cast<double>(whole)) * 1e6));
}

}  // namespace

const char* UpstreamFailureLabel(UpstreamFailure failure) {
  switch (failure) {
    case UpstreamFailure::kNone:
      return "none";
    case UpstreamFailure::kConnect:
      return "connect";
    case UpstreamFailure::kClosed:
      return "closed";
    case UpstreamFailure::kFirstByteTimeout:
      return "first_byte_timeout";
    case UpstreamFailure::kIdleTimeout:
      return "idle_timeout";
    case UpstreamFailure::kCancelled:
      return "cancelled";
  }
  return "none";
}

bool IsTimeout(UpstreamFailure failure) {
  return failure == UpstreamFailure::kFirstByteTimeout || failure == UpstreamFailure::kIdleTimeout;
}

UpstreamCall::UpstreamCall(std::string host, int port, UpstreamRequest request,
                           UpstreamOptions options)
    : host_(std::move(host)), port_(port), request_(std::move(request)), options_(options) {
  client_ = std::make_unique<httplib::Client>(host_, port_);
  SetTimeout(options_.connect_timeout_s,
             [this](time_t s, time_t us) { client_->set_connection_timeout(s, us); });
  // A backstop only: the first-byte and idle timeouts are enforced by the waits, a little
  // before httplib's socket timeout would end the call.
  SetTimeout(std::max(options_.first_byte_timeout_s, options_.idle_timeout_s) + 1,
             [this](time_t s, time_t us) { client_->set_read_timeout(s, us); });
  SetTimeout(options_.write_timeout_s,
             [this](time_t s, time_t us) { client_->set_write_timeout(s, us); });
  client_->set_keep_alive(false);
  thread_ = std::thread([this] { Run(); });
}

UpstreamCall::~UpstreamCall() {
  CancelAndWait();
  if (thread_.joinable()) thread_.join();
}

void UpstreamCall::CancelAndWait() {
  Cancel();
  // A Cancel() that came while httplib was still connecting found no socket to shut down:
  // shut it down again until the call's thread has ended.
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, kPoll, [this] { return done_; })) {
    lock.unlock();
    client_->stop();
    lock.lock();
  }
}

void UpstreamCall::Run() {
  httplib::Request req;
  req.method = request_.method;
  req.path = request_.path;
  // Uncompressed answers: httplib's gzip would hold SSE events back until its buffer fills.
  req.headers.emplace("Accept-Encoding", "identity");
  if (!request_.authorization.empty()) req.headers.emplace("Authorization", request_.authorization);
  if (request_.method == "POST") {
    req.headers.emplace("Content-Type", "application/json");
    req.body = request_.body;
  }
  req.response_handler = [this](const httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = res.status;
    content_type_ = res.get_header_value("Content-Type");
    headers_ = true;
    last_progress_ = Clock::now();
    cv_.notify_all();
    return !cancelled_.load();
  };
  req.content_receiver = [this](const char* data, size_t size, uint64_t, uint64_t) {
    std::unique_lock<std::mutex> lock(mu_);
    // While this waits for room nobody reads the socket: no silence of the instance counts.
    receiver_waiting_ = true;
    cv_.wait(lock,
             [&] { return cancelled_.load() || pending_.size() < options_.max_buffered_bytes; });
    receiver_waiting_ = false;
    if (cancelled_.load()) return false;
    pending_.append(data, size);
    if (size > 0) body_started_ = true;
    last_progress_ = Clock::now();
    cv_.notify_all();
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  bool ok = false;
  if (!cancelled_.load()) {
    ok = client_->send(req, res, error);
  } else {
    error = httplib::Error::Canceled;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ok_ = ok && !cancelled_.load();
  error_ = ok_ ? httplib::Error::Success
               : (error == httplib::Error::Success ? httplib::Error::Canceled : error);
  done_ = true;
  cv_.notify_all();
}

bool UpstreamCall::TimedOutLocked(Clock::time_point now) {
  if (timed_out_ != UpstreamFailure::kNone) return true;
  if (done_ || cancelled_.load()) return false;
  auto seconds = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  if (!body_started_) {
    if (now - start_ >= seconds(options_.first_byte_timeout_s))
      timed_out_ = UpstreamFailure::kFirstByteTimeout;
  } else if (!receiver_waiting_ && now - last_progress_ >= seconds(options_.idle_timeout_s)) {
    // A receiver waiting for the consumer (a slow client) is the router's delay, not the
    // instance's silence: the clock starts again with the next bytes read.
    timed_out_ = UpstreamFailure::kIdleTimeout;
  }
  return timed_out_ != UpstreamFailure::kNone;
}

bool UpstreamCall::WaitHeaders(const GiveUp& give_up) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!headers_ && !done_) {
    if (TimedOutLocked(Clock::now())) {
      lock.unlock();
      CancelAndWait();
      return false;
    }
    lock.unlock();
    if (give_up && give_up()) {
      CancelAndWait();
      return false;
    }
    lock.lock();
    if (headers_ || done_) break;
    cv_.wait_for(lock, kPoll);
  }
  return headers_;
}

bool UpstreamCall::WaitDone(const GiveUp& give_up, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!done_) {
    if (TimedOutLocked(Clock::now())) {
      lock.unlock();
      CancelAndWait();
      return true;
    }
    if (Clock::now() >= deadline) return false;
    lock.unlock();
    if (give_up && give_up()) return false;
    lock.lock();
    if (done_) break;
    cv_.wait_for(lock, kPoll);
  }
  return true;
}

void UpstreamCall::Next(std::string* out, std::chrono::milliseconds wait, bool* finished) {
  std::unique_lock<std::mutex> lock(mu_);
  if (pending_.empty() && !done_)
    cv_.wait_for(lock, wait, [this] { return !pending_.empty() || done_; });
  out->clear();
  out->swap(pending_);
  *finished = done_ && pending_.empty();
  const bool timed_out = out->empty() && TimedOutLocked(Clock::now());
  cv_.notify_all();  // room for the receiving thread
  if (timed_out) {
    lock.unlock();
    CancelAndWait();
    lock.lock();
    *finished = done_ && pending_.empty();
  }
}

std::string UpstreamCall::TakeBody() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string body;
  body.swap(pending_);
  cv_.notify_all();
  return body;
}

void UpstreamCall::Cancel() {
  if (cancelled_.exchange(true)) {
    // Again: a Cancel() during the connect found no socket yet; this one may.
    client_->stop();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  client_->stop();
}

int UpstreamCall::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

std::string UpstreamCall::content_type() const {
  std::lock_guard<std::mutex> lock(mu_);
  return content_type_;
}

bool UpstreamCall::complete() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ && ok_;
}

bool UpstreamCall::body_started() const {
  std::lock_guard<std::mutex> lock(mu_);
  return body_started_;
}

UpstreamFailure UpstreamCall::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_ || ok_) return UpstreamFailure::kNone;
  if (timed_out_ != UpstreamFailure::kNone) return timed_out_;
  if (cancelled_.load()) return UpstreamFailure::kCancelled;
  switch (error_) {
    case httplib::Error::Connection:
    case httplib::Error::ConnectionTimeout:
    case httplib::Error::BindIPAddress:
      return UpstreamFailure::kConnect;
    default:
      return UpstreamFailure::kClosed;
  }
}

bool UpstreamCall::failed_before_headers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ && !headers_;
}

std::string UpstreamCall::ErrorText() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) return "in progress";
  if (ok_) return "ok";
  auto seconds = [](double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", s);
    return std::string(buf);
  };
  if (timed_out_ == UpstreamFailure::kFirstByteTimeout) {
    return "no answer within " + seconds(options_.first_byte_timeout_s) + " s (first-byte timeout)";
  }
  if (timed_out_ == UpstreamFailure::kIdleTimeout) {
    return "the answer stalled: silent for " + seconds(options_.idle_timeout_s) +
           " s (idle timeout)";
  }
  switch (error_) {
    case httplib::Error::Connection:
      return "connection failed";
    case httplib::Error::ConnectionTimeout:
      return "connection timed out";
    case httplib::Error::Read:
      return headers_ ? "connection lost while reading the answer"
                      : "no answer (connection closed or read timeout)";
    case httplib::Error::Write:
      return "connection lost while sending the request";
    case httplib::Error::Canceled:
      return "cancelled";
    default:
      return httplib::to_string(error_);
  }
}

}  // namespace oasis::router
