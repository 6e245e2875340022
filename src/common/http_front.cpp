#include "common/http_front.h"

#include "common/http_util.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_set>

#include <spdlog/spdlog.h>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>

namespace oasis {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

std::string Reason(int status) {
  const auto r = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  const std::string reason(r.data(), r.size());
  return reason.empty() || reason == "<unknown-status>" ? std::string("Status") : reason;
}

template <class View>
std::string Str(const View& v) {
  return std::string(v.data(), v.size());
}

// The response head; `length` < 0: chunked (HTTP/1.1) or close-delimited (HTTP/1.0).
std::string Head(int status, const std::string& content_type, int64_t length, bool chunked,
                 bool keep_alive, const HttpHeaders& extra) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) + "\r\n";
  if (!content_type.empty()) h += "Content-Type: " + content_type + "\r\n";
  if (length >= 0) {
    h += "Content-Length: " + std::to_string(length) + "\r\n";
  } else if (chunked) {
    h += "Transfer-Encoding: chunked\r\n";
  }
  h += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [k, v] : extra) h += k + ": " + v + "\r\n";
  h += "\r\n";
  return h;
}

struct RouteEntry {
  HttpDispatch dispatch;
  HttpHandler handler;
};

// Writes a whole error response (`bytes`, within `write_limit`), then a lingering close: the
// sending side is shut and what the client still sends is read for up to `linger`, so that the
// close is not a reset that discards the error before the client read it.
asio::awaitable<void> WriteAndLinger(beast::tcp_stream& stream, const std::string& bytes,
                                     std::chrono::seconds write_limit,
                                     std::chrono::seconds linger) {
  error_code ec;
  stream.expires_after(write_limit);
  co_await asio::async_write(stream, asio::buffer(bytes),
                             asio::redirect_error(asio::use_awaitable, ec));
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  char sink[4096];
  stream.expires_after(linger);
  while (!ec) {
    co_await stream.async_read_some(asio::buffer(sink),
                                    asio::redirect_error(asio::use_awaitable, ec));
  }
}

}  // namespace

const std::string* HttpRequest::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (IEquals(k, name)) return &v;
  }
  return nullptr;
}

bool HasBearerKey(const HttpRequest& req, const std::string& key) {
  const std::string* auth = req.Header("Authorization");
  return auth != nullptr && auth->rfind("Bearer ", 0) == 0 && KeyMatches(auth->substr(7), key);
}

class HttpFront::Impl {
 public:
  class Connection;
  class Exchange;

  explicit Impl(const HttpFrontOptions& o)
      : options_(o),
        io_(static_cast<int>(std::max<size_t>(1, o.io_threads))),
        workers_(std::max<size_t>(1, o.worker_threads)),
        acceptor_(asio::make_strand(io_)) {}

  ~Impl() { Stop(std::chrono::milliseconds(0)); }

  StatusOr<int> Bind(const std::string& host, int port) {
    error_code ec;
    const auto address =
        asio::ip::make_address(host == "localhost" ? "127.0.0.1" : UnbracketHost(host), ec);
    if (ec) return InvalidArgument("cannot bind HTTP: '" + host + "' is not an IP address");
    tcp::endpoint ep(address, static_cast<unsigned short>(port));
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(4096, ec);
    if (ec) {
      return Unavailable("cannot bind HTTP " + host + ":" + std::to_string(port) + ": " +
                         ec.message());
    }
    return static_cast<int>(acceptor_.local_endpoint().port());
  }

  void Start() {
    if (started_.exchange(true)) return;
    asio::co_spawn(acceptor_.get_executor(), Accept(), asio::detached);
    for (size_t i = 0; i < std::max<size_t>(1, options_.io_threads); ++i) {
      threads_.emplace_back([this] { io_.run(); });
    }
  }

  void Stop(std::chrono::milliseconds deadline);

