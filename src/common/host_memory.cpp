#include "common/host_memory.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace oasis {

double PhysicalHostMemoryGiB() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE)) /
         (1024.0 * 1024.0 * 1024.0);
}

std::optional<double> AvailableHostMemoryGiB() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string key, unit;
    double kib = 0;
    if (s >> key >> kib >> unit && key == "MemAvailable:" && unit == "kB" && kib >= 0)
      return kib / (1024.0 * 1024.0);
  }
  return std::nullopt;
}

}  // namespace oasis
