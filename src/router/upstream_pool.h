// UpstreamPool: oasis-router's prefill and decode instances (router.h §2-4): their health (a
// thread per instance polling GET /health; a connection failure marks an instance unhealthy
// until its next good poll), the round-robin choice among the healthy ones, and Dispatch, which
// sends one request to the instances of a role in turn until one takes it.
//
// Owns the instances and, from StartHealthChecks() to JoinHealthChecks() (one thread), one
// health thread per instance. Thread-safe otherwise: Dispatch, InstanceHealthy, HealthJson
// and RenderInstanceMetrics may run concurrently from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "router/router_protocol.h"
#include "router/router_settings.h"

namespace oasis::router {

class UpstreamCall;
struct UpstreamRequest;

enum class Role { kPrefill, kDecode };
const char* RoleName(Role role);  // "prefill", "decode"

class UpstreamPool {
 public:
  // The outcome of Dispatch: a call whose headers arrived with a status other than 429/503
  // (its body may still be arriving) and the instance's label ("host:port"), or no call and
  // `failures` says why.
  struct Dispatched {
    std::shared_ptr<UpstreamCall> call;
    std::string label;
    std::string failures;
  };

  // The instances of `options` (its timeouts and health intervals apply).
  explicit UpstreamPool(const RouterOptions& options);
  ~UpstreamPool();
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;

  void StartHealthChecks();
  // Wakes the health threads and ends them (from any thread; they do not start again).
  void StopHealthChecks();
  // StopHealthChecks(), then joins the health threads (the thread that started them).
  void JoinHealthChecks();

  // Tries the role's instances in turn. `buffered`: wait for the whole answer (a transport
  // failure while reading it counts as a failure of that instance too). `stopping` (the
  // router's shutdown) cancels the call in progress and ends the attempts.
  Dispatched Dispatch(Role role, const UpstreamRequest& request, bool buffered,
                      const std::atomic<bool>& stopping);

  bool InstanceHealthy(Role role, size_t index) const;
  // {"prefill":[{"address","healthy"}...],"decode":[...]}; `*all_roles_healthy`: each role has
  // a healthy instance.
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
  };
  struct Pool {
    std::vector<std::unique_ptr<Instance>> instances;
    std::atomic<uint64_t> next{0};
  };

  void HealthLoop(Instance* instance);
  // The instances to try, in order: the healthy ones round-robin (all when none is healthy);
  // `skipped` receives the unhealthy ones left out.
  std::vector<Instance*> Candidates(Role role, std::vector<Instance*>* skipped);
  void CountFailure(Instance* instance, const std::string& why, bool connection_failure);

  const RouterOptions options_;
  Pool prefill_, decode_;

  std::mutex health_mu_;
  std::condition_variable health_cv_;
  bool health_stop_ = false;  // guarded by health_mu_
  std::vector<std::thread> health_threads_;
};

}  // namespace oasis::router
