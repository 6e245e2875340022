// Catch2 main of the network-namespace tests: exits 77 (CTest: skipped) with the reason when
// UCX cannot initialise or a namespace joined by veth cannot be made here (not root, no
// iproute2, a container without the permission). Listing the tests needs neither.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>

#include "disagg/ucx.h"
#include "netns_pair.h"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--list", 6) == 0) listing = true;
  }
  if (!listing) {
    auto context = oasis::disagg::UcxContext::Create();
    if (!context.ok()) {
      std::fprintf(stderr, "SKIPPED: UCX cannot initialise on this machine: %s\n",
                   context.status().ToString().c_str());
      return 77;
    }
    std::string why;
    if (oasis::disagg::testing::NetnsPair::Create(&why) == nullptr) {
      std::fprintf(stderr, "SKIPPED: cannot make a network namespace joined by veth: %s\n",
                   why.c_str());
      return 77;
    }
  }
  return Catch::Session().run(argc, argv);
}
