// GrpcFrontend: the gRPC API of proto/oasis.proto — server-streaming Generate, Health,
// ListModels — plus the standard grpc.health.v1.Health service, on grpc++'s callback API.
// Generate requests go through the same validation as /v1/completions (the proto is mapped
// to the same JSON fields and parsed by ParseCompletionRequest); errors are gRPC status codes
// that always carry a message; cancelling the call (or its deadline, or a disconnect) aborts
// the engine request at once. With an API key, oasis.v1 calls need
// `authorization: Bearer <key>` metadata (the standard health service stays open).
//
// Threads: no call holds a thread. Handlers run on grpc's callback threads and return at
// once (validation and tokenizing are bounded by --max-body-bytes). A live Generate stream is
// a reactor owned by one of kPumpThreads pump threads, which takes its GenerationJob's events
// without blocking (Poll) when the engine wakes it (GenerationJob::SetWakeup) and writes the
// next event when the previous write has completed; an idle pump sleeps at most
// kPumpIdleWait between passes (woken by engine events, write completions, cancellations and
// new streams), and polls every stream at least every 50 ms as a safety net. (Blocking in a
// reactor callback would stall grpc's few callback threads.) Live
// streams are bounded by --grpc-max-concurrent-calls: past it new Generate calls finish at once
// with RESOURCE_EXHAUSTED. A server loading or shutting down answers every new Generate call
// UNAVAILABLE before that check. request_id is at most kMaxRequestIdBytes.
//
// Start() once, Shutdown() once from any thread (the destructor calls it).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "oasis/status.h"
#include "server/serving.h"

namespace grpc {
class Server;
}

namespace oasis::server {

class OasisGrpcService;
class GrpcPump;

class GrpcFrontend {
 public:
  // Pump threads that drive every live Generate stream, and their longest idle sleep.
  static constexpr int kPumpThreads = 2;
  static constexpr std::chrono::milliseconds kPumpIdleWait{20};
  // GenerateRequest.request_id, a client's label echoed in every response: at most this many
  // bytes (longer: INVALID_ARGUMENT).
  static constexpr size_t kMaxRequestIdBytes = 256;

  explicit GrpcFrontend(Service& service);
  ~GrpcFrontend();
  GrpcFrontend(const GrpcFrontend&) = delete;
  GrpcFrontend& operator=(const GrpcFrontend&) = delete;

  // Listens on host:port (insecure credentials); returns the bound port. The health services
  // say NOT_SERVING until the Service has a model, SERVING while it has one and NOT_SERVING
  // again once shutdown begins (polled by the pumps, so they follow Service::Publish and
  // Service::BeginShutdown within a few milliseconds).
  StatusOr<int> Start(const std::string& host, int port);
  // Refuses new calls (UNAVAILABLE), health NOT_SERVING, ends every live stream with
  // UNAVAILABLE "the server is shutting down" (aborting its engine request), and returns once
  // grpc's server has stopped: within `timeout` plus the few milliseconds the pumps take to
  // finish the calls grpc cancels at the deadline (a client that stopped reading cannot hold
  // it). Idempotent.
  void Shutdown(std::chrono::milliseconds timeout = std::chrono::seconds(10));

  // Generate streams live now (tests and logs).
  int64_t live_calls() const;

 private:
  Service& service_;
  std::unique_ptr<OasisGrpcService> impl_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace oasis::server
