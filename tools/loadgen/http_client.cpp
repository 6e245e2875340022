// BenchClient: see http_client.h.
#include "tools/loadgen/http_client.h"

#include <httplib.h>

#include <cmath>

namespace oasis::loadgen {

namespace {

double SecondsSince(BenchClock::time_point epoch) {
  return std::chrono::duration<double>(BenchClock::now() - epoch).count();
}

// httplib's error names are terse ("Connection"); say what happened.
std::string DescribeError(httplib::Error error, const std::string& origin) {
  switch (error) {
    case httplib::Error::Connection:
      return "cannot connect to " + origin;
    case httplib::Error::Read:
      return "connection closed or read failed mid-response";
    case httplib::Error::Write:
      return "write failed (connection closed)";
    case httplib::Error::ConnectionTimeout:
      return "connect to " + origin + " timed out";
    default:
      return httplib::to_string(error);
  }
}

}  // namespace

StatusOr<ServerAddress> ParseBaseUrl(const std::string& url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) {
    return InvalidArgument("--base-url '" + url + "' needs a scheme (http:// or https://)");
  }
  const std::string scheme = url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") {
    return InvalidArgument("--base-url '" + url + "': scheme must be http or https");
  }
  const size_t host_start = scheme_end + 3;
  const size_t path_start = url.find('/', host_start);
  ServerAddress address;
  address.origin = url.substr(0, path_start);
  if (address.origin.size() == host_start) {
    return InvalidArgument("--base-url '" + url + "' has no host");
  }
  if (path_start != std::string::npos) {
    address.path_prefix = url.substr(path_start);
    while (!address.path_prefix.empty() && address.path_prefix.back() == '/') {
      address.path_prefix.pop_back();
    }
  }
  return address;
}

BenchClient::BenchClient(const ServerAddress& address, const std::string& api_key, double timeout_s)
    : origin_(address.origin),
      prefix_(address.path_prefix),
      api_key_(api_key),
      timeout_s_(timeout_s),
      client_(std::make_unique<httplib::Client>(address.origin)) {
  const auto timeout = std::chrono::duration<double>(timeout_s);
  const auto connect = std::chrono::duration<double>(std::min(timeout_s, 30.0));
  client_->set_connection_timeout(std::chrono::duration_cast<std::chrono::microseconds>(connect));
  client_->set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  client_->set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  client_->set_keep_alive(true);
  // httplib writes the headers and the body separately: with Nagle on a reused connection the
  // body waits for the server's delayed ACK (~40 ms added to every TTFT after the first).
  client_->set_tcp_nodelay(true);
}

BenchClient::~BenchClient() = default;

RequestRecord BenchClient::Send(const std::string& path, const RequestOptions& options,
                                const Prompt& prompt, BenchClock::time_point epoch,
                                bool save_text) {
  const double start = SecondsSince(epoch);
  StreamAccumulator stream(options.type, prompt, start, save_text);
  auto body = BuildRequestBody(options, prompt);
  if (!body.ok()) {
    RequestRecord record;
    record.start_s = start;
    record.failure = FailureKind::kStreamError;
    record.error = "request not sent: " + body.status().message();
    return record;
  }

  httplib::Request req;
  req.method = "POST";
  req.path = prefix_ + path;
  req.body = body->dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  if (!api_key_.empty()) req.set_header("Authorization", "Bearer " + api_key_);

  int status = 0;
  std::string error_body;
  bool timed_out = false;
  req.response_handler = [&](const httplib::Response& response) {
    status = response.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const double now = SecondsSince(epoch);
    if (status / 100 != 2) {
      if (error_body.size() < 65536) error_body.append(data, n);
    } else {
      stream.OnBytes(std::string_view(data, n), now);
      if (stream.failed()) return false;  // an error event: no need to read on
    }
    if (now - start > timeout_s_) {
      timed_out = true;
      return false;
    }
    return true;
  };

  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client_->send(req, response, error);
  const double end = SecondsSince(epoch);

  if (status / 100 == 2 && (sent || stream.failed()) && !timed_out) {
    // A stream error event closes the stream early on purpose; Finish reports it.
    return stream.Finish(end);
  }
  RequestRecord record;
  record.start_s = start;
  record.e2el_s = end - start;
  record.prompt_tokens = prompt.prompt_len;
  record.expected_output_tokens = prompt.output_len;
  record.http_status = status;
  if (timed_out || (!sent && end - start >= timeout_s_)) {
    record.failure = FailureKind::kTimeout;
    record.error = "no complete response within " + std::to_string(timeout_s_) + " s";
  } else if (!sent) {
    record.failure = FailureKind::kConnection;
    record.error = DescribeError(error, origin_);
  } else {
    record.failure = FailureKind::kHttpStatus;
    record.error = ErrorMessageFromBody(error_body.empty() ? response.body : error_body);
  }
  return record;
}

StatusOr<nlohmann::json> BenchClient::GetJson(const std::string& path) {
  httplib::Headers headers;
  if (!api_key_.empty()) headers.emplace("Authorization", "Bearer " + api_key_);
  auto result = client_->Get(prefix_ + path, headers);
  if (!result) {
    return Unavailable("GET " + prefix_ + path + ": " + DescribeError(result.error(), origin_));
  }
  if (result->status != 200) {
    return Unavailable("GET " + prefix_ + path + ": HTTP " + std::to_string(result->status) + ": " +
                       ErrorMessageFromBody(result->body));
  }
  nlohmann::json j = nlohmann::json::parse(result->body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("GET " + prefix_ + path + ": not JSON");
  return j;
}

StatusOr<nlohmann::json> BenchClient::PostJson(const std::string& path,
                                               const nlohmann::json& body) {
  httplib::Headers headers;
  if (!api_key_.empty()) headers.emplace("Authorization", "Bearer " + api_key_);
  const std::string where = "POST " + prefix_ + path;
  auto result = client_->Post(prefix_ + path, headers, body.dump(), "application/json");
  if (!result) return Unavailable(where + ": " + DescribeError(result.error(), origin_));
  if (result->status != 200) {
    const std::string message = where + ": HTTP " + std::to_string(result->status) + ": " +
                                ErrorMessageFromBody(result->body);
    return result->status == 404 ? NotFound(message) : Unavailable(message);
  }
  nlohmann::json j = nlohmann::json::parse(result->body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(where + ": not JSON");
  return j;
}

}  // namespace oasis::loadgen
