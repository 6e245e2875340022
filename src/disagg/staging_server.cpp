#include "disagg/staging_server.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "common/check.h"
#include "common/logging.h"

namespace oasis::disagg {

StatusOr<std::unique_ptr<StagingServer>> StagingServer::Start(std::shared_ptr<UcxContext> context,
                                                              StagingPool* pool,
                                                              const StagingServerOptions& options) {
  OASIS_CHECK(context != nullptr && pool != nullptr) << "StagingServer needs a context and a pool";
  if (options.sweep_interval.count() <= 0) {
    return InvalidArgument("staging server: the sweep interval must be positive");
  }
  if (options.hello_timeout.count() <= 0 || options.refusal_grace.count() < 0) {
    return InvalidArgument(
        "staging server: the hello timeout must be positive and the refusal grace not negative");
  }
  if (options.secret.size() > kMaxSecretBytes) {
    return InvalidArgument("staging server: a secret of " + std::to_string(options.secret.size()) +
                           " bytes, at most " + std::to_string(kMaxSecretBytes));
  }
  std::unique_ptr<StagingServer> server(new StagingServer(std::move(context), pool, options));
  OASIS_RETURN_IF_ERROR(server->Listen());
  server->thread_ = std::thread([s = server.get()] { s->Run(); });
  return server;
}

StagingServer::StagingServer(std::shared_ptr<UcxContext> context, StagingPool* pool,
                             StagingServerOptions options)
    : context_(std::move(context)),
      pool_(pool),
      options_(std::move(options)),
      descriptor_bytes_(SerializeDescriptor(pool->descriptor())) {}

Status StagingServer::Listen() {
  OASIS_ASSIGN_OR_RETURN(SockAddr addr, ResolveHostPort(options_.listen_address));
  if (options_.secret.empty() && !IsLoopback(addr)) {
    return InvalidArgument("staging server: listening on " + options_.listen_address + " (" +
                           FormatSockAddr(addr.get()) +
                           ") lets other machines connect: a shared secret is required there "
                           "(only a loopback address may go without one)");
  }
  OASIS_ASSIGN_OR_RETURN(worker_, UcxWorker::Create(context_));
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Internal("staging server: eventfd failed");

  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.arg = this;
  const std::pair<ControlMessage, ucp_am_recv_callback_t> handlers[] = {
      {ControlMessage::kHello, &StagingServer::OnHello},
      {ControlMessage::kRenew, &StagingServer::OnLeaseMessage<ControlMessage::kRenew>},
      {ControlMessage::kComplete, &StagingServer::OnLeaseMessage<ControlMessage::kComplete>},
      {ControlMessage::kAbort, &StagingServer::OnLeaseMessage<ControlMessage::kAbort>},
  };
  for (const auto& [id, cb] : handlers) {
    am.id = static_cast<unsigned>(id);
    am.cb = cb;
    const ucs_status_t s = ucp_worker_set_am_recv_handler(worker_->get(), &am);
    if (s != UCS_OK) return UcsStatus(s, "staging server: ucp_worker_set_am_recv_handler");
  }

  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = addr.get();
  lp.sockaddr.addrlen = addr.length;
  lp.conn_handler.cb = &StagingServer::OnConnRequest;
  lp.conn_handler.arg = this;
  ucs_status_t s = ucp_listener_create(worker_->get(), &lp, &listener_);
  if (s != UCS_OK) {
    listener_ = nullptr;
    return UcsStatus(s, "staging server: listening on " + options_.listen_address);
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  s = ucp_listener_query(listener_, &attr);
  if (s != UCS_OK) return UcsStatus(s, "staging server: ucp_listener_query");
  address_ = FormatSockAddr(reinterpret_cast<const sockaddr*>(&attr.sockaddr));
  const size_t colon = address_.rfind(':');
  port_ = static_cast<uint16_t>(std::stoi(address_.substr(colon + 1)));
  return Status::Ok();
}

StagingServer::~StagingServer() {
  if (thread_.joinable()) {
    stop_ = true;
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  } else if (worker_ != nullptr) {
    CloseAll();  // Start() failed after the worker existed: tidy up on this thread
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

StagingServerStats StagingServer::Stats() const {
  std::lock_guard lock(stats_mu_);
  return stats_;
}

void StagingServer::Run() {
  auto next_sweep = Clock::now() + options_.sweep_interval;
  while (!stop_) {
    const auto now = Clock::now();
    const auto wait =
        std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(next_sweep - now),
                   std::chrono::milliseconds(0), std::chrono::milliseconds(100));
    worker_->ProgressAndWait(wait, wake_fd_);
    uint64_t drained;
    (void)!read(wake_fd_, &drained, sizeof(drained));
    HandleConnections();
    for (ucp_ep_h ep : hello_replies_) {
      const ucp_request_param_t param = requests_.Param(UCP_AM_SEND_FLAG_EAGER);
      requests_.Track(ucp_am_send_nbx(ep, static_cast<unsigned>(ControlMessage::kHelloReply),
                                      nullptr, 0, descriptor_bytes_.data(),
                                      descriptor_bytes_.size(), &param));
    }
    hello_replies_.clear();
    std::vector<std::pair<ucp_ep_h, std::string>> gone;
    {
      std::lock_guard lock(stats_mu_);
      gone.swap(gone_replies_);
      stats_.gone_replies += gone.size();
    }
    if (requests_.Done()) reply_payloads_.clear();
    const auto send = [&](ucp_ep_h ep, ControlMessage message, std::string payload) {
      reply_payloads_.push_back(std::move(payload));
      const std::string& p = reply_payloads_.back();
      const ucp_request_param_t param = requests_.Param(UCP_AM_SEND_FLAG_EAGER);
      requests_.Track(ucp_am_send_nbx(ep, static_cast<unsigned>(message), nullptr, 0, p.data(),
                                      p.size(), &param));
    };
    for (auto& [ep, payload] : gone) send(ep, ControlMessage::kLeaseGone, std::move(payload));
    for (const auto& [ep, reason] : hello_refusals_) {
      send(ep, ControlMessage::kHelloRefused, EncodeHelloRefusal(reason));
    }
    hello_refusals_.clear();
    CloseFailedEndpoints();
    CloseOverdueEndpoints(Clock::now());
    if (Clock::now() >= next_sweep) {
      const size_t expired = pool_->ReleaseExpired(Clock::now());
      if (expired > 0) spdlog::info("staging pool: {} lease(s) expired", expired);
      next_sweep = Clock::now() + options_.sweep_interval;
    }
  }
  CloseAll();
}

void StagingServer::HandleConnections() {
  for (ucp_conn_request_h request : conn_requests_) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.conn_request = request;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &StagingServer::OnEndpointError;
    ep.err_handler.arg = this;
    std::string peer = "an unknown address";
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(request, &attr) == UCS_OK) {
      peer = FormatSockAddr(reinterpret_cast<const sockaddr*>(&attr.client_address));
    }
    ucp_ep_h handle = nullptr;
    const ucs_status_t s = ucp_ep_create(worker_->get(), &ep, &handle);
    std::lock_guard lock(stats_mu_);
    if (s != UCS_OK) {
      spdlog::warn("staging server: accepting a connection from {}: {}", peer,
                   ucs_status_string(s));
      ++stats_.connections_failed;
      continue;
    }
    endpoints_.push_back({.ep = handle, .peer = std::move(peer), .accepted = Clock::now()});
    ++stats_.connections_accepted;
    stats_.connections_open = endpoints_.size();
  }
  conn_requests_.clear();
}

StagingServer::Endpoint* StagingServer::FindEndpoint(ucp_ep_h ep) {
  auto it = std::find_if(endpoints_.begin(), endpoints_.end(),
                         [ep](const Endpoint& e) { return e.ep == ep; });
  return it == endpoints_.end() ? nullptr : &*it;
}

void StagingServer::CloseEndpoint(ucp_ep_h ep) {
  std::erase_if(endpoints_, [ep](const Endpoint& e) { return e.ep == ep; });
  std::erase(hello_replies_, ep);
  std::erase_if(hello_refusals_, [ep](const auto& r) { return r.first == ep; });
  const ucp_request_param_t param = requests_.Param(UCP_EP_CLOSE_FLAG_FORCE);
  requests_.Track(ucp_ep_close_nbx(ep, &param));
  std::lock_guard lock(stats_mu_);
  stats_.connections_open = endpoints_.size();
}

void StagingServer::CloseFailedEndpoints() {
  for (ucp_ep_h ep : failed_endpoints_) {
    const Endpoint* e = FindEndpoint(ep);
    if (e == nullptr) continue;  // reported twice, or closed already
    const bool refused = e->refused;
    CloseEndpoint(ep);
    // A refused peer closing its end is what it should do, not a failure.
    if (!refused) {
      std::lock_guard lock(stats_mu_);
      ++stats_.connections_failed;
    }
  }
  failed_endpoints_.clear();
}

void StagingServer::CloseOverdueEndpoints(Clock::time_point now) {
  std::vector<ucp_ep_h> overdue;
  for (const Endpoint& e : endpoints_) {
    if (e.refused ? now >= e.close_at
                  : !e.authenticated && now - e.accepted >= options_.hello_timeout) {
      overdue.push_back(e.ep);
      if (!e.refused) {
        spdlog::warn("staging server: {} said no hello within {} ms: closing its connection",
                     e.peer, options_.hello_timeout.count());
        std::lock_guard lock(stats_mu_);
        ++stats_.hello_timeouts;
      }
    }
  }
  for (ucp_ep_h ep : overdue) CloseEndpoint(ep);
}

void StagingServer::CloseAll() {
  for (ucp_conn_request_h request : conn_requests_) {
    (void)ucp_listener_reject(listener_, request);
  }
  conn_requests_.clear();
  for (const Endpoint& e : endpoints_) {
    const ucp_request_param_t param = requests_.Param(UCP_EP_CLOSE_FLAG_FORCE);
    requests_.Track(ucp_ep_close_nbx(e.ep, &param));
  }
  endpoints_.clear();
  hello_replies_.clear();
  hello_refusals_.clear();
  // Forced closes complete every outstanding request locally; this is quick.
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
  listener_ = nullptr;
  if (!requests_.Wait(*worker_, Clock::now() + std::chrono::seconds(2))) {
    // Seen with UCX 1.13's shared-memory lanes after a peer died: abandon the worker (never
    // progressed again, so no callback can run); it and the context are leaked on purpose.
    spdlog::error(
        "staging server: UCX did not complete forced closes within 2 s; "
        "abandoning its worker");
    requests_.Abandon();
    (void)worker_.release();
  }
}

void StagingServer::OnConnRequest(ucp_conn_request_h request, void* arg) {
  static_cast<StagingServer*>(arg)->conn_requests_.push_back(request);
}

void StagingServer::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<StagingServer*>(arg);
  spdlog::debug("staging server: peer endpoint failed: {}", ucs_status_string(status));
  self->failed_endpoints_.push_back(ep);
}

