#include "disagg/remote_reader.h"

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "common/check.h"
#include "common/logging.h"

namespace oasis::disagg {
namespace {
// Forced closes complete every outstanding request locally; waiting longer than this means
// UCX broke its promise.
constexpr std::chrono::seconds kForcedCloseLimit{1};
// Connect's attempts after transport failures, and the first pause between them (doubled
// after each failed attempt: 0.1, 0.2, 0.4, 0.8, 1.6 s).
constexpr int kConnectAttempts = 6;
constexpr std::chrono::milliseconds kConnectFirstPause{100};
}  // namespace

StatusOr<std::unique_ptr<RemoteReader>> RemoteReader::Connect(std::shared_ptr<UcxContext> context,
                                                              std::string_view peer_address,
                                                              const RemoteReaderOptions& options) {
  OASIS_ASSIGN_OR_RETURN(SockAddr addr, ResolveHostPort(peer_address));
  if (options.secret.size() > kMaxSecretBytes) {
    return InvalidArgument("staging secret of " + std::to_string(options.secret.size()) +
                           " bytes, at most " + std::to_string(kMaxSecretBytes));
  }
  // A transport failure while connecting (kUnavailable: the endpoint reset or failed before
  // the pool answered — seen with UCX's default transports between two processes of a loaded
  // host, for as long as a third of a second) is retried with a fresh worker and endpoint after a
  // growing pause, at most kConnectAttempts in all and within connect_timeout; a refusal (secret,
  // version: kFailedPrecondition) or a bad descriptor is final.
  const auto deadline = Clock::now() + options.connect_timeout;
  std::chrono::milliseconds pause = kConnectFirstPause;
  for (int attempt = 1;; ++attempt) {
    RemoteReaderOptions mine = options;
    mine.connect_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::max(deadline - Clock::now(), Clock::duration(std::chrono::milliseconds(1))));
    OASIS_ASSIGN_OR_RETURN(std::unique_ptr<UcxWorker> worker, UcxWorker::Create(context));
    std::unique_ptr<RemoteReader> reader(
        new RemoteReader(std::move(worker), std::string(peer_address), mine));
    Status s = reader->Open(addr);
    if (s.ok()) return reader;
    s = s.WithContext("staging pool at " + std::string(peer_address));
    if (s.code() != StatusCode::kUnavailable || attempt >= kConnectAttempts ||
        Clock::now() + pause >= deadline) {
      return s;
    }
    spdlog::warn("{} (attempt {} of {}): connecting again", s.ToString(), attempt,
                 kConnectAttempts);
    reader.reset();
    std::this_thread::sleep_for(pause);
    pause *= 2;
  }
}

RemoteReader::RemoteReader(std::unique_ptr<UcxWorker> worker, std::string peer,
                           RemoteReaderOptions options)
    : worker_(std::move(worker)), peer_(std::move(peer)), options_(options) {}

RemoteReader::~RemoteReader() { CloseEndpoint(/*graceful=*/healthy()); }

