// Catch2 main of the UCX tests: when UCX cannot initialise on this machine (no usable
// transport, a sandbox without sockets) every test exits 77 — CTest reports it as skipped —
// with the reason, instead of failing. Built with OASIS_DISAGG_NETNS (the network-namespace
// tests) it also skips when a namespace joined by veth cannot be made here (not root, no
// iproute2, a container without the permission). Listing the tests (CTest discovery) needs
// neither.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <string>

#include "disagg/ucx.h"
#if defined(OASIS_DISAGG_NETNS)
#include "netns_pair.h"
#endif

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--list", 6) == 0) listing = true;
  }
  if (!listing) {
    auto context = oasis::disagg::UcxContext::Create();
    oasis::Status status = context.status();
    if (context.ok()) status = oasis::disagg::UcxWorker::Create(*context).status();
    if (!status.ok()) {
      std::fprintf(stderr, "SKIPPED: UCX cannot initialise on this machine: %s\n",
                   status.ToString().c_str());
      return 77;
    }
#if defined(OASIS_DISAGG_NETNS)
    std::string why;
    if (oasis::disagg::testing::NetnsPair::Create(&why) == nullptr) {
      std::fprintf(stderr, "SKIPPED: cannot make a network namespace joined by veth: %s\n",
                   why.c_str());
      return 77;
    }
#endif
  }
  return Catch::Session().run(argc, argv);
}
