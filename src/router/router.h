// oasis-router: the front of disaggregated prefill/decode (docs/disaggregation.md §1). It holds
// no model: it speaks the OpenAI HTTP API to clients and sends each generation request first to
// a prefill instance (`oasis-server --role prefill`), then to a decode instance (`--role
// decode`), streaming the decode instance's answer back.
//
// Protocol, per POST /v1/completions or /v1/chat/completions with JSON object body B:
//   1. B must be a JSON object (else 400); `n` (when present) must be 1 and `best_of` at most 1
//      (else 400 "n > 1 ..." / "best_of > 1 is not supported by the disaggregated router");
//      stream = B.stream; stream_options checked by the instances' rules (ParseClientRequest).
//   2. Prefill: first, with no healthy decode instance: 503 with Retry-After at once (no prefill
//      instance stages KV that no decode instance would take). POST {prefill}/v1/<same path>
//      with B' = B, "stream": false, no stream_options, and the client's Authorization header.
//      - connection failure, connection closed before the whole answer, 429 or 503: the next
//        healthy prefill instance (each at most once); all failed: 503 (Retry-After) naming
//        the instances tried and why (502 when one broke its answer off);
//      - no answer within the first-byte timeout: 504, not retried (§7);
//      - any other non-200: status and body relayed to the client as they are;
//      - 200 with a string "oasis_handoff" (a base64 ticket): step 3 (a ticket that does not
//        parse: 502 "prefill instance HOST:PORT returned a malformed ticket");
//      - 200 without it: the request finished on the prefill instance. Not streaming: that
//        response as is. Streaming: the equivalent SSE stream (SynthesizeSse).
//   3. Decode: POST {decode}/v1/<same path> with B'' = B + "oasis_ticket": <the ticket> and
//      the Authorization header. Connection failure, connection closed or 429/503 before the
//      answer's headers: the next healthy decode instance with the same body; all failed: 503
//      (Retry-After), 502 or 504 as in step 2.
//      - Not streaming: the answer is taken whole (bounded by --timeout-s: it comes at the end
//        of the generation), then relayed with its status; an answer that breaks off or stalls
//        is a 502 / 504 error instead.
//      - Streaming: status and Content-Type relayed once the headers arrive, then the body as
//        it arrives (chunked, never buffered whole; SSE events relayed whole, never half). A
//        client that goes away (a failed write, or its socket found closed while the instance
//        is silent) closes the upstream connection, and the decode instance aborts the
//        request. An answer that breaks off (connection closed or reset), stalls (§7) or is
//        cut by the router stopping ends the client's stream with an error event
//        `data: {"error":{...}}` (code 502, 504 or 503) and `data: [DONE]` (unless [DONE] was
//        relayed already), properly terminated: never silently truncated. No retry once
//        the headers went to the client.
//      A decode leg that refuses (an answer other than 200) or fails before an instance took
//      the request (all refused 429/503 or unreachable) has its staged lease aborted on the
//      prefill instance at once (LeaseAborter, kAbort over UCX), after the client's answer.
//      A client that goes away at any moment (during the prefill call, before the decode
//      answer's headers, while it is relayed) is noticed within 50 ms: the upstream call in
//      progress is cancelled (the instance sees the connection closed and aborts the request).
//   4. Instances: round-robin per role over the healthy ones; none healthy: nothing is tried
//      (503 with Retry-After: the health interval, at least 1 s). A thread per instance polls
//      GET /health every second (1 s timeout): 200 with the list's "role" (if named) = healthy. A
//      failed call (connection failure, closed, timed out) marks the instance unhealthy until the
//      next successful poll; a call still waiting for its answer's headers from an instance marked
//      unhealthy is given up and the next instance tried. Instances start healthy (optimistic)
//      until their first poll.
//   5. GET /v1/models: relayed from a healthy decode instance. GET /health: 200 (503 unless
//      each role has a healthy instance) with {"prefill":[{"address","healthy"}...],
//      "decode":[...]}. GET /metrics: Prometheus text, prefix oasis:router_. Others: 404.
//   6. Errors: {"error":{"message","type","param":null,"code":<status>}}; every handler catches
//      everything. --api-key: clients need "Authorization: Bearer KEY" (not /health, /metrics);
//      the header is forwarded to the instances unchanged.
//   7. Upstream timeouts (UpstreamCall): --connect-timeout-s (5); --upstream-first-byte-timeout-s
//      (300), from the call's start to the first byte of the answer's body (a prefill:
//      queueing and the whole prefill; a stream: admission and the first token);
//      --upstream-idle-timeout-s (60), the longest silence between two pieces of an answer
//      once it started; --timeout-s (600) replaces the first-byte timeout for a non-streamed
//      decode answer (it comes whole at the end) and bounds sending a request. Every failure
//      path cancels the upstream call (its socket closed, its thread joined when the last
//      holder lets go).
//
// The code, by responsibility: router_settings.* (addresses, flags and --config),
// router_protocol.* (client bodies, instance bodies, errors, synthesized SSE), upstream_pool.*
// and upstream.* (forwarding: instances, health, dispatch; one upstream HTTP call),
// router_metrics.* (/metrics), this file (the HTTP front: routes, the generate exchange, the
// relay of the decode answer).
//
//   8. The client side is HttpFront (common/http_front.h), as oasis-server's: connections hold no
//      thread; --max-connections, the header, body, keep-alive and write timeouts apply
//      (docs/server.md, "Limits and timeouts"). A request in flight holds one thread while it
//      waits on its instances and relays their answer (and its upstream call holds another);
//      at most --http-threads run at once, more get 503 with Retry-After at once. /health and
//      /metrics run on the I/O threads. Stop: new requests get 503, live streams end with an
//      error event (503) and [DONE] within --shutdown-timeout-s, then connections are cut.
//
// Router owns its HttpFront, its UpstreamPool (one health thread per instance) and its
// request threads. Bind() then Run() (blocking) on one thread, Stop() from any other.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "oasis/status.h"
#include "router/lease_aborter.h"
#include "router/router_metrics.h"
#include "router/router_protocol.h"
#include "router/router_settings.h"
#include "router/upstream_pool.h"