  asio::awaitable<void> Accept();
  asio::awaitable<void> Refuse(tcp::socket socket);
  // Closes the longest-idle keep-alive connection; false when none is idle.
  bool EvictForNew();
  void Register(Connection* c) {
    std::lock_guard<std::mutex> lock(mu_);
    connections_.insert(c);
    stats_open_ = connections_.size();
  }
  void Unregister(Connection* c) {
    std::lock_guard<std::mutex> lock(mu_);
    connections_.erase(c);
    stats_open_ = connections_.size();
    if (connections_.empty()) drained_.notify_all();
  }

  std::pair<std::string, std::string> ErrorBody(int status, const std::string& code,
                                                const std::string& message) const {
    if (hooks_.error_body) return hooks_.error_body(status, code, message);
    return {"text/plain", message + "\n"};
  }
  void Log(const std::string& method, const std::string& path, int status) const {
    if (hooks_.log) hooks_.log(method, path, status);
  }

  // Declared before the I/O context: destroying it destroys the connections' coroutine frames,
  // whose destructors unregister here.
  HttpFrontOptions options_;
  std::map<std::pair<std::string, std::string>, RouteEntry> routes_;
  HttpFrontHooks hooks_;
  std::atomic<bool> started_{false};
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  std::mutex mu_;
  std::condition_variable drained_;
  std::unordered_set<Connection*> connections_;
  std::atomic<uint64_t> stats_open_{0}, stats_accepted_{0}, stats_refused_{0}, stats_evicted_{0},
      stats_evicted_slow_{0}, stats_timeouts_{0}, stats_bad_{0}, stats_disconnects_{0};
  asio::io_context io_;
  asio::thread_pool workers_;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
};

// One connection: a coroutine on its strand reads a request, dispatches it, then writes what
// its Exchange queues until the response ends; meanwhile one read watches for the client
// closing. Every member is touched on the strand only (the atomics excepted).
class HttpFront::Impl::Connection : public std::enable_shared_from_this<Connection> {
 public:
  enum class Phase { kIdle, kReading, kResponding };

  Connection(Impl& front, tcp::socket socket)
      : front_(front),
        stream_(std::move(socket)),
        wake_(stream_.get_executor()),
        deadline_(stream_.get_executor()) {
    front_.Register(this);
  }
  ~Connection() { front_.Unregister(this); }

  asio::any_io_executor strand() { return stream_.get_executor(); }
  // `self` keeps the connection alive: an awaitable starts later, when the strand runs it.
  asio::awaitable<void> Run(std::shared_ptr<Connection> self);

