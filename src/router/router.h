// oasis-router: the front of disaggregated prefill/decode (docs/disaggregation.md §1). It holds
// no model: it speaks the OpenAI HTTP API to clients and sends each generation request first to
// a prefill instance (`oasis-server --role prefill`), then to a decode instance (`--role
// decode`), streaming the decode instance's answer back.
//
// Protocol, per POST /v1/completions or /v1/chat/completions with JSON object body B:
//   1. B must be a JSON object (else 400); `n` (when present) must be 1 and `best_of` at most 1
//      (else 400 "n > 1 is not supported by the disaggregated router"); stream = B.stream.
//   2. Prefill: POST {prefill}/v1/<same path> with B' = B, "stream": false, no stream_options,
//      and the client's Authorization header.
//      - connection failure, 429 or 503: the next prefill instance (each at most once); all
//        failed: 503 naming the instances tried and why;
//      - any other non-200: status and body relayed to the client as they are;
//      - 200 with a string "oasis_handoff" (a base64 ticket): step 3;
//      - 200 without it: the request finished on the prefill instance. Not streaming: that
//        response as is. Streaming: the equivalent SSE stream (SynthesizeSse).
//   3. Decode: POST {decode}/v1/<same path> with B'' = B + "oasis_ticket": <the ticket> and
//      the Authorization header. Status, Content-Type and body are relayed as they arrive
//      (chunked transfer, streamed or not; never buffered whole). A client that goes away
//      (a failed write, or its socket found closed while the instance is silent) closes the
//      upstream connection, and the decode instance aborts the request. Connection failure,
//      429 or 503 before any byte reached the client: the next decode instance with the same
//      body; all failed: 503. An answer that breaks off midway ends the client's response
//      unterminated (SSE: after an error event).
//      A client that goes away during the prefill call is only noticed once the decode
//      answer is relayed (the prefill call runs to its end).
//   4. Instances: round-robin per role over the healthy ones (all of them when none is). A
//      thread per instance polls GET /health every second (1 s timeout): 200 = healthy. A
//      connection failure during a request marks the instance unhealthy until the next
//      successful poll. Instances start healthy (optimistic) until their first poll.
//   5. GET /v1/models: relayed from a healthy decode instance. GET /health: 200 (503 unless
//      each role has a healthy instance) with {"prefill":[{"address","healthy"}...],
//      "decode":[...]}. GET /metrics: Prometheus text, prefix oasis:router_. Others: 404.
//   6. Errors: {"error":{"message","type","param":null,"code":<status>}}; every handler catches
//      everything. --api-key: clients need "Authorization: Bearer KEY" (not /health, /metrics);
//      the header is forwarded to the instances unchanged.
//
// Router owns an httplib::Server, its worker threads, one health thread per instance and one
// thread per upstream call in flight. Bind() then Run() (blocking) on one thread, Stop() from
// any other; handlers run concurrently on the worker threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "oasis/status.h"

namespace httplib {
class Server;
class DataSink;
struct Request;
struct Response;
}  // namespace httplib

namespace oasis::router {

using OrderedJson = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// Addresses.

struct Address {
  std::string host;
  int port = 0;
  std::string ToString() const;  // "host:port" ("[v6]:port")
  bool operator==(const Address&) const = default;
};

// "host:port", "[::1]:port" or "http://host:port[/]"; the port must be in [1, 65535].
// Errors name the value.
StatusOr<Address> ParseAddress(std::string_view text);
// A comma-separated list of addresses (blanks around entries ignored; no empty entries).
// `what` names the list in errors ("--prefill").
StatusOr<std::vector<Address>> ParseAddressList(std::string_view text, const std::string& what);

// ---------------------------------------------------------------------------------------------
// Settings and command line.

struct RouterOptions {
  std::vector<Address> prefill;
  std::vector<Address> decode;
  std::string api_key;           // empty: no authentication
  double timeout_s = 600;        // upstream read timeout
  double connect_timeout_s = 5;  // upstream connect timeout
  int64_t http_threads = 256;    // the HTTP server's worker threads (one per open request)
  int64_t max_body_bytes = 32 << 20;
  int health_interval_ms = 1000;  // GET /health of every instance this often
  int health_timeout_ms = 1000;
};

// Everything the command line and --config give (the flag names, '-' or '_' in the file).
struct RouterSettings {
  std::string prefill;  // comma-separated host:port list (an array in the config file)
  std::string decode;
  std::string host = "127.0.0.1";
  int64_t port = 8000;  // 0: any free port
  std::string api_key;
  double timeout_s = 600;
  double connect_timeout_s = 5;
  int64_t http_threads = 256;
  int64_t max_body_bytes = 32 << 20;
  std::string log_level = "info";

