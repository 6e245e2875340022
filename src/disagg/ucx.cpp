#include "disagg/ucx.h"

#include <poll.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/check.h"
#include "common/logging.h"

namespace oasis::disagg {

Status UcsStatus(ucs_status_t status, std::string_view what) {
  std::string message = std::string(what) + ": " + ucs_status_string(status);
  switch (status) {
    case UCS_OK:
      return Status::Ok();
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return InvalidArgument(std::move(message));
    case UCS_ERR_NO_MEMORY:
      return ResourceExhausted(std::move(message));
    default:
      return Unavailable(std::move(message));
  }
}

StatusOr<std::shared_ptr<UcxContext>> UcxContext::Create(const UcxOptions& options) {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return UcsStatus(s, "UCX: reading the configuration");
  if (!options.transports.empty()) {
    s = ucp_config_modify(config, "TLS", options.transports.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return UcsStatus(s, "UCX: setting TLS=" + options.transports);
    }
  }
  ucp_params_t params{};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  // Workers of this context live on different threads (a StagingServer's, readers' fetch
  // threads) and memory is registered from any thread: the context must lock.
  params.mt_workers_shared = 1;
  params.name = options.name.c_str();
  ucp_context_h context = nullptr;
  s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) {
    return UcsStatus(
        s, "UCX: ucp_init (transports '" +
               (options.transports.empty() ? std::string("default") : options.transports) + "')");
  }
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_THREAD_MODE;
  s = ucp_context_query(context, &attr);
  if (s != UCS_OK || attr.thread_mode != UCS_THREAD_MODE_MULTI) {
    ucp_cleanup(context);
    return Unavailable("UCX: the context is not thread-safe (a UCX built without multi-threading)");
  }
  return std::shared_ptr<UcxContext>(new UcxContext(context, options));
}

UcxContext::~UcxContext() { ucp_cleanup(context_); }

StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create(std::shared_ptr<UcxContext> context) {
  OASIS_CHECK(context != nullptr) << "UcxWorker needs a context";
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  ucs_status_t s = ucp_worker_create(context->get(), &params, &worker);
  if (s != UCS_OK) return UcsStatus(s, "UCX: ucp_worker_create");
  int efd = -1;
  s = ucp_worker_get_efd(worker, &efd);
  if (s != UCS_OK) {
    ucp_worker_destroy(worker);
    return UcsStatus(s, "UCX: ucp_worker_get_efd");
  }
  return std::unique_ptr<UcxWorker>(new UcxWorker(std::move(context), worker, efd));
}

UcxWorker::~UcxWorker() { ucp_worker_destroy(worker_); }

void UcxWorker::ProgressAndWait(std::chrono::milliseconds timeout, int extra_fd) {
  while (Progress() != 0) {
  }
  // ucp_worker_arm reports BUSY when events arrived since the last progress: go again.
  const ucs_status_t s = ucp_worker_arm(worker_);
  if (s == UCS_ERR_BUSY) return;
  pollfd fds[2] = {{efd_, POLLIN, 0}, {extra_fd, POLLIN, 0}};
  const int n = extra_fd >= 0 ? 2 : 1;
  const int ms = static_cast<int>(std::max<int64_t>(0, timeout.count()));
  (void)poll(fds, n, s == UCS_OK ? ms : std::min(ms, 1));
}

RequestBatch::RequestBatch() = default;

ucp_request_param_t RequestBatch::Param(uint32_t flags) const {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &RequestBatch::OnComplete;
  param.user_data = const_cast<RequestBatch*>(this);
  if (flags != 0) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = flags;
  }
  return param;
}

RequestBatch::~RequestBatch() {
  OASIS_CHECK_EQ(pending_, size_t{0}) << "RequestBatch destroyed with UCX requests in flight";
}

void RequestBatch::Track(ucs_status_ptr_t result) {
  if (result == nullptr) return;  // completed in place
  if (UCS_PTR_IS_ERR(result)) {
    if (first_error_ == UCS_OK) first_error_ = UCS_PTR_STATUS(result);
    return;
  }
  ++pending_;
}

void RequestBatch::OnComplete(void* request, ucs_status_t status, void* user_data) {
  auto* self = static_cast<RequestBatch*>(user_data);
  if (status != UCS_OK && self->first_error_ == UCS_OK) self->first_error_ = status;
  OASIS_CHECK_GT(self->pending_, size_t{0}) << "UCX completion without a tracked request";
  --self->pending_;
  ucp_request_free(request);
}

bool RequestBatch::Wait(UcxWorker& worker, Clock::time_point deadline,
                        std::chrono::microseconds spin) {
  while (pending_ > 0) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    if (spin.count() > 0) {
      // Completions can arrive without progress reporting events (UCX's async thread reads
      // sockets): watch the batch itself.
      const auto until = std::min(now + spin, deadline);
      while (pending_ > 0 && Clock::now() < until) worker.Progress();
      if (pending_ == 0) break;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    worker.ProgressAndWait(std::clamp(left + std::chrono::milliseconds(1),
                                      std::chrono::milliseconds(0), std::chrono::milliseconds(5)));
  }
  return true;
}

}  // namespace oasis::disagg