Status RemoteReader::Open(const SockAddr& addr) {
  const auto deadline = Clock::now() + options_.connect_timeout;
  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = static_cast<unsigned>(ControlMessage::kHelloReply);
  am.cb = &RemoteReader::OnHelloReply;
  am.arg = this;
  ucs_status_t s = ucp_worker_set_am_recv_handler(worker_->get(), &am);
  if (s != UCS_OK) return UcsStatus(s, "ucp_worker_set_am_recv_handler");
  am.id = static_cast<unsigned>(ControlMessage::kLeaseGone);
  am.cb = &RemoteReader::OnLeaseGone;
  s = ucp_worker_set_am_recv_handler(worker_->get(), &am);
  if (s != UCS_OK) return UcsStatus(s, "ucp_worker_set_am_recv_handler");
  am.id = static_cast<unsigned>(ControlMessage::kHelloRefused);
  am.cb = &RemoteReader::OnHelloRefused;
  s = ucp_worker_set_am_recv_handler(worker_->get(), &am);
  if (s != UCS_OK) return UcsStatus(s, "ucp_worker_set_am_recv_handler");

  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = addr.get();
  ep.sockaddr.addrlen = addr.length;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &RemoteReader::OnEndpointError;
  ep.err_handler.arg = this;
  s = ucp_ep_create(worker_->get(), &ep, &ep_);
  if (s != UCS_OK) {
    ep_ = nullptr;
    return UcsStatus(s, "connecting");
  }

  const std::string hello = EncodeHello(options_.secret);
  {
    RequestBatch batch;
    const ucp_request_param_t param = batch.Param(UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
    batch.Track(ucp_am_send_nbx(ep_, static_cast<unsigned>(ControlMessage::kHello), nullptr, 0,
                                hello.data(), hello.size(), &param));
    OASIS_RETURN_IF_ERROR(Finish(batch, deadline, "sending hello"));
  }
  while (!hello_received_ && !hello_refused_ && ep_status_ == UCS_OK && Clock::now() < deadline) {
    worker_->ProgressAndWait(std::chrono::milliseconds(5));
  }
  if (hello_refused_) {
    Status err = *hello_refused_;
    Fail(err);
    return err;
  }
  if (!hello_received_) {
    Status err = ep_status_ != UCS_OK
                     ? UcsStatus(ep_status_, "waiting for the pool descriptor")
                     : Unavailable("no pool descriptor within " +
                                   std::to_string(options_.connect_timeout.count()) + " ms");
    Fail(err);
    return err;
  }
  auto descriptor = ParseDescriptor(hello_payload_);
  if (!descriptor.ok()) {
    Fail(descriptor.status());
    return descriptor.status();
  }
  descriptor_ = std::move(descriptor).value();
  s = ucp_ep_rkey_unpack(ep_, descriptor_.rkey.data(), &rkey_);
  if (s != UCS_OK) {
    rkey_ = nullptr;
    Status err = UcsStatus(s, "unpacking the pool's remote key");
    Fail(err);
    return err;
  }
  return Status::Ok();
}

Status RemoteReader::Fetch(std::span<const FetchItem> items, Clock::time_point deadline) {
  if (!healthy()) return error_;
  const uint64_t bb = descriptor_.block_bytes;
  for (const FetchItem& item : items) {
    if (item.remote_block >= descriptor_.num_blocks) {
      return InvalidArgument("fetch: block " + std::to_string(item.remote_block) +
                             " past the staging pool's " + std::to_string(descriptor_.num_blocks));
    }
    if (item.local == nullptr) return InvalidArgument("fetch: null local buffer");
  }
  if (items.empty()) return Status::Ok();
  const auto start = Clock::now();
  RequestBatch batch;
  const ucp_request_param_t param = batch.Param();
  uint64_t gets = 0;
  for (size_t i = 0; i < items.size();) {
    // Merge the run of blocks adjacent both remotely and locally into one get.
    size_t j = i + 1;
    while (j < items.size() && items[j].remote_block == items[j - 1].remote_block + 1 &&
           static_cast<std::byte*>(items[j].local) ==
               static_cast<std::byte*>(items[j - 1].local) + bb) {
      ++j;
    }
    batch.Track(ucp_get_nbx(ep_, items[i].local, (j - i) * bb,
                            descriptor_.BlockAddress(items[i].remote_block), rkey_, &param));
    ++gets;
    i = j;
  }
  OASIS_RETURN_IF_ERROR(
      Finish(batch, deadline, "fetching " + std::to_string(items.size()) + " block(s)"));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  ++stats_.fetch_calls;
  stats_.blocks_fetched += items.size();
  stats_.bytes_fetched += items.size() * bb;
  stats_.gets_issued += gets;
  stats_.fetch_seconds_total += seconds;
  stats_.fetch_seconds_last = seconds;
  return Status::Ok();
}

Status RemoteReader::Renew(std::span<const uint64_t> ids, Clock::time_point deadline) {
  return SendControl(ControlMessage::kRenew, EncodeLeaseIds(ids), deadline);
}
Status RemoteReader::Complete(std::span<const uint64_t> ids, Clock::time_point deadline) {
  return SendControl(ControlMessage::kComplete, EncodeLeaseIds(ids), deadline);
}
Status RemoteReader::Abort(std::span<const uint64_t> ids, Clock::time_point deadline) {
  return SendControl(ControlMessage::kAbort, EncodeLeaseIds(ids), deadline);
}

Status RemoteReader::SendControl(ControlMessage message, std::string payload,
                                 Clock::time_point deadline) {
  if (!healthy()) return error_;
  if (payload.size() > 4 + 8 * size_t{kMaxLeaseIdsPerMessage}) {
    return InvalidArgument("lease message: more than " + std::to_string(kMaxLeaseIdsPerMessage) +
                           " ids");
  }
  RequestBatch batch;
  // REPLY: the server answers a renewal of leases it no longer holds (kLeaseGone).
  const ucp_request_param_t param = batch.Param(UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
  batch.Track(ucp_am_send_nbx(ep_, static_cast<unsigned>(message), nullptr, 0, payload.data(),
                              payload.size(), &param));
  return Finish(batch, deadline, "sending a lease message");
}

Status RemoteReader::Finish(RequestBatch& batch, Clock::time_point deadline,
                            std::string_view what) {
  const bool done = batch.Wait(*worker_, deadline, options_.spin);
  if (done && batch.first_error() == UCS_OK) return Status::Ok();
  Status err;
  if (!done) {
    err = Unavailable(std::string(what) + ": " + peer_ + " did not complete it by the deadline");
  } else {
    err = UcsStatus(batch.first_error(), std::string(what) + " (" + peer_ + ")");
  }
  if (error_.ok()) error_ = err;
  ForceClose(&batch);  // every request in `batch` has completed (or is abandoned) after this
  return err;
}

void RemoteReader::Fail(Status status) {
  if (error_.ok()) error_ = std::move(status);
  ForceClose(nullptr);
}

void RemoteReader::CloseEndpoint(bool graceful) {
  if (ep_ == nullptr) return;
  if (graceful && ep_status_ == UCS_OK) {
    // Let lease messages and gets reach the peer before the endpoint goes; whatever did not
    // flush by then is cancelled by the forced close.
    RequestBatch flush;
    const ucp_request_param_t param = flush.Param();
    flush.Track(ucp_ep_flush_nbx(ep_, &param));
    flush.Wait(*worker_, Clock::now() + options_.close_timeout);
    ForceClose(&flush);
  } else {
    ForceClose(nullptr);
  }
}

void RemoteReader::ForceClose(RequestBatch* in_flight) {
  if (ep_ == nullptr) return;
  RequestBatch close;
  const ucp_request_param_t param = close.Param(UCP_EP_CLOSE_FLAG_FORCE);
  close.Track(ucp_ep_close_nbx(ep_, &param));
  ep_ = nullptr;
  const auto limit = Clock::now() + kForcedCloseLimit;
  const bool drained =
      close.Wait(*worker_, limit) && (in_flight == nullptr || in_flight->Wait(*worker_, limit));
  if (drained) {
    // Every operation that used the key has completed (done or cancelled).
    if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);
    rkey_ = nullptr;
    return;
  }
  // UCX did not complete a forced close (seen with UCX 1.13's shared-memory lanes after the
  // peer died). Abandon the worker: it is never progressed again, so no callback runs and no
  // get writes into a caller's buffer; the worker, key and context are leaked on purpose.
  spdlog::error(
      "remote reader ({}): UCX did not complete a forced close within {} s; "
      "abandoning its worker",
      peer_, kForcedCloseLimit.count());
  close.Abandon();
  if (in_flight != nullptr) in_flight->Abandon();
  (void)worker_.release();
  rkey_ = nullptr;
}

std::string RemoteReader::TransportInfo() const {
  if (ep_ == nullptr) return {};
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return {};
  ucp_ep_print_info(ep_, stream);
  std::fclose(stream);
  std::string info(text, size);
  std::free(text);
  return info;
}

void RemoteReader::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<RemoteReader*>(arg);
  if (self->ep_status_ == UCS_OK) self->ep_status_ = status;
}

