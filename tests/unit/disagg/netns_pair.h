// Two "hosts" on one machine for the transport tests: a network namespace joined to the
// current one by a veth pair, each end with an address of a /30 in 198.18.0.0/15 (the
// benchmarking range, RFC 2544, unlikely to shadow a real route). Needs root and `ip`.
// Names and the subnet derive from the pid, so concurrent test processes do not collide.
// The destructor deletes the namespace (which deletes the veth pair). Not thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace oasis::disagg::testing {

class NetnsPair {
 public:
  // The pair, or nullptr with `*why` set (not root, no `ip`, namespaces not permitted).
  static std::unique_ptr<NetnsPair> Create(std::string* why);
  ~NetnsPair();
  NetnsPair(const NetnsPair&) = delete;
  NetnsPair& operator=(const NetnsPair&) = delete;

  const std::string& name() const { return name_; }
  const std::string& host_address() const { return host_ip_; }  // our end of the veth
  const std::string& ns_address() const { return ns_ip_; }      // the namespace's end
  // argv that runs `argv` inside the namespace (through `ip netns exec`).
  std::vector<std::string> Inside(const std::vector<std::string>& argv) const;

 private:
  NetnsPair() = default;
  std::string ip_;  // path of the `ip` tool
  std::string name_, veth_host_, veth_ns_, host_ip_, ns_ip_;
  bool created_ = false;
};

// Runs argv (argv[0] a path) with stdout/stderr discarded; its exit code, or -1.
int RunQuiet(const std::vector<std::string>& argv);

}  // namespace oasis::disagg::testing
