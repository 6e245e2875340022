#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/host_memory.h"

using namespace oasis;
namespace fs = std::filesystem;

namespace {

// A scratch cgroup tree: files written under a fresh temporary directory, removed after.
struct Tree {
  fs::path root;
  Tree() {
    root = fs::temp_directory_path() / ("oasis-cgroup-" + std::to_string(getpid()) + "-" +
                                        std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::remove_all(root);
    fs::create_directories(root);
  }
  ~Tree() { fs::remove_all(root); }
  void Write(const std::string& rel, const std::string& text) const {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text;
  }
};

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

TEST_CASE("host memory: cgroup v2 limits, the least over the cgroup and its ancestors",
          "[host_memory]") {
  Tree t;
  // /sys/fs/cgroup/app/worker: the parent allows 8 GiB (6 used, 1 of it reclaimable cache),
  // the worker 16 GiB (2 used): the parent binds, 8 - (6 - 1) = 3 GiB.
  t.Write("app/memory.max", std::to_string(8 * kGiB));
  t.Write("app/memory.current", std::to_string(6 * kGiB));
  t.Write("app/memory.stat", "anon 1000\ninactive_file " + std::to_string(1 * kGiB) + "\n");
  t.Write("app/worker/memory.max", std::to_string(16 * kGiB));
  t.Write("app/worker/memory.current", std::to_string(2 * kGiB));
  const auto avail = CgroupAvailableBytes("0::/app/worker\n", t.root.string());
  REQUIRE(avail.has_value());
  CHECK(*avail == Approx(3 * kGiB));

  SECTION("max means no limit") {
    t.Write("app/memory.max", "max\n");
    const auto a = CgroupAvailableBytes("0::/app/worker\n", t.root.string());
    REQUIRE(a.has_value());
    CHECK(*a == Approx(14 * kGiB));
  }
  SECTION("no limit anywhere: nullopt") {
    t.Write("app/memory.max", "max\n");
    t.Write("app/worker/memory.max", "max\n");
    CHECK_FALSE(CgroupAvailableBytes("0::/app/worker\n", t.root.string()).has_value());
  }
  SECTION("usage past the limit leaves nothing, never a negative") {
    t.Write("app/worker/memory.max", std::to_string(1 * kGiB));
    t.Write("app/worker/memory.current", std::to_string(3 * kGiB));
    CHECK(*CgroupAvailableBytes("0::/app/worker\n", t.root.string()) == 0.0);
  }
  SECTION("a path the namespace hides reads the mount's root") {
    t.Write("memory.max", std::to_string(4 * kGiB));
    t.Write("memory.current", std::to_string(1 * kGiB));
    const auto a = CgroupAvailableBytes("0::/elsewhere/not/here\n", t.root.string());
    REQUIRE(a.has_value());
    CHECK(*a == Approx(3 * kGiB));
  }
}

TEST_CASE("host memory: cgroup v1, the memory controller's line only", "[host_memory]") {
  Tree t;
  t.Write("memory/memory.limit_in_bytes", "9223372036854771712\n");  // the root: no limit
  t.Write("memory/memory.usage_in_bytes", std::to_string(50 * kGiB));
  t.Write("memory/jobs/a/memory.limit_in_bytes", std::to_string(10 * kGiB));
  t.Write("memory/jobs/a/memory.usage_in_bytes", std::to_string(4 * kGiB));
  t.Write("memory/jobs/a/memory.stat", "cache 5\ntotal_inactive_file " + std::to_string(2 * kGiB) + "\n");
  t.Write("cpu/jobs/a/memory.limit_in_bytes", "1\n");  // another controller's tree: not read
  const std::string self = "9:name=systemd:/\n4:memory:/jobs/a\n2:cpu,cpuacct:/jobs/a\n0::/\n";
  const auto a = CgroupAvailableBytes(self, t.root.string());
  REQUIRE(a.has_value());
  CHECK(*a == Approx(8 * kGiB));  // 10 - (4 - 2)
  CHECK_FALSE(CgroupAvailableBytes("4:memory:/\n", (t.root / "none").string()).has_value());
  CHECK_FALSE(CgroupAvailableBytes("garbage\n\n:::\n", t.root.string()).has_value());
}

TEST_CASE("host memory: this machine's figures are sane", "[host_memory]") {
  const double phys = PhysicalHostMemoryGiB();
  CHECK(phys > 0);
  const auto avail = AvailableHostMemoryGiB();
  REQUIRE(avail.has_value());  // Linux: /proc/meminfo says
  CHECK(*avail >= 0);
  CHECK(*avail <= phys * 1.01);
}