ucs_status_t RemoteReader::OnHelloReply(void* arg, const void* header, size_t header_length,
                                        void* data, size_t length,
                                        const ucp_am_recv_param_t* param) {
  auto* self = static_cast<RemoteReader*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 || self->hello_received_) {
    return UCS_OK;  // not a reply we can use: Open() times out with a clear error
  }
  self->hello_payload_.assign(static_cast<const char*>(data), length);
  self->hello_received_ = true;
  return UCS_OK;
}

ucs_status_t RemoteReader::OnHelloRefused(void* arg, const void* header, size_t header_length,
                                          void* data, size_t length,
                                          const ucp_am_recv_param_t* param) {
  auto* self = static_cast<RemoteReader*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 || self->hello_received_ ||
      self->hello_refused_) {
    return UCS_OK;
  }
  auto refusal = ParseHelloRefusal(std::string_view(static_cast<const char*>(data), length));
  self->hello_refused_ = refusal.ok()
                             ? FailedPrecondition(DescribeHelloRefusal(*refusal))
                             : FailedPrecondition("the staging pool refused the connection (" +
                                                  refusal.status().message() + ")");
  return UCS_OK;
}

ucs_status_t RemoteReader::OnLeaseGone(void* arg, const void* header, size_t header_length,
                                       void* data, size_t length,
                                       const ucp_am_recv_param_t* param) {
  auto* self = static_cast<RemoteReader*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) return UCS_OK;
  auto ids = ParseLeaseIds(std::string_view(static_cast<const char*>(data), length));
  if (ids.ok()) self->gone_leases_.insert(self->gone_leases_.end(), ids->begin(), ids->end());
  return UCS_OK;
}

void RemoteReader::Poll() {
  if (!worker_ || ep_ == nullptr) return;
  while (worker_->Progress() != 0) {
  }
}

std::vector<uint64_t> RemoteReader::TakeGoneLeases() {
  std::vector<uint64_t> out;
  out.swap(gone_leases_);
  return out;
}

}  // namespace oasis::disagg
