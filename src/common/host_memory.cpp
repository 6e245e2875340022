#include "common/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace oasis {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The first number in a file, or nullopt (missing file, "max", not a number).
std::optional<double> ReadNumber(const std::filesystem::path& p) {
  std::ifstream in(p);
  double v = 0;
  if (in >> v && v >= 0) return v;
  return std::nullopt;
}

// The value of `key` in a "key value" file (memory.stat), 0 when absent.
double StatValue(const std::filesystem::path& p, const std::string& key) {
  std::ifstream in(p);
  std::string k;
  double v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

// Walks `dir` and its ancestors up to and including `top`, keeping the least limit - usage.
void WalkUp(std::filesystem::path dir, const std::filesystem::path& top, bool v2,
            std::optional<double>& least) {
  // Limits at or above 2^60 bytes (v1 writes 9223372036854771712) mean none.
  constexpr double kNoLimit = 1152921504606846976.0;
  while (true) {
    const auto limit = ReadNumber(dir / (v2 ? "memory.max" : "memory.limit_in_bytes"));
    const auto usage = ReadNumber(dir / (v2 ? "memory.current" : "memory.usage_in_bytes"));
    if (limit && usage && *limit < kNoLimit) {
      const double cache =
          StatValue(dir / "memory.stat", v2 ? "inactive_file" : "total_inactive_file");
      const double avail = std::max(0.0, *limit - std::max(0.0, *usage - cache));
      least = least ? std::min(*least, avail) : avail;
    }
    if (dir == top || !dir.has_parent_path() || dir.parent_path() == dir) return;
    dir = dir.parent_path();
  }
}

}  // namespace

double PhysicalHostMemoryGiB() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE)) /
         kGiB;
}

std::optional<double> CgroupAvailableBytes(const std::string& proc_self_cgroup,
                                           const std::string& cgroup_root) {
  namespace fs = std::filesystem;
  std::optional<double> least;
  std::istringstream lines(proc_self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // hierarchy-id:controllers:path
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
    bool memory = false;
    std::istringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');) memory |= c == "memory";
    if (!v2 && !memory) continue;
    const fs::path top = v2 ? fs::path(cgroup_root) : fs::path(cgroup_root) / "memory";
    while (!path.empty() && path.front() == '/') path.erase(0, 1);
    // Inside a cgroup namespace the path may not exist under the mount: its root is ours.
    fs::path dir = top / path;
    std::error_code ec;
    if (path.empty() || !fs::is_directory(dir, ec)) dir = top;
    WalkUp(dir.lexically_normal(), top.lexically_normal(), v2, least);
  }
  return least;
}

std::optional<double> AvailableHostMemoryGiB() {
  std::optional<double> avail;
  {
    std::ifstream in("/proc/meminfo");
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream s(line);
      std::string key, unit;
      double kib = 0;
      if (s >> key >> kib >> unit && key == "MemAvailable:" && unit == "kB" && kib >= 0) {
        avail = kib / (1024.0 * 1024.0);
        break;
      }
    }
  }
  std::ifstream cg("/proc/self/cgroup");
  const std::string text((std::istreambuf_iterator<char>(cg)), std::istreambuf_iterator<char>());
  if (const auto bytes = CgroupAvailableBytes(text, "/sys/fs/cgroup")) {
    const double gib = *bytes / kGiB;
    avail = avail ? std::min(*avail, gib) : gib;
  }
  return avail;
}

}  // namespace oasis