  // Range checks and address parsing.
  StatusOr<RouterOptions> ToOptions() const;
};

struct RouterCommandLine {
  RouterSettings settings;
  RouterOptions options;  // valid unless help
  bool help = false;
  std::string usage;
};

// A JSON object of settings (the config file's contents) applied to `settings`; unknown keys and
// wrong types are errors naming the key.
Status ApplyRouterConfigJson(const nlohmann::json& json, const std::string& source, RouterSettings* settings);
// Reads --config FILE (when given), applies the other flags on top, validates.
StatusOr<RouterCommandLine> ParseRouterCommandLine(int argc, char** argv);

// ---------------------------------------------------------------------------------------------
// Pure protocol helpers.

enum class Endpoint { kCompletions, kChatCompletions };

// {"error":{"message","type","param":null,"code":status}}; type "invalid_request_error" for 4xx,
// "service_unavailable" for 503, "server_error" for other 5xx.
OrderedJson ErrorJson(int status, const std::string& message);

struct ClientRequest {
  OrderedJson body;  // B, the client's body as sent (key order kept)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage == true
};
// Parses and checks a client body. On failure returns nullopt with `*status` / `*message`.
std::optional<ClientRequest> ParseClientRequest(const std::string& text, int* status, std::string* message);

// B' for the prefill instance: B with "stream": false and without "stream_options".
OrderedJson PrefillBody(const OrderedJson& client_body);
// B'' for the decode instance: B plus "oasis_ticket": ticket.
OrderedJson DecodeBody(const OrderedJson& client_body, const std::string& ticket);

// The SSE stream equivalent to a finished (non-streamed) completion or chat completion
// response: one chunk with the whole text, a usage chunk when include_usage, then [DONE].
std::string SynthesizeSse(const OrderedJson& response, Endpoint endpoint, bool include_usage);

// ---------------------------------------------------------------------------------------------
// Metrics.

// Prometheus histogram with fixed bounds (seconds). Thread-compatible (the Router locks).
struct Histogram {
  std::vector<double> bounds;
  std::vector<int64_t> counts;  // bounds.size() + 1 (the last is +Inf)
  double sum = 0;
  int64_t count = 0;
  Histogram();
  void Observe(double seconds);
  std::string Render(const std::string& name, const std::string& help) const;
};

// ---------------------------------------------------------------------------------------------
// The router.

class UpstreamCall;
struct UpstreamRequest;

class Router {
 public:
  enum class Role { kPrefill, kDecode };

  explicit Router(RouterOptions options);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Binds host:port (port 0: any free port); returns the bound port.
  StatusOr<int> Bind(const std::string& host, int port);
  // Starts the health threads and serves until Stop(). False when the server failed.
  bool Run();
  // Stops Run() (waits a few seconds for it to have started listening first); cancels the
  // upstream calls in flight. Idempotent.
  void Stop();

  // The /health body and whether it is a 200.
  OrderedJson HealthJson(bool* all_roles_healthy) const;
  std::string RenderMetrics() const;
  bool InstanceHealthy(Role role, size_t index) const;

 private:
  struct Instance {
    Role role;
    Address address;
    std::string label;  // "host:port"
    std::atomic<bool> healthy{true};
    std::atomic<int64_t> failures{0};
  };
  struct Pool {
    std::vector<std::unique_ptr<Instance>> instances;
    std::atomic<uint64_t> next{0};
  };
  // The outcome of Dispatch: a call whose headers arrived with a status other than 429/503
  // (its body may still be arriving), or none and `failures` says why.
  struct Dispatched {
    std::shared_ptr<UpstreamCall> call;
    Instance* instance = nullptr;
    std::string failures;
  };

  void Routes();
  void HealthLoop(Instance* instance);
  // The instances to try, in order: the healthy ones round-robin (all when none is healthy);
  // `skipped` receives the unhealthy ones left out.
  std::vector<Instance*> Candidates(Role role, std::vector<Instance*>* skipped);
  // Tries the role's instances in turn. `buffered`: wait for the whole answer (a transport
  // failure while reading it counts as a failure of that instance too).
  Dispatched Dispatch(Role role, const UpstreamRequest& request, bool buffered);
  void CountFailure(Instance* instance, const std::string& why, bool connection_failure);
  void HandleGenerate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  void HandleModels(const httplib::Request& req, httplib::Response& res);
  // Relays `call`'s body to the client; returns what the content provider returns.
  bool Relay(UpstreamCall& call, httplib::DataSink& sink, bool sse, bool record_ttft,
             std::chrono::steady_clock::time_point arrival, bool* first_byte_sent);
  void CountRequest(const std::string& route, int status);

  RouterOptions options_;
  Pool prefill_, decode_;
  std::unique_ptr<httplib::Server> server_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> run_started_{false};
  std::atomic<bool> run_exited_{false};

  std::mutex health_mu_;
  std::condition_variable health_cv_;
  bool health_stop_ = false;  // guarded by health_mu_
  std::vector<std::thread> health_threads_;

  mutable std::mutex metrics_mu_;
  std::map<std::tuple<std::string, int>, int64_t> requests_;
  int64_t handoffs_ = 0;
  int64_t finished_at_prefill_ = 0;
  int64_t client_disconnects_ = 0;
  Histogram ttft_;
  Histogram prefill_seconds_;
};

}  // namespace oasis::router
