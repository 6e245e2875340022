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
// The code, by responsibility: router_settings.* (addresses, flags and --config),
// router_protocol.* (client bodies, instance bodies, errors, synthesized SSE), upstream_pool.*
// and upstream.* (forwarding: instances, health, dispatch; one upstream HTTP call),
// router_metrics.* (/metrics), this file (the HTTP front: routes, the generate exchange, the
// relay of the decode answer).
//
// Router owns its HttpListener (the httplib::Server and its worker threads), its UpstreamPool
// (one health thread per instance) and one thread per upstream call in flight. Bind() then
// Run() (blocking) on one thread, Stop() from any other; handlers run concurrently on the
// worker threads.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "oasis/status.h"
#include "router/router_metrics.h"
#include "router/router_protocol.h"
#include "router/router_settings.h"
#include "router/upstream_pool.h"

namespace httplib {
class DataSink;
struct Request;
struct Response;
}  // namespace httplib

namespace oasis {
class HttpListener;
}

namespace oasis::router {

class Router {
 public:
  using Role = router::Role;

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
  using Clock = std::chrono::steady_clock;

  void Routes();
  void HandleGenerate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  // After a prefill answer without a handoff: the request finished there; answers the client
  // with it (as SSE when streaming).
  void AnswerFinishedAtPrefill(httplib::Response& res, const ClientRequest& request,
                               const OrderedJson& answer, std::string body,
                               const std::string& content_type, Endpoint endpoint,
                               Clock::time_point arrival);
  // Sends B'' with the ticket to a decode instance and relays its answer to the client.
  void RelayDecode(httplib::Response& res, UpstreamRequest* up, const ClientRequest& request,
                   const std::string& ticket, Clock::time_point arrival);
  void HandleModels(const httplib::Request& req, httplib::Response& res);
  // Relays `call`'s body to the client; returns what the content provider returns.
  bool Relay(UpstreamCall& call, httplib::DataSink& sink, bool sse, bool record_ttft,
             Clock::time_point arrival, bool* first_byte_sent);

  RouterOptions options_;
  UpstreamPool pool_;
  RouterMetrics metrics_;
  std::unique_ptr<HttpListener> listener_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> run_started_{false};
};

}  // namespace oasis::router
