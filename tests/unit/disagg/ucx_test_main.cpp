// Catch2 main of the UCX tests: when UCX cannot initialise on this machine (no usable
// transport, a sandbox without sockets), every test exits 77 — CTest reports it as skipped —
// with the reason, instead of failing. Listing the tests (CTest discovery) needs no UCX.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>

#include "disagg/ucx.h"

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
  }
  return Catch::Session().run(argc, argv);
}
