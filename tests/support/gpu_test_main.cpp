// Main for GPU test executables: exits 77 (CTest: skipped) when no CUDA device exists.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "common/cuda_rt.h"

int main(int argc, char* argv[]) {
  if (oasis::cuda::DeviceCount() == 0) {
    std::printf("no CUDA device: GPU tests skipped\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
