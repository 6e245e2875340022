// Sparse-KV gather (kernels/sparse_kv.h): head-block copies from pinned host memory (the UVA
// gather, through the TMA or through registers) and single-token write-through.
#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/sparse_kv.h"

namespace oasis::kernels {
namespace {

// ---- Head-block copies (the UVA gather): a grid-stride loop over (block, 16-byte vector) items,
// kCopyUnroll items per thread in flight before any store (K and V each: 8 loads of 16 bytes), so a
// few CTAs keep enough host reads outstanding to fill PCIe and leave the other SMs to the step's
// kernels (a read of mapped host memory waits microseconds; CTAs that wait hold their SM's slots).
constexpr int kCopyThreads = 256;
constexpr int kCopyUnroll = 4;

// Pools are moved as bytes: `row_vecs` 16-byte vectors per token row (head_dim · element size /
// 16).
__global__ void __launch_bounds__(kCopyThreads)
    CopyBlocksKernel(const void* src_k, const void* src_v, const int32_t* src_slots, void* dst_k,
                     void* dst_v, const int32_t* dst_slots, int64_t n, int row_vecs) {
  const int64_t vecs = int64_t{kHeadBlockTokens} * row_vecs;  // 16-byte vectors per block
  const int64_t total = n * vecs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const uint4* sk = reinterpret_cast<const uint4*>(src_k);
  const uint4* sv = reinterpret_cast<const uint4*>(src_v);
  uint4* dk = reinterpret_cast<uint4*>(dst_k);
  uint4* dv = reinterpret_cast<uint4*>(dst_v);
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; first < total;
       first += stride * kCopyUnroll) {
    uint4 a[kCopyUnroll], b[kCopyUnroll];
    int64_t to[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int64_t item = first + u * stride;
      to[u] = -1;
      if (item >= total) continue;
      const int64_t i = item / vecs, v = item - i * vecs;
      const int64_t s = src_slots[i], d = dst_slots[i];
      if (s < 0 || d < 0) continue;
      a[u] = sk[s * vecs + v];
      b[u] = sv[s * vecs + v];
      to[u] = d * vecs + v;
    }
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      if (to[u] < 0) continue;
      dk[to[u]] = a[u];
      dv[to[u]] = b[u];
    }
  }
}

// The gather through the TMA (the default): lane 0 of a one-warp CTA streams its share of the
// blocks (i = blockIdx.x + j·gridDim.x) through a ring of kTmaGatherStages shared-memory slots,
// each the K then the V of one head-block: two bulk loads from the host (one instruction per
// 16·D·2 bytes, completion counted on the slot's mbarrier), then two bulk stores to the
// destination slot; a slot is loaded again once its stores have read it. No registers hold data
// and the CTA has one warp, so beside the step's kernels it takes almost nothing from its SM:
// on the H200 the sparse step with transfers on was 2–8% faster than with the register gather
// (docs/benchmarks.md, eleventh session). Bulk copies reach mapped host memory like global
// memory (tests/kernels/test_cuda_sparse.cpp checks both directions).
constexpr int kTmaGatherStages = 2;

__global__ void __launch_bounds__(32)
    CopyBlocksTmaKernel(const char* src_k, const char* src_v, const int32_t* src_slots, char* dst_k,
                        char* dst_v, const int32_t* dst_slots, int64_t n, int block_bytes) {
  constexpr int stages = kTmaGatherStages;
  extern __shared__ __align__(128) unsigned char ring[];  // [stages][K, V][block_bytes]
  __shared__ __align__(8) uint64_t bars[stages];
  if (threadIdx.x != 0) return;
  const uint32_t ring0 = SmemAddr(ring);
  const uint32_t bar0 = SmemAddr(bars);
  for (int st = 0; st < stages; ++st) MbarInit(bar0 + 8 * st, 1);
  FenceMbarrierInit();
  // This CTA's entries; one with a negative slot is skipped (its slot's phase completes empty).
  // Each entry's slots are read again before its stores, as in the kernel measured in
  // docs/benchmarks.md (holding them in a per-stage array was never compared on one machine).
  const int64_t mine = n > blockIdx.x ? (n - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  auto issue = [&](int64_t j) {
    const int st = static_cast<int>(j % stages);
    const int64_t i = blockIdx.x + j * gridDim.x;
    const int32_t sl = src_slots[i];
    const uint32_t bar = bar0 + 8 * st, at = ring0 + st * 2 * block_bytes;
    if (sl < 0 || dst_slots[i] < 0) {
      MbarArrive(bar);  // an empty phase
      return;
    }
    MbarArriveExpectTx(bar, 2u * block_bytes);
    BulkLoad(at, src_k + static_cast<int64_t>(sl) * block_bytes, block_bytes, bar);
    BulkLoad(at + block_bytes, src_v + static_cast<int64_t>(sl) * block_bytes, block_bytes, bar);
  };
  for (int64_t j = 0; j < mine && j < stages; ++j) issue(j);
  for (int64_t j = 0; j < mine; ++j) {
    const int st = static_cast<int>(j % stages);
    MbarWait(bar0 + 8 * st, static_cast<uint32_t>((j / stages) & 1));
    const int64_t i = blockIdx.x + j * gridDim.x;
    const int32_t d = dst_slots[i];
    if (d >= 0 && src_slots[i] >= 0) {
      const uint32_t at = ring0 + st * 2 * block_bytes;
      BulkStore(dst_k + static_cast<int64_t>(d) * block_bytes, at, block_bytes);
      BulkStore(dst_v + static_cast<int64_t>(d) * block_bytes, at + block_bytes, block_bytes);
      BulkCommit();
    }
    if (j + stages < mine) {
      BulkWaitRead();  // the slot's stores have read it
      issue(j + stages);
    }
  }
  BulkWait();
}

__global__ void CopyTokensKernel(const void* src_k, const void* src_v, const int64_t* src_index,
                                 void* dst_k, void* dst_v, const int64_t* dst_index, int64_t n,
                                 int row_vecs) {
  const int vecs = row_vecs;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= n * vecs) return;
  const int64_t i = item / vecs, v = item % vecs;
  const int64_t s = src_index[i], d = dst_index[i];
  if (s < 0 || d < 0) return;
  reinterpret_cast<uint4*>(dst_k)[d * vecs + v] =
      reinterpret_cast<const uint4*>(src_k)[s * vecs + v];
  reinterpret_cast<uint4*>(dst_v)[d * vecs + v] =
      reinterpret_cast<const uint4*>(src_v)[s * vecs + v];
}

}  // namespace

