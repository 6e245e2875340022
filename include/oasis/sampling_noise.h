// Counter-based sampling noise shared by the CPU sampler and the CUDA sampling kernel, so
// a seeded request draws the same tokens on either backend: the Gumbel noise of token `id`
// at generation step `counter` of a request with seed `seed` is a pure function of the
// three. Header-only; usable from host and device code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define OASIS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define OASIS_HOST_DEVICE inline
#endif

namespace oasis {

// splitmix64's finaliser: a bijective 64-bit mix.
OASIS_HOST_DEVICE uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Per-(request, step) key; the token id is mixed in per candidate.
OASIS_HOST_DEVICE uint64_t NoiseKey(uint64_t seed, uint64_t counter) {
  return Mix64(seed ^ Mix64(counter + 0x9e3779b97f4a7c15ULL));
}

// Uniform in the open interval (0, 1), 53 random bits.
OASIS_HOST_DEVICE double NoiseUniform(uint64_t key, int64_t id) {
  const uint64_t h = Mix64(key ^ (static_cast<uint64_t>(id) * 0xd6e8feb86659fd93ULL));
  return (static_cast<double>(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

}  // namespace oasis