namespace oasis {
class HttpExchange;
class HttpFront;
struct HttpRequest;
}  // namespace oasis

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
  // Starts the health threads and the HTTP front, and serves until Stop(); then lets live
  // answers end (--shutdown-timeout-s) and joins every thread. False when it could not start.
  // Returns at once when Stop() came first.
  bool Run();
  // Stops Run() from any thread: new requests get 503, upstream calls in flight are cancelled
  // and live streams end with an error event and [DONE]. Idempotent.
  void Stop();

  // The /health body and whether it is a 200.
  OrderedJson HealthJson(bool* all_roles_healthy) const;
  std::string RenderMetrics() const;
  bool InstanceHealthy(Role role, size_t index) const;

 private:
  using Clock = std::chrono::steady_clock;
  using Exchange = std::shared_ptr<HttpExchange>;
  using Handler = std::function<void(const HttpRequest&, const Exchange&)>;

  void Routes();
  // Runs `handler` on a request thread of its own, or answers 503 (Retry-After) at once when
  // --http-threads requests are in flight or the router is stopping.
  void Launch(HttpRequest& req, const Exchange& ex, Handler handler);
  // Joins the request threads that ended (`all`: every one, waiting for them).
  void JoinRequestThreads(bool all);
  // Whether the request in progress should be given up: the router is stopping, or the client
  // closed its connection.
  bool GiveUp(const HttpExchange& ex) const;

  void HandleGenerate(const HttpRequest& req, const Exchange& ex, Endpoint endpoint);
  // After a prefill answer without a handoff: the request finished there; answers the client
  // with it (as SSE when streaming).
  void AnswerFinishedAtPrefill(HttpExchange& ex, const ClientRequest& request,
                               const OrderedJson& answer, std::string body,
                               const std::string& content_type, Endpoint endpoint,
                               Clock::time_point arrival);
  // Sends B'' with the ticket to a decode instance and relays its answer to the client.
  // False when no decode instance holds the lease any more: every one refused or failed
  // before taking the request, or the one that answered did so with a status other than 200.
  bool RelayDecode(const Exchange& ex, UpstreamRequest* up, const ClientRequest& request,
                   const std::string& ticket, Clock::time_point arrival);
  // A failed Dispatch as the client's answer: its status (503 with Retry-After) and a
  // message (`unavailable` starts a 503's). Nothing when the client went away.
  void SendDispatchError(HttpExchange& ex, const UpstreamPool::Dispatched& d,
                         const std::string& unavailable);
  // Aborts the staged lease of a request whose decode leg failed (LeaseAborter); logged.
  void AbortLease(const TicketLease& lease, const std::string& prefill_label);
  void HandleModels(const HttpRequest& req, const Exchange& ex);
  // Relays `call`'s body (decode instance `index`) to the client, whose response has started.
  void Relay(UpstreamCall& call, size_t index, HttpExchange& ex, bool sse, bool record_ttft,
             Clock::time_point arrival);

  RouterOptions options_;
  RouterMetrics metrics_;  // before pool_, which counts into it
  UpstreamPool pool_;
  LeaseAborter aborter_;
  std::unique_ptr<HttpFront> front_;
  std::atomic<bool> stopping_{false};

  struct RequestThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_requested_ = false;       // guarded by mu_
  bool running_ = false;              // guarded by mu_: Run() is serving
  std::list<RequestThread> threads_;  // guarded by mu_
};

}  // namespace oasis::router