  // From any thread: cut the connection (idle eviction, shutdown).
  void Cut() {
    evicting_ = true;
    asio::post(stream_.get_executor(), [self = shared_from_this()] { self->CutNow(); });
  }
  // From any thread, while stopping: cut it unless it is writing a response.
  void CutUnlessResponding() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->phase_ != Phase::kResponding) self->CutNow();
    });
  }
  Phase phase() const { return phase_.load(); }
  // Cut already asked for: the connection is closing and stays registered only until its
  // coroutine unwinds, so it is no longer a candidate to make room.
  bool evicting() const { return evicting_.load(); }
  std::chrono::steady_clock::time_point idle_since() const { return idle_since_.load(); }
  std::chrono::steady_clock::time_point reading_since() const { return reading_since_.load(); }

  // Strand: queue bytes of the current exchange and wake the writer.
  void Queue(uint64_t exchange, std::string bytes, bool last) {
    if (exchange != exchange_id_ || done_ || closed_) return;
    if (!bytes.empty()) {
      pending_ += bytes.size();
      out_.push_back(std::move(bytes));
    }
    if (last) done_ = true;
    wake_.cancel();
  }
  // Strand: the exchange ends broken (HttpExchange::Abort): the connection is cut, which is
  // neither a client disconnect nor a callback's business.
  void AbortExchange(uint64_t exchange) {
    if (exchange != exchange_id_ || closed_) return;
    done_ = true;
    CutNow();
  }
  void OnClose(uint64_t exchange, std::function<void()> cb) {
    if (exchange != exchange_id_) return;
    if (closed_ && !done_) {
      if (cb) cb();
      return;
    }
    on_close_ = std::move(cb);
  }
  std::atomic<size_t> pending_{0};
  std::atomic<bool> closed_flag_{false};
  bool keep_alive_ = true;
  bool http11_ = true;

 private:
  void CutNow() {
    error_code ec;
    stream_.socket().cancel(ec);
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    MarkClosed();
    wake_.cancel();
  }
  void MarkClosed() {
    if (closed_) return;
    closed_ = true;
    closed_flag_ = true;
    if (phase_ == Phase::kResponding && !done_) {
      ++front_.stats_disconnects_;
      if (on_close_) {
        auto cb = std::move(on_close_);
        on_close_ = nullptr;
        cb();
      }
    }
  }
  // A deadline for reading the request: on expiry the read is cancelled (not the socket
  // closed, as tcp_stream's own timeout would), so that a 408 can still be written.
  void Arm(std::chrono::milliseconds d) {
    timed_out_ = false;
    deadline_.expires_after(d);
    deadline_.async_wait(asio::bind_executor(
        stream_.get_executor(), [self = shared_from_this(), gen = ++deadline_gen_](error_code ec) {
          if (ec || gen != self->deadline_gen_) return;
          self->timed_out_ = true;
          error_code ignored;
          self->stream_.socket().cancel(ignored);
        }));
  }
  void Disarm() {
    ++deadline_gen_;
    deadline_.cancel();
  }
  // A read that watches for the client closing while the response is written; data (a
  // pipelined request) stays in the buffer for the next parse. Past the header limit of
  // buffered data it reads no more (the rest waits in the socket, as TCP flow control lets
  // it): a client sending while its answer is generated cannot grow the buffer without bound.
  void Watch() {
    if (watching_ || closed_ || buffer_.size() >= front_.options_.max_header_bytes) return;
    watching_ = true;
    auto buf = buffer_.prepare(4096);
    stream_.socket().async_read_some(
        buf, asio::bind_executor(stream_.get_executor(),
                                 [self = shared_from_this()](error_code ec, size_t n) {
                                   self->watching_ = false;
                                   if (!ec) {
                                     self->buffer_.commit(n);
                                   } else if (ec != asio::error::operation_aborted) {
                                     self->MarkClosed();
                                   }
                                   self->wake_.cancel();
                                 }));
  }
  asio::awaitable<void> Wait() {
    error_code ec;
    wake_.expires_at(asio::steady_timer::time_point::max());
    co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  // Writes a whole error response and ends the connection.
  asio::awaitable<void> Fail(int status, const std::string& code, const std::string& message,
                             const std::string& method, const std::string& path) {
    auto [type, body] = front_.ErrorBody(status, code, message);
    HttpHeaders extra;
    if (status == 503) extra.push_back({"Retry-After", "1"});
    std::string bytes = Head(status, type, static_cast<int64_t>(body.size()), false, false, extra);
    bytes += body;
    front_.Log(method, path, status);
    co_await WriteAndLinger(stream_, bytes, std::chrono::seconds(2), std::chrono::seconds(1));
  }
  asio::awaitable<bool> Serve();  // one request; false: end the connection
  void Dispatch(HttpRequest req);

  Impl& front_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  asio::steady_timer wake_;
  asio::steady_timer deadline_;
  uint64_t deadline_gen_ = 0;
  bool timed_out_ = false;
  std::atomic<Phase> phase_{Phase::kIdle};
  std::atomic<bool> evicting_{false};
  std::atomic<std::chrono::steady_clock::time_point> idle_since_{std::chrono::steady_clock::now()};
  std::atomic<std::chrono::steady_clock::time_point> reading_since_{
      std::chrono::steady_clock::now()};
  uint64_t exchange_id_ = 0;
  std::deque<std::string> out_;
  bool done_ = false;    // the current response is complete (queued)
  bool closed_ = false;  // the client is gone, or the connection was cut
  bool watching_ = false;
  std::function<void()> on_close_;
};

