#include "router/upstream_pool.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <sstream>

#include "common/http_util.h"
#include "router/upstream.h"

namespace oasis::router {

using Clock = std::chrono::steady_clock;

const char* RoleName(Role role) { return role == Role::kPrefill ? "prefill" : "decode"; }

UpstreamPool::UpstreamPool(const RouterOptions& options, RouterMetrics* metrics)
    : options_(options), metrics_(metrics) {
  auto fill = [](Pool& pool, Role role, const std::vector<Address>& addresses) {
    for (const Address& a : addresses) {
      auto inst = std::make_unique<Instance>();
      inst->role = role;
      inst->index = pool.instances.size();
      inst->address = a;
      inst->label = a.ToString();
      pool.instances.push_back(std::move(inst));
    }
  };
  fill(prefill_, Role::kPrefill, options_.prefill);
  fill(decode_, Role::kDecode, options_.decode);
}

UpstreamPool::~UpstreamPool() { JoinHealthChecks(); }

void UpstreamPool::StartHealthChecks() {
  for (Pool* pool : {&prefill_, &decode_}) {
    for (auto& inst : pool->instances) {
      Instance* i = inst.get();
      health_threads_.emplace_back([this, i] { HealthLoop(i); });
    }
  }
}

void UpstreamPool::StopHealthChecks() {
  std::lock_guard<std::mutex> lock(health_mu_);
  health_stop_ = true;
  health_cv_.notify_all();
}

void UpstreamPool::JoinHealthChecks() {
  StopHealthChecks();
  for (std::thread& t : health_threads_) t.join();
  health_threads_.clear();
}

void UpstreamPool::HealthLoop(Instance* instance) {
  httplib::Client client(instance->address.host, instance->address.port);
  const auto timeout = std::chrono::milliseconds(options_.health_timeout_ms);
  client.set_connection_timeout(timeout);
  client.set_read_timeout(timeout);
  client.set_write_timeout(timeout);
  while (true) {
    {
      std::lock_guard<std::mutex> lock(health_mu_);
      if (health_stop_) return;
    }
    httplib::Result r = client.Get("/health");
    // Healthy: 200, and the role its /health names (oasis-server's "role") is the list's. An
    // instance of another role (a decode instance given as --prefill, a --role both server)
    // would refuse every request as if it were the client's fault.
    std::string why;
    if (!r) {
      why = "GET /health failed (" + httplib::to_string(r.error()) + ")";
    } else if (r->status != 200) {
      why = "GET /health answered " + std::to_string(r->status);
    } else {
      const nlohmann::json body = nlohmann::json::parse(r->body, nullptr, false);
      const auto role = body.is_object() ? body.find("role") : body.end();
      if (body.is_object() && role != body.end() && role->is_string() &&
          role->get<std::string>() != RoleName(instance->role)) {
        why = "its /health says role '" + role->get<std::string>() + "', but it is listed as a " +
              RoleName(instance->role) + " instance (--" + RoleName(instance->role) +
              "): start it with --role " + RoleName(instance->role) + " or list it right";
      }
    }
    const bool ok = why.empty();
    std::string previous;
    {
      std::lock_guard<std::mutex> lock(instance->reason_mu);
      previous = instance->reason;
      instance->reason = why;
    }
    const bool was = instance->healthy.exchange(ok);
    if (was != ok || (!ok && why != previous)) {
      if (ok) {
        spdlog::info("{} instance {} is healthy", RoleName(instance->role), instance->label);
      } else {
        spdlog::warn("{} instance {} is unhealthy: {}", RoleName(instance->role), instance->label,
                     why);
      }
    }
    std::unique_lock<std::mutex> lock(health_mu_);
    health_cv_.wait_for(lock, std::chrono::milliseconds(options_.health_interval_ms),
                        [this] { return health_stop_; });
  }
}

bool UpstreamPool::InstanceHealthy(Role role, size_t index) const {
  const Pool& pool = role == Role::kPrefill ? prefill_ : decode_;
  return index < pool.instances.size() && pool.instances[index]->healthy.load();
}

bool UpstreamPool::AnyHealthy(Role role) const {
  const Pool& pool = role == Role::kPrefill ? prefill_ : decode_;
  return std::any_of(pool.instances.begin(), pool.instances.end(),
                     [](const auto& inst) { return inst->healthy.load(); });
}

int UpstreamPool::RetryAfterSeconds() const {
  return std::max(1, (options_.health_interval_ms + 999) / 1000);
}

std::vector<UpstreamPool::Instance*> UpstreamPool::Candidates(Role role,
                                                              std::vector<Instance*>* skipped) {
  Pool& pool = role == Role::kPrefill ? prefill_ : decode_;
  std::vector<Instance*> healthy, unhealthy;
  for (auto& inst : pool.instances)
    (inst->healthy.load() ? healthy : unhealthy).push_back(inst.get());
  // Round-robin over the healthy ones. None healthy: none is tried (an instance that is down or
  // stopped would hold the request until a timeout; the client gets 503 and Retry-After).
  if (skipped != nullptr) *skipped = unhealthy;
  if (healthy.empty()) return healthy;
  const size_t start = static_cast<size_t>(pool.next.fetch_add(1) % healthy.size());
  std::rotate(healthy.begin(), healthy.begin() + static_cast<std::ptrdiff_t>(start), healthy.end());
  return healthy;
}

void UpstreamPool::CountFailure(Instance* instance, const std::string& why,
                                bool connection_failure) {
  instance->failures.fetch_add(1);
  if (connection_failure) {
    const bool newly = instance->healthy.exchange(false);
    {
      std::lock_guard<std::mutex> lock(instance->reason_mu);
      instance->reason = why;
    }
    spdlog::warn("{} instance {} failed: {}{}", RoleName(instance->role), instance->label, why,
                 newly ? " (marked unhealthy until its next good /health)" : "");
  } else {
    spdlog::info("{} instance {} refused a request: {}", RoleName(instance->role), instance->label,
                 why);
  }
}

UpstreamPool::Dispatched UpstreamPool::Dispatch(Role role, const UpstreamRequest& request,
                                                DispatchOptions how,
                                                const std::function<bool()>& give_up) {
  Dispatched out;
  std::vector<std::string> failures;
  // Buffered answers are taken whole at the end, so nothing may hold their receiver back;
  // relayed ones are taken as they come, the receiver waiting past 4 MiB not yet relayed.
  const UpstreamOptions options{
      options_.connect_timeout_s, options_.timeout_s,
      how.first_byte_timeout_s > 0 ? how.first_byte_timeout_s
                                   : options_.upstream_first_byte_timeout_s,
      options_.upstream_idle_timeout_s,
      how.buffered ? std::numeric_limits<size_t>::max() : size_t{4} << 20};
  const std::string role_name = RoleName(role);
  auto count = [&](const char* reason) {
    if (metrics_ != nullptr) metrics_->CountUpstreamFailure(role_name, reason);
  };
  bool timed_out = false, broken = false;
  std::vector<Instance*> skipped;
  const std::vector<Instance*> candidates = Candidates(role, &skipped);
  if (candidates.empty()) {
    out.no_healthy = true;
    if (metrics_ != nullptr) metrics_->CountNoHealthyInstance(role_name);
  }
  for (size_t attempt = 0; attempt < candidates.size(); ++attempt) {
    Instance* inst = candidates[attempt];
    if (give_up()) {
      out.given_up = true;
      break;
    }
    if (attempt > 0 && metrics_ != nullptr) metrics_->CountRetry(role_name);
    auto call =
        std::make_shared<UpstreamCall>(inst->address.host, inst->address.port, request, options);
    // Until the headers, an instance the health check marks unhealthy (stopped, hung, gone) is
    // given up on: nothing has reached the client, so the next one may take the request.
    bool abandoned = false;
    const bool headers = call->WaitHeaders([&] {
      if (give_up()) return true;
      abandoned = !inst->healthy.load();
      return abandoned;
    });
    if (headers && how.buffered) call->WaitDone(give_up);
    if (give_up()) {  // sticky: what ended a wait above still holds
      call->Cancel();
      out.given_up = true;
      break;
    }
    if (!headers || (how.buffered && !call->complete())) {
      if (!headers && abandoned) {
        const std::string why =
            "marked unhealthy by its health check while the request waited for an answer";
        failures.push_back(inst->label + " (" + why + ")");
        CountFailure(inst, why, /*connection_failure=*/true);
        count("unhealthy");
        continue;
      }
      const UpstreamFailure failure = call->failure();
      const std::string why = call->ErrorText();
      failures.push_back(inst->label + " (" + why + ")");
      CountFailure(inst, why, /*connection_failure=*/true);
      count(UpstreamFailureLabel(failure));
      if (IsTimeout(failure)) {
        // No retry: the client has waited the whole timeout already, and the instance may be
        // working on the request still (it sees the connection closed).
        timed_out = true;
        break;
      }
      broken = broken || failure == UpstreamFailure::kClosed;
      continue;
    }
    const int status = call->status();
    if (status == 429 || status == 503) {
      if (!how.buffered) call->WaitDone(nullptr, Clock::now() + std::chrono::seconds(1));
      const std::string why =
          "HTTP " + std::to_string(status) + ": " + ErrorMessageOf(call->TakeBody());
      call->Cancel();
      failures.push_back(inst->label + " (" + why + ")");
      CountFailure(inst, why, /*connection_failure=*/false);
      count("busy");
      continue;
    }
    out.call = std::move(call);
    out.label = inst->label;
    out.index = inst->index;
    return out;
  }
  out.status = timed_out ? 504 : broken ? 502 : 503;
  if (out.given_up) out.status = 503;
  if (!skipped.empty()) {
    std::string names;
    for (const Instance* inst : skipped) names += (names.empty() ? "" : ", ") + inst->label;
    failures.push_back((out.no_healthy ? "no healthy " + role_name + " instance; unhealthy: "
                                       : "not tried, unhealthy: ") +
                       names);
  }
  for (size_t i = 0; i < failures.size(); ++i) out.failures += (i ? "; " : "") + failures[i];
  return out;
}

void UpstreamPool::ReportBrokenAnswer(Role role, size_t index, UpstreamFailure failure,
                                      const std::string& why) {
  Pool& pool = role == Role::kPrefill ? prefill_ : decode_;
  if (index >= pool.instances.size()) return;
  CountFailure(pool.instances[index].get(), why, /*connection_failure=*/true);
  if (metrics_ != nullptr)
    metrics_->CountUpstreamFailure(RoleName(role), UpstreamFailureLabel(failure));
}

OrderedJson UpstreamPool::HealthJson(bool* all_roles_healthy) const {
  OrderedJson out = OrderedJson::object();
  bool ok = true;
  for (const auto& [name, pool] :
       {std::pair<const char*, const Pool*>{"prefill", &prefill_}, {"decode", &decode_}}) {
    OrderedJson list = OrderedJson::array();
    bool any = false;
    for (const auto& inst : pool->instances) {
      const bool h = inst->healthy.load();
      any = any || h;
      OrderedJson entry = {{"address", inst->label}, {"healthy", h}};
      if (!h) {
        std::lock_guard<std::mutex> lock(inst->reason_mu);
        if (!inst->reason.empty()) entry["reason"] = inst->reason;
      }
      list.push_back(std::move(entry));
    }
    ok = ok && any;
    out[name] = std::move(list);
  }
  if (all_roles_healthy != nullptr) *all_roles_healthy = ok;
  return out;
}

std::string UpstreamPool::RenderInstanceMetrics() const {
  std::ostringstream s;
  s << "# HELP oasis:router_instance_failures_total Upstream calls that failed (connection "
       "failure, closed, timed out, 429 or 503), by instance.\n"
       "# TYPE oasis:router_instance_failures_total counter\n";
  for (const Pool* pool : {&prefill_, &decode_}) {
    for (const auto& inst : pool->instances) {
      s << "oasis:router_instance_failures_total{role=\"" << RoleName(inst->role) << "\",address=\""
        << EscapeLabel(inst->label) << "\"} " << inst->failures.load() << "\n";
    }
  }
  s << "# HELP oasis:router_instance_healthy Whether the instance is healthy (1) or not (0).\n"
       "# TYPE oasis:router_instance_healthy gauge\n";
  for (const Pool* pool : {&prefill_, &decode_}) {
    for (const auto& inst : pool->instances) {
      s << "oasis:router_instance_healthy{role=\"" << RoleName(inst->role) << "\",address=\""
        << EscapeLabel(inst->label) << "\"} " << (inst->healthy.load() ? 1 : 0) << "\n";
    }
  }
  return s.str();
}

}  // namespace oasis::router
