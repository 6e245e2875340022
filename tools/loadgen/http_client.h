// BenchClient: sends benchmark requests to one OpenAI-compatible server over HTTP/1.1
// (cpp-httplib), streaming the response into a StreamAccumulator as bytes arrive.
//
// Owns one httplib::Client, i.e. one keep-alive connection (reopened after an error). Not
// thread-safe: each worker thread has its own BenchClient.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "oasis/status.h"
#include "tools/loadgen/openai_stream.h"
#include "tools/loadgen/request_record.h"
#include "tools/loadgen/workload.h"

namespace httplib {
class Client;
}

namespace oasis::loadgen {

using BenchClock = std::chrono::steady_clock;

// "http://host:port/prefix" -> origin "http://host:port" and path prefix "/prefix" (no
// trailing slash; empty for none).
struct ServerAddress {
  std::string origin;
  std::string path_prefix;
};
StatusOr<ServerAddress> ParseBaseUrl(const std::string& url);

class BenchClient {
 public:
  // `timeout_s` bounds a whole request (connect + full stream).
  BenchClient(const ServerAddress& address, const std::string& api_key, double timeout_s);
  ~BenchClient();
  BenchClient(const BenchClient&) = delete;
  BenchClient& operator=(const BenchClient&) = delete;

  // Sends one streaming request for `prompt` to `path` (prefixed by the address's prefix).
  // Times are seconds since `epoch`. Never throws; every failure is in the record.
  RequestRecord Send(const std::string& path, const RequestOptions& options, const Prompt& prompt,
                     BenchClock::time_point epoch, bool save_text);

  // GET `path`, parsed as JSON (e.g. /v1/models).
  StatusOr<nlohmann::json> GetJson(const std::string& path);
  // POST `body` to `path`, the answer parsed as JSON (e.g. /tokenize). A non-200 answer is an
  // error: NotFound for 404 (no such route), else Unavailable, with the server's message.
  StatusOr<nlohmann::json> PostJson(const std::string& path, const nlohmann::json& body);

 private:
  std::string origin_;
  std::string prefix_;
  std::string api_key_;
  double timeout_s_;
  std::unique_ptr<httplib::Client> client_;
};

}  // namespace oasis::loadgen