cudaError_t LaunchCopyBlocks(const bf16* src_k, const bf16* src_v, const int32_t* src_slots,
                             bf16* dst_k, bf16* dst_v, const int32_t* dst_slots, int64_t n,
                             int head_dim, int max_ctas, cudaStream_t stream, GatherKernel kernel) {
  if (head_dim % 8 != 0) return cudaErrorInvalidValue;
  return LaunchCopyBlockBytes(src_k, src_v, src_slots, dst_k, dst_v, dst_slots, n, head_dim * 2,
                              max_ctas, stream, kernel);
}

cudaError_t LaunchCopyBlockBytes(const void* src_k, const void* src_v, const int32_t* src_slots,
                                 void* dst_k, void* dst_v, const int32_t* dst_slots, int64_t n,
                                 int row_bytes, int max_ctas, cudaStream_t stream,
                                 GatherKernel kernel) {
  if (row_bytes <= 0 || row_bytes % 16 != 0 || !Aligned16(src_k) || !Aligned16(src_v) ||
      !Aligned16(dst_k) || !Aligned16(dst_v) || max_ctas < 1) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  // The stream's priority as the launch's own: a graph that captures this launch keeps it on
  // the node (run with cudaGraphInstantiateFlagUseNodePriority), so the gather stays ahead of
  // the step's many-CTA kernels there too.
  int priority = 0;
  if (cudaStreamGetPriority(stream, &priority) != cudaSuccess) return cudaGetLastError();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributePriority;
  attr[0].val.priority = priority;
  cudaLaunchConfig_t cfg = {};
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaError_t err;
  if (kernel == GatherKernel::kTma) {
    const int block_bytes = kHeadBlockTokens * row_bytes;  // a multiple of 16
    cfg.gridDim = dim3(static_cast<unsigned>(std::min<int64_t>(n, max_ctas)));
    cfg.blockDim = dim3(32);
    cfg.dynamicSmemBytes =
        static_cast<size_t>(kTmaGatherStages) * 2 * block_bytes;  // 16 KiB at head_dim 128
    err = cudaLaunchKernelEx(&cfg, CopyBlocksTmaKernel, reinterpret_cast<const char*>(src_k),
                             reinterpret_cast<const char*>(src_v), src_slots,
                             reinterpret_cast<char*>(dst_k), reinterpret_cast<char*>(dst_v),
                             dst_slots, n, block_bytes);
  } else {
    const int64_t vecs = int64_t{kHeadBlockTokens} * (row_bytes / 16);
    const int64_t per_cta = int64_t{kCopyThreads} * kCopyUnroll;  // items one CTA has in flight
    const int64_t needed = (n * vecs + per_cta - 1) / per_cta;
    cfg.gridDim = dim3(static_cast<unsigned>(needed < max_ctas ? needed : max_ctas));
    cfg.blockDim = dim3(kCopyThreads);
    err = cudaLaunchKernelEx(&cfg, CopyBlocksKernel, src_k, src_v, src_slots, dst_k, dst_v,
                             dst_slots, n, row_bytes / 16);
  }
  return err != cudaSuccess ? err : cudaGetLastError();
}

cudaError_t LaunchCopyTokens(const bf16* src_k, const bf16* src_v, const int64_t* src_index,
                             bf16* dst_k, bf16* dst_v, const int64_t* dst_index, int64_t n,
                             int head_dim, cudaStream_t stream) {
  if (head_dim % 8 != 0) return cudaErrorInvalidValue;
  return LaunchCopyTokenBytes(src_k, src_v, src_index, dst_k, dst_v, dst_index, n, head_dim * 2,
                              stream);
}

cudaError_t LaunchCopyTokenBytes(const void* src_k, const void* src_v, const int64_t* src_index,
                                 void* dst_k, void* dst_v, const int64_t* dst_index, int64_t n,
                                 int row_bytes, cudaStream_t stream) {
  if (row_bytes <= 0 || row_bytes % 16 != 0 || !Aligned16(src_k) || !Aligned16(src_v) ||
      !Aligned16(dst_k) || !Aligned16(dst_v)) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  const int64_t items = n * (row_bytes / 16);
  CopyTokensKernel<<<CeilDiv(items, 256), 256, 0, stream>>>(src_k, src_v, src_index, dst_k, dst_v,
                                                            dst_index, n, row_bytes / 16);
  return cudaGetLastError();
}

}  // namespace oasis::kernels
