// StagingServer: the prefill node's UCX side of a StagingPool.
//
// Listens on a TCP socket address (ucp_listener; port 0 picks a free port, reported by
// address()/port()), accepts decode nodes' endpoints, and runs one progress thread that
//   - serves RMA gets into the pool (with software-emulated RMA, e.g. over TCP, the target
//     side must progress for a get to complete; with CMA or RDMA it need not),
//   - answers kHello with the pool's serialized descriptor when the hello carries the shared
//     secret (CheckHello, constant-time); a refused hello gets kHelloRefused, and the
//     endpoint is closed `refusal_grace` later (sooner when the peer closes it),
//   - applies kRenew / kComplete / kAbort lease messages to the pool, from endpoints whose
//     hello it accepted only (others are counted and ignored),
//   - closes endpoints that have not said an accepted hello within `hello_timeout`,
//   - releases expired leases every `sweep_interval`,
//   - closes endpoints whose peer failed (a killed decode node: its leases then expire).
//
// Security: a listener reachable from other machines (an address that is not loopback)
// needs a secret: Start refuses it otherwise. The secret gates the pool's descriptor (its
// address and remote key, which RMA needs) and lease control; UCX itself does not
// authenticate RMA, so the staging network should still be one the operator trusts
// (docs/disaggregation.md).
//
// Ownership: owns its worker, listener, endpoints and thread; borrows the pool, which must
// outlive the server. Thread-safe: address(), port(), Stats() from any thread; everything
// UCX happens on the server's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "disagg/staging_pool.h"
#include "disagg/ucx.h"

namespace oasis::disagg {

struct StagingServerOptions {
  std::string listen_address = "127.0.0.1:0";     // host:port; port 0 = pick one
  std::chrono::milliseconds sweep_interval{100};  // lease-expiry check period
  // The shared secret a reader's hello must carry (at most kMaxSecretBytes). Empty: none is
  // asked, which Start allows on a loopback address only.
  std::string secret{};
  // An endpoint without an accepted hello is closed after this long.
  std::chrono::milliseconds hello_timeout{30000};
  // A refused endpoint is closed this long after its kHelloRefused was sent.
  std::chrono::milliseconds refusal_grace{500};
};

struct StagingServerStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_open = 0;
  uint64_t connections_failed = 0;  // closed because the peer failed or vanished
  uint64_t hellos = 0;              // accepted hellos (the descriptor was sent)
  uint64_t hellos_refused = 0;      // wrong or missing secret, another version, malformed
  uint64_t hello_timeouts = 0;      // endpoints closed for saying no accepted hello in time
  uint64_t unauthenticated = 0;     // lease messages from endpoints without an accepted hello
  uint64_t lease_messages = 0;      // kRenew / kComplete / kAbort messages received
  uint64_t unknown_leases = 0;      // ids in those messages that named no live lease
  uint64_t gone_replies = 0;        // kLeaseGone answers sent (renewals of unknown leases)
  uint64_t bad_messages = 0;        // malformed payloads, unexpected rendezvous data
};

class StagingServer {
 public:
  static StatusOr<std::unique_ptr<StagingServer>> Start(std::shared_ptr<UcxContext> context,
                                                        StagingPool* pool,
                                                        const StagingServerOptions& options);
  // Stops the thread and force-closes every endpoint.
  ~StagingServer();
  StagingServer(const StagingServer&) = delete;
  StagingServer& operator=(const StagingServer&) = delete;

  // The bound address, "host:port" (the port is the real one when 0 was asked for).
  const std::string& address() const { return address_; }
  uint16_t port() const { return port_; }
  StagingServerStats Stats() const;

 private:
  StagingServer(std::shared_ptr<UcxContext> context, StagingPool* pool,
                StagingServerOptions options);
  Status Listen();
  void Run();
  // One accepted endpoint (server thread only).
  struct Endpoint {
    ucp_ep_h ep = nullptr;
    std::string peer;  // the client's address, for logs
    Clock::time_point accepted{};
    bool authenticated = false;  // said a hello the server accepted
    bool refused = false;        // said a hello the server refused: closed at close_at
    Clock::time_point close_at{};
  };
  Endpoint* FindEndpoint(ucp_ep_h ep);
  void HandleConnections();
  void CloseFailedEndpoints();
  // Closes refused endpoints past their grace and unauthenticated ones past hello_timeout.
  void CloseOverdueEndpoints(Clock::time_point now);
  // Removes `ep` from the endpoints and force-closes it.
  void CloseEndpoint(ucp_ep_h ep);
  void CloseAll();

  static void OnConnRequest(ucp_conn_request_h request, void* arg);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnHello(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param);
  template <ControlMessage kMessage>
  static ucs_status_t OnLeaseMessage(void* arg, const void* header, size_t header_length,
                                     void* data, size_t length, const ucp_am_recv_param_t* param);
  void ApplyLeaseMessage(ControlMessage message, const void* data, size_t length,
                         const ucp_am_recv_param_t* param);

  std::shared_ptr<UcxContext> context_;
  StagingPool* const pool_;
  const StagingServerOptions options_;
  const std::string descriptor_bytes_;  // the kHelloReply payload (lives as long as sends)
  std::unique_ptr<UcxWorker> worker_;
  ucp_listener_h listener_ = nullptr;
  std::string address_;
  uint16_t port_ = 0;
  int wake_fd_ = -1;

  // Server thread only.
  std::vector<ucp_conn_request_h> conn_requests_;
  std::vector<Endpoint> endpoints_;
  std::vector<ucp_ep_h> failed_endpoints_;
  std::vector<ucp_ep_h> hello_replies_;
  std::vector<std::pair<ucp_ep_h, HelloRefusal>> hello_refusals_;
  // kLeaseGone answers to send: (the renewing endpoint, encoded ids), then their payloads
  // (and kHelloRefused's) while the sends may be in flight (dropped once requests_ is done).
  std::vector<std::pair<ucp_ep_h, std::string>> gone_replies_;
  std::deque<std::string> reply_payloads_;  // a deque: pushing never moves the others
  RequestBatch requests_;                   // replies and closes in flight

  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex stats_mu_;
  StagingServerStats stats_;
};

}  // namespace oasis::disagg