ucs_status_t StagingServer::OnHello(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<StagingServer*>(arg);
  std::lock_guard lock(self->stats_mu_);
  const bool has_reply_ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0;
  Endpoint* e = has_reply_ep ? self->FindEndpoint(param->reply_ep) : nullptr;
  if (e == nullptr || e->refused) {  // nowhere to answer, or refused already
    ++self->stats_.bad_messages;
    return UCS_OK;
  }
  // A hello too large to come inline (rendezvous) cannot be a valid one.
  const bool inline_data = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0;
  const std::optional<HelloRefusal> refusal =
      inline_data ? CheckHello(std::string_view(static_cast<const char*>(data), length),
                               self->options_.secret)
                  : std::optional<HelloRefusal>(HelloRefusal::kMalformed);
  if (refusal) {
    // Nothing is served to it: no descriptor, no lease messages; it is closed shortly.
    ++self->stats_.hellos_refused;
    e->authenticated = false;
    e->refused = true;
    e->close_at = Clock::now() + self->options_.refusal_grace;
    self->hello_refusals_.emplace_back(e->ep, *refusal);
    spdlog::warn("staging server: refused the connection from {}: {}", e->peer,
                 *refusal == HelloRefusal::kSecret    ? "wrong or missing staging secret"
                 : *refusal == HelloRefusal::kVersion ? "another protocol version"
                                                      : "malformed hello");
    return UCS_OK;
  }
  ++self->stats_.hellos;
  e->authenticated = true;
  self->hello_replies_.push_back(param->reply_ep);
  return UCS_OK;
}

