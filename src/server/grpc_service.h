// GrpcFrontend: the gRPC API of proto/oasis.proto — server-streaming Generate, Health,
// ListModels — on grpc++'s synchronous server. Generate requests go through the same
// validation as /v1/completions (the proto is mapped to the same JSON fields and parsed by
// ParseCompletionRequest); errors are gRPC status codes; cancelling the call aborts the
// engine request. With an API key, calls need `authorization: Bearer <key>` metadata.
//
// Owns the grpc::Server and the service. Start() once, Shutdown() from any thread; the
// service's handlers run on grpc's threads and only use the thread-safe Service.
#pragma once

#include <memory>
#include <string>

#include "oasis/status.h"
#include "server/serving.h"

namespace grpc {
class Server;
}

namespace oasis::server {

class OasisGrpcService;

class GrpcFrontend {
 public:
  explicit GrpcFrontend(Service& service);
  ~GrpcFrontend();

  // Listens on host:port (insecure credentials); returns the bound port.
  StatusOr<int> Start(const std::string& host, int port);
  void Shutdown();

 private:
  Service& service_;
  std::unique_ptr<OasisGrpcService> impl_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace oasis::server
