// UpstreamPool: oasis-router's prefill and decode instances (router.h §2-4, §7): their health (a
// thread per instance polling GET /health; a failed call marks an instance unhealthy until its
// next good poll), the round-robin choice among the healthy ones (none healthy: nothing is
// tried), and Dispatch, which sends one request to the healthy instances of a role in turn
// until one takes it, moving on only while nothing of the answer has reached the client.
//
// Owns the instances and, from StartHealthChecks() to JoinHealthChecks() (one thread), one
// health thread per instance. Thread-safe otherwise: Dispatch, InstanceHealthy, HealthJson
// and RenderInstanceMetrics may run concurrently from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "router/router_metrics.h"
#include "router/router_protocol.h"
#include "router/router_settings.h"

namespace oasis::router {

class UpstreamCall;
struct UpstreamRequest;
enum class UpstreamFailure;

enum class Role { kPrefill, kDecode };
const char* RoleName(Role role);  // "prefill", "decode"

class UpstreamPool {
 public:
  // The outcome of Dispatch: a call whose headers arrived with a status other than 429/503
  // (its body may still be arriving), the instance's label ("host:port") and index, or no
  // call, `failures` saying why and `status` the answer for the client: 503 (no healthy
  // instance, or each refused or could not be reached: `retry_after_s` applies), 502 (an
  // instance broke its answer off) or 504 (an instance timed out).
  struct Dispatched {
    std::shared_ptr<UpstreamCall> call;
    std::string label;
    size_t index = 0;
    std::string failures;
    int status = 503;
    bool no_healthy = false;  // no healthy instance: none was tried
    bool given_up = false;    // `give_up` said so (the call in progress was cancelled)
  };

  // How Dispatch waits. `buffered`: for the whole answer (a transport failure while reading
  // it counts as a failure of that instance too), else for its headers. `first_byte_timeout_s`
  // (> 0) replaces the router's --upstream-first-byte-timeout-s (a non-streamed decode answer
  // comes whole at the end: --timeout-s).
  struct DispatchOptions {
    bool buffered = true;
    double first_byte_timeout_s = 0;
  };

  // The instances of `options` (its timeouts and health intervals apply); failures, retries
  // and refusals are counted in `metrics` (may be null).
  UpstreamPool(const RouterOptions& options, RouterMetrics* metrics);
  ~UpstreamPool();
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;

  void StartHealthChecks();
  // Wakes the health threads and ends them (from any thread; they do not start again).
  void StopHealthChecks();
  // StopHealthChecks(), then joins the health threads (the thread that started them).
  void JoinHealthChecks();

  // Tries the role's healthy instances in turn (round-robin), each at most once: the next one
  // after a connection failure, a connection closed before the answer (whole, when buffered),
  // a 429 or 503, or an instance the health check marks unhealthy while its answer's headers
  // are awaited. A timeout ends the attempts (504: the client has waited the whole timeout).
  // `give_up` (polled every 50 ms: the router stopping, the client gone) cancels the call in
  // progress and ends the attempts (Dispatched.given_up).
  Dispatched Dispatch(Role role, const UpstreamRequest& request, DispatchOptions how,
                      const std::function<bool()>& give_up);
  // A relayed answer (Dispatched.call of instance `index`) that failed midway: counted, and
  // the instance marked unhealthy until its next good /health.
  void ReportBrokenAnswer(Role role, size_t index, UpstreamFailure failure, const std::string& why);

  bool InstanceHealthy(Role role, size_t index) const;
  bool AnyHealthy(Role role) const;
  // Retry-After for a 503 of Dispatch: the health interval in whole seconds (at least 1).
  int RetryAfterSeconds() const;
  // {"prefill":[{"address","healthy"[,"reason"]}...],"decode":[...]} ("reason": why an
  // unhealthy instance is, e.g. its /health names another role); `*all_roles_healthy`: each
  // role has a healthy instance.
  OrderedJson HealthJson(bool* all_roles_healthy) const;
  // oasis:router_instance_failures_total and oasis:router_instance_healthy, by instance.
  std::string RenderInstanceMetrics() const;

 private:
  struct Instance {
    Role role;
    Address address;
    std::string label;  // "host:port"
    std::atomic<bool> healthy{true};
    std::atomic<int64_t> failures{0};
    size_t index = 0;
    std::mutex reason_mu;
    std::string reason;  // guarded by reason_mu: why it is unhealthy (the last failure)
  };
  struct Pool {
    std::vector<std::unique_ptr<Instance>> instances;
    std::atomic<uint64_t> next{0};
  };

  void HealthLoop(Instance* instance);
  // The instances to try, in order: the healthy ones round-robin; `skipped` receives the
  // unhealthy ones left out.
  std::vector<Instance*> Candidates(Role role, std::vector<Instance*>* skipped);
  void CountFailure(Instance* instance, const std::string& why, bool connection_failure);

  const RouterOptions options_;
  RouterMetrics* const metrics_;
  Pool prefill_, decode_;

  std::mutex health_mu_;
  std::condition_variable health_cv_;
  bool health_stop_ = false;  // guarded by health_mu_
  std::vector<std::thread> health_threads_;
};

}  // namespace oasis::router
