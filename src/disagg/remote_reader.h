// RemoteReader: the decode node's connection to one prefill node's StagingServer.
//
// Connect() opens a UCX client endpoint to the server's "host:port", says kHello (with the
// shared secret of the options), receives the pool's StagingDescriptor and unpacks its remote
// key; a server that refuses the hello (kHelloRefused) makes Connect fail with
// kFailedPrecondition saying why (wrong or missing secret, another protocol version); a
// transport failure before the pool answers is retried (6 attempts, pauses doubling from 0.1 s,
// within connect_timeout). Fetch() then copies staging-pool blocks into local memory with RMA gets
// (ucp_get_nbx): runs of consecutive remote blocks that land in consecutive local memory become one
// get, every get of a call is in flight at once, and the call waits for all of them until its
// deadline. Renew/Complete/Abort send the lease messages that keep a request's staged KV alive and
// end it.
//
// Failure: a dead peer, a timeout or a bad argument comes back as a Status, never a crash or
// an unbounded wait. After a transport failure or a timeout the endpoint is force-closed (so
// no get can still write into the caller's buffers once the call returns) and the reader is
// unhealthy: every later call fails fast; reconnect with a new reader.
//
// Ownership: owns its worker, endpoint and unpacked remote key; the context is shared. Not
// thread-safe: one thread at a time (the decode side keeps one reader per prefill peer per
// transfer thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "disagg/staging_pool.h"
#include "disagg/ucx.h"
#include "disagg/wire.h"

namespace oasis::disagg {

struct RemoteReaderOptions {
  std::chrono::milliseconds connect_timeout{5000};  // endpoint + hello + descriptor
  std::chrono::milliseconds close_timeout{1000};    // graceful flush before closing
  // While a Fetch waits: keep polling this long after each event before sleeping on the
  // worker's event fd. Lower latency for a dedicated fetch thread, at the cost of CPU.
  std::chrono::microseconds spin{0};
  // The staging server's shared secret, sent in the hello (at most kMaxSecretBytes; empty:
  // none, which only a server without a secret accepts).
  std::string secret{};
};

// One block to fetch: staging-pool slot `remote_block` → `local` (descriptor().block_bytes
// writable bytes).
struct FetchItem {
  uint64_t remote_block = 0;
  void* local = nullptr;
};

struct RemoteReaderStats {
  uint64_t fetch_calls = 0;
  uint64_t blocks_fetched = 0;
  uint64_t bytes_fetched = 0;
  uint64_t gets_issued = 0;  // after merging adjacent blocks
  double fetch_seconds_total = 0;
  double fetch_seconds_last = 0;
};

class RemoteReader {
 public:
  static StatusOr<std::unique_ptr<RemoteReader>> Connect(std::shared_ptr<UcxContext> context,
                                                         std::string_view peer_address,
                                                         const RemoteReaderOptions& options = {});
  ~RemoteReader();
  RemoteReader(const RemoteReader&) = delete;
  RemoteReader& operator=(const RemoteReader&) = delete;

  const StagingDescriptor& descriptor() const { return descriptor_; }
  const std::string& peer() const { return peer_; }
  bool healthy() const { return error_.ok(); }
  // Why the reader is unhealthy (OK while healthy).
  const Status& error() const { return error_; }
  const RemoteReaderStats& stats() const { return stats_; }
  // UCX's description of the endpoint (its lanes: which transport carries RMA and AM),
  // from ucp_ep_print_info. Empty when the endpoint is closed.
  std::string TransportInfo() const;

  // Copies every item's remote block into its local buffer. kInvalidArgument (nothing
  // fetched) for an index past the pool or a null buffer; kUnavailable when the peer failed
  // or the deadline passed (some buffers may then hold partial data).
  Status Fetch(std::span<const FetchItem> items, Clock::time_point deadline);

  // Lease messages. They complete when UCX has handed them to the transport; the server
  // applies them in arrival order. Ids the server no longer holds are ignored there.
  Status Renew(std::span<const uint64_t> lease_ids, Clock::time_point deadline);
  Status Complete(std::span<const uint64_t> lease_ids, Clock::time_point deadline);
  Status Abort(std::span<const uint64_t> lease_ids, Clock::time_point deadline);
  // Lease ids the server said it no longer holds (kLeaseGone answers to Renew, received while
  // this reader was progressed by any call), since the last call.
  std::vector<uint64_t> TakeGoneLeases();
  // Runs UCX's progress without waiting (answers that arrived since the last call run their
  // callbacks).
  void Poll();

 private:
  RemoteReader(std::unique_ptr<UcxWorker> worker, std::string peer, RemoteReaderOptions options);
  Status Open(const SockAddr& addr);
  Status SendControl(ControlMessage message, std::string payload, Clock::time_point deadline);
  // Waits for `batch` until `deadline`; on timeout or error force-closes the endpoint, waits
  // for the cancelled requests, marks the reader unhealthy and returns the error.
  Status Finish(RequestBatch& batch, Clock::time_point deadline, std::string_view what);
  void Fail(Status status);
  void CloseEndpoint(bool graceful);
  // Force-closes the endpoint and waits (bounded) for the close and `in_flight` (may be null)
  // to complete; if UCX does not complete them, abandons the worker (see the .cpp).
  void ForceClose(RequestBatch* in_flight);

  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnHelloReply(void* arg, const void* header, size_t header_length, void* data,
                                   size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnHelloRefused(void* arg, const void* header, size_t header_length,
                                     void* data, size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnLeaseGone(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param);

  std::unique_ptr<UcxWorker> worker_;
  const std::string peer_;
  const RemoteReaderOptions options_;
  ucp_ep_h ep_ = nullptr;
  ucp_rkey_h rkey_ = nullptr;
  ucs_status_t ep_status_ = UCS_OK;  // set by the endpoint's error callback
  Status error_;
  bool hello_received_ = false;
  std::string hello_payload_;
  std::optional<Status> hello_refused_;  // the server's kHelloRefused, as Connect's error
  std::vector<uint64_t> gone_leases_;
  StagingDescriptor descriptor_;
  RemoteReaderStats stats_;
};

}  // namespace oasis::disagg
