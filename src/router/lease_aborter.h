// LeaseAborter: ends the staged KV lease of a request whose decode leg failed after its prefill
// instance handed it off (router.h §3): no decode instance will read it, so the router sends
// the prefill instance's StagingServer kAbort for the ticket's lease (over UCX, as a decode
// instance would), and its slots are freed at once instead of at the lease's TTL.
//
// One UCX context (made at the first abort) and one RemoteReader per staging address, kept
// for the next abort (a reader that failed is replaced). Abort() blocks for at most the
// connect timeout; thread-safe (a mutex: aborts are rare).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "oasis/status.h"

namespace oasis::disagg {
class RemoteReader;
class UcxContext;
}  // namespace oasis::disagg

namespace oasis::router {

class LeaseAborter {
 public:
  // `secret`: the staging servers' shared secret (empty: none).
  LeaseAborter(std::string secret, std::chrono::milliseconds connect_timeout);
  ~LeaseAborter();
  LeaseAborter(const LeaseAborter&) = delete;
  LeaseAborter& operator=(const LeaseAborter&) = delete;

  // Sends kAbort for `lease_id` to the staging server at `staging_address` ("host:port").
  // An id the server no longer holds is ignored there.
  Status Abort(const std::string& staging_address, uint64_t lease_id);

  uint64_t aborted() const { return aborted_.load(); }
  uint64_t failed() const { return failed_.load(); }

 private:
  const std::string secret_;
  const std::chrono::milliseconds connect_timeout_;
  std::mutex mu_;
  std::shared_ptr<disagg::UcxContext> context_;                           // guarded by mu_
  std::map<std::string, std::unique_ptr<disagg::RemoteReader>> readers_;  // guarded by mu_
  std::atomic<uint64_t> aborted_{0}, failed_{0};
};

}  // namespace oasis::router
