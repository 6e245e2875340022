// Tile scheduling shared by the two prefill attention kernels (attention_prefill.cu, mma.sync;
// attention_prefill_sm90.cu, wgmma): the grid is (query tile, query head) pairs, tiles are mapped
// to (sequence, query tile of that sequence) on the device from query_start, and the host bounds
// the tile count without reading device memory.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/attention_prefill.h"
#include "kernels/common.cuh"

namespace oasis::kernels::prefill {

// Maps tile index t of the launch to (sequence, query tile of that sequence). Sequence s has
// ceil(q_len_s / kBlockM) tiles, numbered in sequence order; inside a sequence the first index
// goes to the last (most expensive, under causal masking) query tile so heavy work starts
// first. Returns false when t is past the last tile. Every lane of the warp must call it.
template <int kBlockM>
__device__ __forceinline__ bool FindTile(const int32_t* query_start, int num_seqs, int t, int& seq,
                                         int& q_tile) {
  const int lane = threadIdx.x & 31;
  int base = 0;  // tiles of the sequences before this group of 32
  for (int s0 = 0; s0 < num_seqs; s0 += 32) {
    const int s = s0 + lane;
    const int n = s < num_seqs ? (query_start[s + 1] - query_start[s] + kBlockM - 1) / kBlockM : 0;
    int inclusive = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, inclusive, o);
      if (lane >= o) inclusive += v;
    }
    const int total = __shfl_sync(0xffffffffu, inclusive, 31);
    if (t < base + total) {
      const unsigned past = __ballot_sync(0xffffffffu, base + inclusive > t);
      const int owner = __ffs(past) - 1;
      const int before = __shfl_sync(0xffffffffu, inclusive - n, owner);
      const int count = __shfl_sync(0xffffffffu, n, owner);
      seq = s0 + owner;
      q_tile = count - 1 - (t - base - before);
      return true;
    }
    base += total;
  }
  return false;
}

// This CTA's query head `qh`, sequence `seq` and query tile `q_tile`; false when the CTA has no
// tile (past the real count: it exits at once). blockIdx.x = tile * num_q_heads + head: the heads
// of one query tile (and the query heads of a GQA group, which read the same K/V) run side by
// side and share K/V through L2. Every lane of the warp must call it.
template <int kBlockM>
__device__ __forceinline__ bool CtaTile(const PrefillAttentionParams& p, int num_tiles_per_head,
                                        int& qh, int& seq, int& q_tile) {
  qh = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.num_q_heads));
  const int tile_index = static_cast<int>(blockIdx.x / static_cast<unsigned>(p.num_q_heads));
  if (tile_index >= num_tiles_per_head) return false;
  return FindTile<kBlockM>(p.query_start, p.num_seqs, tile_index, seq, q_tile);
}

// Raises `kernel`'s dynamic shared-memory limit to `bytes` once per device (the limit is per
// function, per context). One cache per kernel instance (kKernel); thread-safe.
template <auto kKernel>
cudaError_t EnsureDynamicSmem(int bytes) {
  static std::atomic<uint64_t> configured_devices{0};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const uint64_t bit = uint64_t{1} << (device & 63);
  if (!(configured_devices.load(std::memory_order_acquire) & bit)) {
    err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) return err;
    configured_devices.fetch_or(bit, std::memory_order_release);
  }
  return cudaSuccess;
}

// Launches `kKernel(p, tiles)` over tiles × num_q_heads CTAs. Tiles per head: the sum over
// sequences of ceil(q_len / block_m), bounded without reading the device metadata; CTAs past the
// real count exit at once.
template <auto kKernel>
cudaError_t LaunchTiles(const PrefillAttentionParams& p, int block_m, int threads, int smem_bytes,
                        cudaStream_t stream) {
  const cudaError_t err = EnsureDynamicSmem<kKernel>(smem_bytes);
  if (err != cudaSuccess) return err;
  int64_t tiles = (p.tokens + static_cast<int64_t>(p.num_seqs) * (block_m - 1)) / block_m;
  if (p.max_query_len > 0) {
    tiles = std::min<int64_t>(tiles,
                              static_cast<int64_t>(p.num_seqs) * CeilDiv(p.max_query_len, block_m));
  }
  if (tiles <= 0) return cudaSuccess;
  const int64_t ctas = tiles * p.num_q_heads;
  if (ctas > 0x7fffffff) return cudaErrorInvalidValue;
  kKernel<<<static_cast<unsigned>(ctas), threads, smem_bytes, stream>>>(p, static_cast<int>(tiles));
  return cudaGetLastError();
}

}  // namespace oasis::kernels::prefill
