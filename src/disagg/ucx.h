// RAII wrappers over UCX's UCP layer: the context (one per process and configuration), a
// worker (progress engine), and request completion with a deadline (socket addresses:
// disagg/net_address.h).
//
// Every UCX failure becomes a Status (kUnavailable for transport and peer failures,
// kInvalidArgument for bad addresses), never an abort. UCX's own configuration comes from
// the environment (UCX_TLS, UCX_NET_DEVICES, ...); UcxOptions::transports overrides UCX_TLS
// for this context only.
#pragma once

#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "disagg/net_address.h"
#include "oasis/status.h"

namespace oasis::disagg {

using Clock = std::chrono::steady_clock;

// A UCX status as a Status: "<what>: <UCX's message>". kUnavailable for everything but
// UCS_ERR_INVALID_PARAM / UCS_ERR_INVALID_ADDR (kInvalidArgument) and UCS_ERR_NO_MEMORY
// (kResourceExhausted).
Status UcsStatus(ucs_status_t status, std::string_view what);

struct UcxOptions {
  // UCX_TLS for this context ("tcp", "tcp,cma", "rc,sm", ...). Empty: the environment's
  // UCX_TLS, or UCX's own selection.
  std::string transports;
  std::string name = "oasis";
};

// Owns a ucp_context_h with the RMA, AM and WAKEUP features. Thread-safe to share (UCX
// contexts are; workers are not): hold it through shared_ptr, and every worker, memory
// registration and endpoint made from it keeps it alive.
class UcxContext {
 public:
  static StatusOr<std::shared_ptr<UcxContext>> Create(const UcxOptions& options = {});
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;

  ucp_context_h get() const { return context_; }
  const UcxOptions& options() const { return options_; }

 private:
  UcxContext(ucp_context_h context, UcxOptions options)
      : context_(context), options_(std::move(options)) {}
  ucp_context_h context_;
  UcxOptions options_;
};

// Owns a ucp_worker_h (UCS_THREAD_MODE_SINGLE) and its wake-up file descriptor. Not
// thread-safe: one thread at a time drives it (the owner serialises).
class UcxWorker {
 public:
  static StatusOr<std::unique_ptr<UcxWorker>> Create(std::shared_ptr<UcxContext> context);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_worker_h get() const { return worker_; }
  const std::shared_ptr<UcxContext>& context() const { return context_; }

  // Runs UCX's progress once; returns the number of events handled (callbacks may run).
  unsigned Progress() { return ucp_worker_progress(worker_); }

  // Progresses until nothing is left to do, then sleeps until the worker has an event, the
  // optional `extra_fd` is readable, or `timeout` passes.
  void ProgressAndWait(std::chrono::milliseconds timeout, int extra_fd = -1);

 private:
  UcxWorker(std::shared_ptr<UcxContext> context, ucp_worker_h worker, int efd)
      : context_(std::move(context)), worker_(worker), efd_(efd) {}
  std::shared_ptr<UcxContext> context_;
  ucp_worker_h worker_;
  int efd_;
};

// Completion tracking for a batch of non-blocking UCX operations. Pass Param() to each
// *_nbx call and the returned pointer to Track(); Wait() progresses the worker until all are
// done or the deadline passes. Not thread-safe; must outlive every tracked request (Wait
// until Done() before destroying it: the destructor CHECKs that).
class RequestBatch {
 public:
  RequestBatch();
  ~RequestBatch();
  RequestBatch(const RequestBatch&) = delete;
  RequestBatch& operator=(const RequestBatch&) = delete;

  // Parameters for one *_nbx call; `flags` go to ucp_request_param_t::flags (e.g.
  // UCP_AM_SEND_FLAG_EAGER, UCP_EP_CLOSE_FLAG_FORCE).
  ucp_request_param_t Param(uint32_t flags = 0) const;
  // Registers the result of an *_nbx call made with Param(): immediate completion, an
  // immediate error, or a request that completes later through the callback.
  void Track(ucs_status_ptr_t result);
  bool Done() const { return pending_ == 0; }
  size_t pending() const { return pending_; }
  // The first error any operation finished with (UCS_OK if none).
  ucs_status_t first_error() const { return first_error_; }
  // Forgets the requests still pending, for an owner that abandons the worker (never
  // progresses it again, so their callbacks can never run).
  void Abandon() { pending_ = 0; }
  // Progresses `worker` until Done() or `deadline`; true when done. Between sleeps on the
  // worker's event fd (at most 5 ms each), polls for up to `spin` without sleeping: lower
  // latency for more CPU.
  bool Wait(UcxWorker& worker, Clock::time_point deadline,
            std::chrono::microseconds spin = std::chrono::microseconds(0));

 private:
  static void OnComplete(void* request, ucs_status_t status, void* user_data);
  size_t pending_ = 0;
  ucs_status_t first_error_ = UCS_OK;
};

}  // namespace oasis::disagg
