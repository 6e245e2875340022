// The host's memory as the server sizes host-side pools by it (--host-kv-gib, the staging
// pool): what the machine has in all and what it can give to new allocations now.
#pragma once

#include <optional>
#include <string>

namespace oasis {

// Physical memory in GiB (sysconf).
double PhysicalHostMemoryGiB();
// Memory available for new allocations now without swapping, in GiB: the smaller of
// /proc/meminfo's MemAvailable and what this process's memory cgroup still allows (a container's
// limit: docker run --memory); nullopt where the system says neither.
std::optional<double> AvailableHostMemoryGiB();

// What the memory cgroups of a process still let it take, in bytes: over every cgroup of
// `proc_self_cgroup` (the text of /proc/self/cgroup; v2 "0::/path" and v1 "N:...memory...:/path")
// and each of its ancestors under `cgroup_root` (/sys/fs/cgroup), the least of limit - usage,
// where usage leaves out the inactive file cache the kernel reclaims first (v2 memory.max,
// memory.current and memory.stat's inactive_file; v1 memory.limit_in_bytes,
// memory.usage_in_bytes and total_inactive_file). nullopt when no cgroup sets a limit.
std::optional<double> CgroupAvailableBytes(const std::string& proc_self_cgroup,
                                           const std::string& cgroup_root);

}  // namespace oasis