class HttpFront::Impl::Exchange : public HttpExchange {
 public:
  Exchange(Impl& front, std::shared_ptr<Connection> c, uint64_t id, std::string method,
           std::string path)
      : front_(front),
        conn_(std::move(c)),
        id_(id),
        method_(std::move(method)),
        path_(std::move(path)),
        keep_alive_(conn_->keep_alive_),
        http11_(conn_->http11_),
        head_only_(method_ == "HEAD") {}

  // A HEAD request (served by the GET route) gets the head the GET would have, no body.
  void Reply(int status, std::string content_type, std::string body, HttpHeaders extra) override {
    if (started_.exchange(true)) return;
    Log(status);
    std::string bytes =
        Head(status, content_type, static_cast<int64_t>(body.size()), false, keep_alive_, extra);
    if (!head_only_) bytes += body;
    Post(std::move(bytes), true);
  }
  void StartStream(int status, std::string content_type, HttpHeaders extra) override {
    if (started_.exchange(true)) return;
    Log(status);
    if (head_only_) {  // the head only: the stream's writes and end are not sent
      ended_ = true;
      streaming_ = true;
      Post(Head(status, content_type, -1, http11_, keep_alive_ && http11_, extra), true);
      return;
    }
    streaming_ = true;
    Post(Head(status, content_type, -1, http11_, keep_alive_ && http11_, extra), false);
  }
  void Write(std::string chunk) override {
    if (!streaming_ || ended_ || chunk.empty()) return;
    if (http11_) {
      char size[32];
      std::snprintf(size, sizeof(size), "%zx\r\n", chunk.size());
      chunk = size + chunk + "\r\n";
    }
    Post(std::move(chunk), false);
  }
  void End() override {
    if (!streaming_ || ended_.exchange(true)) return;
    Post(http11_ ? std::string("0\r\n\r\n") : std::string(), true);
  }
  void Abort() override {
    if (!streaming_ || ended_.exchange(true)) return;
    asio::post(conn_->strand(), [c = conn_, id = id_] { c->AbortExchange(id); });
  }
  bool closed() const override { return conn_->closed_flag_.load(); }
  void OnClose(std::function<void()> callback) override {
    asio::post(conn_->strand(), [c = conn_, id = id_, cb = std::move(callback)]() mutable {
      c->OnClose(id, std::move(cb));
    });
  }
  size_t pending_bytes() const override { return conn_->pending_.load(); }
  bool started() const { return started_.load(); }

 private:
  void Log(int status) { front_.Log(method_, path_, status); }
  void Post(std::string bytes, bool last) {
    asio::post(conn_->strand(), [c = conn_, id = id_, b = std::move(bytes), last]() mutable {
      c->Queue(id, std::move(b), last);
    });
  }
  Impl& front_;
  std::shared_ptr<Connection> conn_;
  uint64_t id_;
  std::string method_, path_;
  bool keep_alive_, http11_, head_only_;
  std::atomic<bool> started_{false}, ended_{false};
  std::atomic<bool> streaming_{false};
};

asio::awaitable<void> HttpFront::Impl::Connection::Run(std::shared_ptr<Connection> self) {
  error_code ec;
  stream_.socket().set_option(tcp::no_delay(true), ec);
  try {
    while (!closed_ && co_await Serve()) {
    }
  } catch (const std::exception& e) {
    spdlog::warn("HTTP connection: {}", e.what());
  }
  on_close_ = nullptr;
  closed_ = true;
  closed_flag_ = true;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.socket().close(ec);
}

