// RaiseOpenFileLimit: the soft limit of open files rises to the hard one (what a server needs
// for many connections), and a later call changes nothing.
#include <catch2/catch.hpp>

#include <sys/resource.h>

#include "common/program.h"

using namespace oasis;

TEST_CASE("RaiseOpenFileLimit raises the soft limit to the hard limit", "[common]") {
  rlimit before{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &before) == 0);
  // Lower the soft limit first (allowed without privileges), so that the raise is seen.
  rlimit lowered = before;
  lowered.rlim_cur = std::min<rlim_t>(before.rlim_max, 256);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &lowered) == 0);
  const uint64_t now = RaiseOpenFileLimit();
  rlimit after{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &after) == 0);
  CHECK(after.rlim_cur == before.rlim_max);
  CHECK(now == static_cast<uint64_t>(after.rlim_cur));
  CHECK(RaiseOpenFileLimit() == now);
}
