#include "router/upstream.h"

#include <cmath>

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

UpstreamCall::UpstreamCall(std::string host, int port, UpstreamRequest request,
                           UpstreamOptions options)
    : host_(std::move(host)), port_(port), request_(std::move(request)), options_(options) {
  client_ = std::make_unique<httplib::Client>(host_, port_);
  SetTimeout(options_.connect_timeout_s,
             [this](time_t s, time_t us) { client_->set_connection_timeout(s, us); });
  SetTimeout(options_.read_timeout_s,
             [this](time_t s, time_t us) { client_->set_read_timeout(s, us); });
  SetTimeout(options_.read_timeout_s,
             [this](time_t s, time_t us) { client_->set_write_timeout(s, us); });
  client_->set_keep_alive(false);
  thread_ = std::thread([this] { Run(); });
}

UpstreamCall::~UpstreamCall() {
  Cancel();
  if (thread_.joinable()) thread_.join();
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
    cv_.notify_all();
    return !cancelled_.load();
  };
  req.content_receiver = [this](const char* data, size_t size, uint64_t, uint64_t) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock,
             [&] { return cancelled_.load() || pending_.size() < options_.max_buffered_bytes; });
    if (cancelled_.load()) return false;
    pending_.append(data, size);
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

bool UpstreamCall::WaitHeaders(const std::atomic<bool>* stop) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!headers_ && !done_) {
    if (stop != nullptr && stop->load()) {
      lock.unlock();
      Cancel();
      return false;
    }
    cv_.wait_for(lock, kPoll);
  }
  return headers_;
}

bool UpstreamCall::WaitDone(const std::atomic<bool>* stop,
                            std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!done_) {
    if ((stop != nullptr && stop->load()) || std::chrono::steady_clock::now() >= deadline)
      return false;
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
  cv_.notify_all();  // room for the receiving thread
}

std::string UpstreamCall::TakeBody() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string body;
  body.swap(pending_);
  cv_.notify_all();
  return body;
}

void UpstreamCall::Cancel() {
  if (cancelled_.exchange(true)) return;
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

bool UpstreamCall::failed_before_headers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ && !headers_;
}

std::string UpstreamCall::ErrorText() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) return "in progress";
  if (ok_) return "ok";
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