asio::awaitable<bool> HttpFront::Impl::Connection::Serve() {
  const HttpFrontOptions& o = front_.options_;
  error_code ec;
  // Idle: wait for the first byte of the next request (keep-alive timeout).
  phase_ = Phase::kIdle;
  idle_since_ = std::chrono::steady_clock::now();
  if (front_.stopping_) co_return false;
  // Empty lines before a request line are skipped (RFC 9112 §2.2: clients may send a CRLF
  // after a body), a bounded number of them.
  constexpr size_t kMaxEmptyLineBytes = 64;
  for (size_t skipped = 0;;) {
    if (buffer_.size() == 0) {
      stream_.expires_after(o.idle_timeout);
      const size_t n = co_await stream_.async_read_some(
          buffer_.prepare(4096), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return false;  // idle timeout, close or reset: end quietly
      buffer_.commit(n);
    }
    const auto data = buffer_.data();
    const char* p = static_cast<const char*>(data.data());
    size_t k = 0;
    while (k < data.size() && skipped + k < kMaxEmptyLineBytes && (p[k] == '\r' || p[k] == '\n')) {
      ++k;
    }
    buffer_.consume(k);
    skipped += k;
    if (buffer_.size() > 0 || skipped >= kMaxEmptyLineBytes) break;
  }
  reading_since_ = std::chrono::steady_clock::now();
  phase_ = Phase::kReading;
  if (front_.stopping_) co_return false;

  http::request_parser<http::string_body> parser;
  parser.header_limit(static_cast<std::uint32_t>(std::min<size_t>(o.max_header_bytes, UINT32_MAX)));
  parser.body_limit(o.max_body_bytes);
  stream_.expires_never();
  Arm(o.header_timeout);
  co_await http::async_read_header(stream_, buffer_, parser,
                                   asio::redirect_error(asio::use_awaitable, ec));
  Disarm();
  if (timed_out_ && ec == asio::error::operation_aborted) ec = beast::error::timeout;
  std::string method, path;
  if (parser.is_header_done()) {
    method = Str(parser.get().method_string());
    const std::string target = Str(parser.get().target());
    path = target.substr(0, target.find('?'));
  }
  auto fail = [&](int status, const std::string& code,
                  const std::string& message) -> asio::awaitable<bool> {
    if (status == 408) {
      ++front_.stats_timeouts_;
    } else {
      ++front_.stats_bad_;
    }
    co_await Fail(status, code, message, method, path);
    co_return false;
  };
  if (ec) {
    if (ec == beast::error::timeout) {
      co_return co_await fail(408, "request_timeout",
                              "the request headers did not arrive within " +
                                  std::to_string(o.header_timeout.count()) + " ms");
    }
    if (ec == http::error::header_limit) {
      co_return co_await fail(
          431, "request_header_fields_too_large",
          "request headers larger than " + std::to_string(o.max_header_bytes) + " bytes");
    }
    if (ec == http::error::body_limit) {  // a Content-Length over the limit
      co_return co_await fail(413, "request_too_large",
                              "request body larger than the server's limit of " +
                                  std::to_string(o.max_body_bytes) + " bytes (--max-body-bytes)");
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted) {
      co_return false;
    }
    co_return co_await fail(400, "bad_request", "malformed HTTP request: " + ec.message());
  }
  auto& msg = parser.get();
  http11_ = msg.version() >= 11;
  keep_alive_ = msg.keep_alive() && http11_ && !front_.stopping_;
  // Request framing is Content-Length or chunked, nothing else (RFC 9112 §6.3): one coding,
  // "chunked" — "gzip, chunked" would leave a coding the server never applies.
  int codings = 0;
  bool only_chunked = true;
  const auto [te_begin, te_end] = msg.equal_range(http::field::transfer_encoding);
  for (auto field = te_begin; field != te_end; ++field) {
    const std::string_view v = field->value();
    for (size_t at = 0; at <= v.size();) {
      const size_t comma = std::min(v.find(',', at), v.size());
      const std::string coding = Trim(v.substr(at, comma - at));
      if (!coding.empty()) {
        ++codings;
        only_chunked &= IEquals(coding, "chunked");
      }
      at = comma + 1;
    }
  }
  if (te_begin != te_end && (!parser.chunked() || codings != 1 || !only_chunked)) {
    co_return co_await fail(400, "bad_request",
                            "Transfer-Encoding other than chunked is not supported");
  }
  // HTTP/1.0 has no transfer codings: its framing would be faulty (RFC 9112 §6.1).
  if (te_begin != te_end && !http11_) {
    co_return co_await fail(400, "bad_request", "Transfer-Encoding in an HTTP/1.0 request");
  }
  // Every HTTP/1.1 request carries a Host header (RFC 9112 §3.2).
  if (http11_ && msg.find(http::field::host) == msg.end()) {
    co_return co_await fail(400, "bad_request", "an HTTP/1.1 request needs a Host header");
  }
  if (const auto cl = parser.content_length(); cl && *cl > o.max_body_bytes) {
    co_return co_await fail(413, "request_too_large",
                            "request body of " + std::to_string(*cl) +
                                " bytes is larger than the server's limit of " +
                                std::to_string(o.max_body_bytes) + " bytes (--max-body-bytes)");
  }
  if (!parser.is_done()) {
    if (const auto e = msg.find(http::field::expect); e != msg.end()) {
      if (!beast::iequals(e->value(), "100-continue")) {
        co_return co_await fail(417, "expectation_failed", "unsupported Expect header");
      }
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      stream_.expires_after(o.write_timeout);
      co_await asio::async_write(stream_, asio::buffer(kContinue),
                                 asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return false;
    }
    stream_.expires_never();
    Arm(o.body_timeout);
    co_await http::async_read(stream_, buffer_, parser,
                              asio::redirect_error(asio::use_awaitable, ec));
    Disarm();
    if (timed_out_ && ec == asio::error::operation_aborted) ec = beast::error::timeout;
    if (ec) {
      if (ec == beast::error::timeout) {
        co_return co_await fail(408, "request_timeout",
                                "the request body did not arrive within " +
                                    std::to_string(o.body_timeout.count()) + " ms");
      }
      if (ec == http::error::body_limit) {
        co_return co_await fail(413, "request_too_large",
                                "request body larger than the server's limit of " +
                                    std::to_string(o.max_body_bytes) + " bytes (--max-body-bytes)");
      }
      if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
          ec == asio::error::eof || ec == asio::error::connection_reset ||
          ec == asio::error::operation_aborted) {
        co_return false;
      }
      co_return co_await fail(400, "bad_request", "malformed request body: " + ec.message());
    }
  }
  stream_.expires_never();

  HttpRequest req;
  req.method = method;
  const std::string target = Str(msg.target());
  const size_t q = target.find('?');
  req.path = path;
  if (q != std::string::npos) req.query = target.substr(q + 1);
  for (const auto& f : msg) req.headers.emplace_back(Str(f.name_string()), Str(f.value()));
  req.body = std::move(msg.body());
  if (const auto ep = stream_.socket().remote_endpoint(ec); !ec) {
    req.remote = ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  // Respond: the handler (here, or on a worker) queues bytes through its Exchange.
  phase_ = Phase::kResponding;
  ++exchange_id_;
  out_.clear();
  done_ = false;
  on_close_ = nullptr;
  Dispatch(std::move(req));
  for (;;) {
    while (!out_.empty() && !closed_) {
      std::string bytes = std::move(out_.front());
      out_.pop_front();
      Watch();
      stream_.expires_after(o.write_timeout);
      co_await asio::async_write(stream_, asio::buffer(bytes),
                                 asio::redirect_error(asio::use_awaitable, ec));
      pending_ -= bytes.size();
      if (ec) {
        if (ec == beast::error::timeout) ++front_.stats_timeouts_;
        MarkClosed();
      }
    }
    if (closed_) co_return false;
    if (done_) break;
    Watch();
    co_await Wait();
  }
  stream_.expires_never();
  // Stop the watching read before the next parse reads the socket.
  while (watching_) {
    stream_.socket().cancel(ec);
    co_await Wait();
  }
  co_return !closed_ && keep_alive_ && http11_ && !front_.stopping_;
}

void HttpFront::Impl::Connection::Dispatch(HttpRequest req) {
  auto ex =
      std::make_shared<Exchange>(front_, shared_from_this(), exchange_id_, req.method, req.path);
  auto it = front_.routes_.find({req.method, req.path});
  // HEAD is served wherever GET is (RFC 9110 §9.3.2): the GET route runs, the body is not sent.
  if (it == front_.routes_.end() && req.method == "HEAD")
    it = front_.routes_.find({"GET", req.path});
  if (it == front_.routes_.end()) {
    std::string allow;  // the path's methods, for 405's Allow header
    for (const auto& [key, route] : front_.routes_) {
      if (key.second != req.path) continue;
      allow += (allow.empty() ? "" : ", ") + key.first;
      if (key.first == "GET") allow += ", HEAD";
    }
    const bool path_known = !allow.empty();
    const int status = path_known ? 405 : 404;
    auto [type, body] = front_.ErrorBody(status, path_known ? "method_not_allowed" : "not_found",
                                         (path_known ? "method " + req.method + " not allowed for "
                                                     : "no route " + req.method + " ") +
                                             req.path);
    HttpHeaders extra;
    if (path_known) extra.push_back({"Allow", allow});
    ex->Reply(status, type, body, extra);
    return;
  }
  if (front_.hooks_.before && front_.hooks_.before(req, *ex)) return;
  const RouteEntry& route = it->second;
  auto run = [&front = front_, handler = &route.handler](HttpRequest& r,
                                                         const std::shared_ptr<Exchange>& e) {
    try {
      (*handler)(r, e);
    } catch (const std::exception& x) {
      spdlog::error("{} {}: {}", r.method, r.path, x.what());
      auto [type, body] =
          front.ErrorBody(500, "internal_error", std::string("internal error: ") + x.what());
      e->Reply(500, type, body, {});
    } catch (...) {
      auto [type, body] = front.ErrorBody(500, "internal_error", "internal error");
      e->Reply(500, type, body, {});
    }
  };
  if (route.dispatch == HttpDispatch::kInline) {
    run(req, ex);
  } else {
    asio::post(front_.workers_, [run, r = std::move(req), ex]() mutable { run(r, ex); });
  }
}

asio::awaitable<void> HttpFront::Impl::Accept() {
  asio::steady_timer backoff(acceptor_.get_executor());
  while (!stopping_) {
    error_code ec;
    tcp::socket socket(asio::make_strand(io_));
    co_await acceptor_.async_accept(socket, asio::redirect_error(asio::use_awaitable, ec));
    if (stopping_) break;
    if (ec) {
      if (ec == asio::error::operation_aborted) break;
      // Out of descriptors (EMFILE/ENFILE) or a transient error: back off briefly, not spin.
      spdlog::warn("HTTP accept: {}", ec.message());
      backoff.expires_after(std::chrono::milliseconds(50));
      co_await backoff.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    ++stats_accepted_;
    if (stats_open_.load() >= options_.max_connections && !EvictForNew()) {
      ++stats_refused_;
      auto ex = socket.get_executor();
      asio::co_spawn(ex, Refuse(std::move(socket)), asio::detached);
      continue;
    }
    auto c = std::make_shared<Connection>(*this, std::move(socket));
    asio::co_spawn(c->strand(), c->Run(c), asio::detached);
  }
}

asio::awaitable<void> HttpFront::Impl::Refuse(tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  auto [type, body] = ErrorBody(503, "server_busy",
                                "the server has " + std::to_string(options_.max_connections) +
                                    " connections open (--max-connections); retry shortly");
  std::string bytes =
      Head(503, type, static_cast<int64_t>(body.size()), false, false, {{"Retry-After", "1"}}) +
      body;
  co_await WriteAndLinger(stream, bytes, std::chrono::seconds(1), std::chrono::seconds(1));
  error_code ec;
  stream.socket().close(ec);
}

bool HttpFront::Impl::EvictForNew() {
  // The longest-idle keep-alive connection; with none idle, the one that has been sending its
  // request longest, if for more than kSlowRequest: connections trickling their headers or
  // body must not hold every place (a new one — /health — gets it instead). Connections
  // being answered are never cut.
  constexpr auto kSlowRequest = std::chrono::seconds(1);
  std::shared_ptr<Connection> victim;
  bool idle = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    auto oldest_idle = std::chrono::steady_clock::time_point::max();
    auto oldest_reading = now - kSlowRequest;
    std::shared_ptr<Connection> slow;
    for (Connection* c : connections_) {
      if (c->evicting()) continue;  // one new connection, one victim (not the same one again)
      const Connection::Phase phase = c->phase();
      if (phase == Connection::Phase::kIdle && c->idle_since() < oldest_idle) {
        std::shared_ptr<Connection> s = c->weak_from_this().lock();
        if (!s) continue;
        oldest_idle = c->idle_since();
        victim = std::move(s);
      } else if (phase == Connection::Phase::kReading && c->reading_since() < oldest_reading) {
        std::shared_ptr<Connection> s = c->weak_from_this().lock();
        if (!s) continue;
        oldest_reading = c->reading_since();
        slow = std::move(s);
      }
    }
    idle = victim != nullptr;
    if (!victim) victim = std::move(slow);
  }
  if (!victim) return false;
  ++(idle ? stats_evicted_ : stats_evicted_slow_);
  victim->Cut();
  return true;
}

void HttpFront::Impl::Stop(std::chrono::milliseconds deadline) {
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  if (started_) {
    asio::post(acceptor_.get_executor(), [this] {
      error_code ec;
      acceptor_.close(ec);
    });
    auto each = [this](auto fn) {
      std::vector<std::shared_ptr<Connection>> all;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (Connection* c : connections_) {
          if (auto s = c->weak_from_this().lock()) all.push_back(std::move(s));
        }
      }
      for (auto& c : all) fn(*c);
    };
    // Idle and half-read connections go now; responses in progress until the deadline.
    each([](Connection& c) { c.CutUnlessResponding(); });
    {
      std::unique_lock<std::mutex> lock(mu_);
      drained_.wait_for(lock, deadline, [this] { return connections_.empty(); });
    }
    each([](Connection& c) { c.Cut(); });
    {
      std::unique_lock<std::mutex> lock(mu_);
      drained_.wait_for(lock, std::chrono::seconds(2), [this] { return connections_.empty(); });
    }
  }
  io_.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  workers_.join();
}

HttpFront::HttpFront(const HttpFrontOptions& options) : impl_(std::make_unique<Impl>(options)) {}
HttpFront::~HttpFront() = default;

void HttpFront::Route(std::string method, std::string path, HttpDispatch dispatch,
                      HttpHandler handler) {
  impl_->routes_[{std::move(method), std::move(path)}] = {dispatch, std::move(handler)};
}

void HttpFront::SetHooks(HttpFrontHooks hooks) { impl_->hooks_ = std::move(hooks); }

StatusOr<int> HttpFront::Bind(const std::string& host, int port) { return impl_->Bind(host, port); }

void HttpFront::Start() { impl_->Start(); }

void HttpFront::Stop(std::chrono::milliseconds deadline) { impl_->Stop(deadline); }

void HttpFront::Post(std::function<void()> task) { asio::post(impl_->workers_, std::move(task)); }

HttpFrontStats HttpFront::Stats() const {
  HttpFrontStats s;
  s.connections_open = impl_->stats_open_;
  s.connections_accepted = impl_->stats_accepted_;
  s.refused_over_limit = impl_->stats_refused_;
  s.idle_evicted = impl_->stats_evicted_;
  s.slow_evicted = impl_->stats_evicted_slow_;
  s.timeouts = impl_->stats_timeouts_;
  s.bad_requests = impl_->stats_bad_;
  s.client_disconnects = impl_->stats_disconnects_;
  return s;
}

}  // namespace oasis