template <ControlMessage kMessage>
ucs_status_t StagingServer::OnLeaseMessage(void* arg, const void* header, size_t header_length,
                                           void* data, size_t length,
                                           const ucp_am_recv_param_t* param) {
  static_cast<StagingServer*>(arg)->ApplyLeaseMessage(kMessage, data, length, param);
  return UCS_OK;
}

void StagingServer::ApplyLeaseMessage(ControlMessage message, const void* data, size_t length,
                                      const ucp_am_recv_param_t* param) {
  std::lock_guard lock(stats_mu_);
  // Lease messages count only from an endpoint whose hello was accepted (readers send them
  // with UCP_AM_SEND_FLAG_REPLY, which names the endpoint).
  const Endpoint* e = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0
                          ? FindEndpoint(param->reply_ep)
                          : nullptr;
  if (e == nullptr || !e->authenticated) {
    ++stats_.unauthenticated;
    return;
  }
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    ++stats_.bad_messages;
    return;
  }
  auto ids = ParseLeaseIds(std::string_view(static_cast<const char*>(data), length));
  if (!ids.ok()) {
    ++stats_.bad_messages;
    spdlog::warn("staging server: {}", ids.status().ToString());
    return;
  }
  ++stats_.lease_messages;
  const auto now = Clock::now();
  std::vector<uint64_t> gone;
  for (uint64_t id : *ids) {
    Status s;
    switch (message) {
      case ControlMessage::kRenew:
        s = pool_->Renew(id, now);
        break;
      case ControlMessage::kComplete:
        s = pool_->Release(id, LeaseEnd::kCompleted);
        break;
      case ControlMessage::kAbort:
        s = pool_->Release(id, LeaseEnd::kAborted);
        break;
      default:
        OASIS_CHECK(false) << "not a lease message";
    }
    if (!s.ok()) {
      ++stats_.unknown_leases;
      if (message == ControlMessage::kRenew) gone.push_back(id);
    }
  }
  // A renewal of a lease the pool no longer holds: tell the reader, so that it stops
  // trusting those slots (they may hold another request's KV by now).
  if (!gone.empty() && (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0) {
    gone_replies_.emplace_back(param->reply_ep, EncodeLeaseIds(gone));
  }
}

}  // namespace oasis::disagg
