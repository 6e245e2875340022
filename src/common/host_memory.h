// The host's memory as the server sizes host-side pools by it (--host-kv-gib, the staging
// pool): what the machine has in all and what it can give to new allocations now.
#pragma once

#include <optional>

namespace oasis {

// Physical memory in GiB (sysconf).
double PhysicalHostMemoryGiB();
// Memory available for new allocations now without swapping, in GiB: /proc/meminfo's
// MemAvailable; nullopt where the system does not say.
std::optional<double> AvailableHostMemoryGiB();

}  // namespace oasis
