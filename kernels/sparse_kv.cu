#include <climits>

#include "kernels/common.cuh"
#include "kernels/sparse_kv.h"

namespace oasis::kernels {
namespace {

constexpr int kBlockTokens = 16;

// ---- Block summaries: one CTA per entry, threads over head_dim.
__global__ void BlockSummariesKernel(const bf16* k_pool, const int32_t* src_slots, const int32_t* num_tokens,
                                     const int32_t* dst_rows, bf16* kmin, bf16* kmax, int head_dim) {
  const int64_t i = blockIdx.x;
  const int count = num_tokens[i], dst = dst_rows[i];
  if (count <= 0 || dst < 0) return;
  const bf16* k = k_pool + static_cast<int64_t>(src_slots[i]) * kBlockTokens * head_dim;
  for (int x = threadIdx.x; x < head_dim; x += blockDim.x) {
    float lo = ToFloat(k[x]), hi = lo;
    for (int j = 1; j < count && j < kBlockTokens; ++j) {
      const float v = ToFloat(k[j * head_dim + x]);
      lo = fminf(lo, v);
      hi = fmaxf(hi, v);
    }
    kmin[static_cast<int64_t>(dst) * head_dim + x] = ToBf16(lo);  // exact: a stored bf16 value
    kmax[static_cast<int64_t>(dst) * head_dim + x] = ToBf16(hi);
  }
}

// ---- Block scores. A CTA serves one (row, KV head) and kScoreBlocksPerCta blocks; a block's
// summary is read by D/8 lanes with 16-byte loads (several blocks per warp for D < 256); the
// group's queries sit in shared memory as float.
constexpr int kScoreThreads = 256;
constexpr int kScoreBlocksPerCta = 128;
constexpr int kScoreMaxGroup = 16;

template <int D>
__global__ void __launch_bounds__(kScoreThreads) ScoreBlocksKernel(ScoreBlocksParams p) {
  constexpr int kLanes = D / 8;              // lanes per block
  constexpr int kPerWarp = 32 / kLanes;      // blocks per warp at a time
  const int r = blockIdx.y / p.num_kv_heads, h = blockIdx.y % p.num_kv_heads;
  const int row = p.query_rows[r];
  if (row < 0) return;
  const int nb = min(p.num_blocks[r], p.max_blocks);
  const int b0 = blockIdx.x * kScoreBlocksPerCta;
  if (b0 >= nb) return;
  const int group = p.num_q_heads / p.num_kv_heads;
  __shared__ float qs[kScoreMaxGroup][D];
  for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
    const int j = i / D, x = i % D;
    qs[j][x] = ToFloat(p.q[(static_cast<int64_t>(row) * p.num_q_heads + h * group + j) * D + x]);
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int sub = lane / kLanes, part = lane % kLanes;
  const int64_t base = (static_cast<int64_t>(r) * p.num_kv_heads + h) * p.max_blocks;
  const int b_end = min(nb, b0 + kScoreBlocksPerCta);
  for (int b_first = b0 + warp * kPerWarp; b_first < b_end; b_first += (kScoreThreads / 32) * kPerWarp) {
    const int b = b_first + sub;
    const bool valid = b < b_end;
    float lo[8], hi[8];
    const int64_t m = valid ? p.host_tables[base + b] : -1;
    if (m >= 0) {
      const uint4 vlo = *reinterpret_cast<const uint4*>(p.kmin + m * D + part * 8);
      const uint4 vhi = *reinterpret_cast<const uint4*>(p.kmax + m * D + part * 8);
      const bf16* l = reinterpret_cast<const bf16*>(&vlo);
      const bf16* u = reinterpret_cast<const bf16*>(&vhi);
#pragma unroll
      for (int i = 0; i < 8; ++i) lo[i] = ToFloat(l[i]), hi[i] = ToFloat(u[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) lo[i] = hi[i] = 0.0f;
    }
    float acc = 0.0f;
    for (int j = 0; j < group; ++j) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float qv = qs[j][part * 8 + i];
        s += fmaxf(qv * hi[i], qv * lo[i]);
      }
#pragma unroll
      for (int o = kLanes / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      acc = j == 0 ? s : (p.reduce_max ? fmaxf(acc, s) : acc + s);
    }
    if (valid && part == 0) p.scores[base + b] = m >= 0 ? acc : -INFINITY;  // no summary: never chosen
  }
}

// ---- Top-K: one CTA per (row, KV head). Keys order (score desc, id asc) as one 64-bit value;
// an 8-pass radix select finds the K-th largest key, the CTA gathers the keys at or above it
// and ranks them by counting.
constexpr int kTopKThreads = 512;
constexpr int kTopKMax = 1024;

__device__ __forceinline__ uint64_t TopKKey(float s, int b) {
  s += 0.0f;  // -0 -> +0: equal scores compare equal, like the CPU's comparison
  uint32_t bits = __float_as_uint(s);
  bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<uint64_t>(bits) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(b));
}

__global__ void __launch_bounds__(kTopKThreads)
    TopKBlocksKernel(const float* scores, const int32_t* rows, const int32_t* num_blocks, int32_t* topk,
                     int num_kv_heads, int max_blocks, int k) {
  const int r = blockIdx.x / num_kv_heads;
  if (rows[r] < 0) return;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * max_blocks;
  const float* s = scores + base;
  int32_t* out = topk + static_cast<int64_t>(blockIdx.x) * k;
  const int n = min(num_blocks[r], max_blocks);
  const int take = min(k, n);
  __shared__ int hist[256];
  __shared__ uint64_t cand[kTopKMax];
  __shared__ int s_count, s_digit, s_remaining;
  uint64_t threshold = 0;  // the take-th largest key (0: everything)
  if (n > take) {
    uint64_t prefix = 0, mask = 0;
    if (threadIdx.x == 0) s_remaining = take;
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const uint64_t key = TopKKey(s[i], i);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
      }
      __syncthreads();
      if (threadIdx.x < 32) {  // warp 0: the digit where the count from the top reaches `remaining`
        const int lane = threadIdx.x;
        int mine = 0;
        for (int d = 0; d < 8; ++d) mine += hist[255 - (lane * 8 + d)];
        int incl = mine;  // inclusive prefix over lanes (lane 0 holds the top digits)
        for (int o = 1; o < 32; o <<= 1) {
          const int v = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o) incl += v;
        }
        const int excl = incl - mine, need = s_remaining;
        __syncwarp();  // every lane has read s_remaining before the owner rewrites it (racecheck)
        const unsigned ballot = __ballot_sync(0xffffffffu, incl >= need);
        const int owner = __ffs(ballot) - 1;
        if (lane == owner) {
          int cum = excl;
          for (int d = 0; d < 8; ++d) {
            const int digit = 255 - (lane * 8 + d);
            if (cum + hist[digit] >= need) {
              s_digit = digit;
              s_remaining = need - cum;
              break;
            }
            cum += hist[digit];
          }
        }
      }
      __syncthreads();
      prefix |= static_cast<uint64_t>(s_digit) << shift;
      mask |= uint64_t{255} << shift;
      __syncthreads();  // s_digit is rewritten by the next pass
    }
    threshold = prefix;
  }
  if (threadIdx.x == 0) s_count = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint64_t key = TopKKey(s[i], i);
    if (key >= threshold) cand[atomicAdd(&s_count, 1)] = key;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < take; i += blockDim.x) {
    const uint64_t key = cand[i];
    int rank = 0;
    for (int j = 0; j < take; ++j) rank += cand[j] > key;
    out[rank] = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFu));
  }
  for (int i = take + threadIdx.x; i < k; i += blockDim.x) out[i] = -1;
}

// ---- Select: one CTA per (row, KV head); the rules of Backend::SelectBlocks with rank-by-count
// in shared memory (K is at most a few hundred).
constexpr int kSelectThreads = 256;

__global__ void __launch_bounds__(kSelectThreads) SelectBlocksKernel(SelectBlocksParams p) {
  const int r = blockIdx.x / p.num_kv_heads;
  const int64_t base = blockIdx.x;
  const int K = p.k, C = p.c;
  int32_t* src = p.fetch_src + base * C;
  int32_t* dst = p.fetch_dst + base * C;
  for (int i = threadIdx.x; i < C; i += blockDim.x) src[i] = dst[i] = -1;
  if (p.rows[r] < 0) return;
  __shared__ int pred[kSelectMaxK], blocks[kSelectMaxK], age[kSelectMaxK], hit[kSelectMaxK], miss_rank[kSelectMaxK];
  __shared__ int victim_at[kSelectMaxK];
  __shared__ int s_hits, s_misses, s_victims, s_resident;
  const int32_t* topk = p.topk + base * K;
  const int32_t* table = p.host_tables + base * p.max_blocks;
  const int32_t* slots = p.ws_slots + base * K;
  int32_t* g_blocks = p.ws_blocks + base * K;
  int32_t* g_age = p.ws_age + base * K;
  if (threadIdx.x == 0) s_hits = s_misses = s_victims = s_resident = 0;
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    pred[j] = topk[j];
    blocks[j] = g_blocks[j];
    age[j] = g_age[j];
    hit[j] = 0;
    victim_at[j] = -1;
  }
  __syncthreads();
  // 1–3: hits mark their slot; misses are ranked in topk order (best score first).
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    const int b = pred[i];
    miss_rank[i] = 0;  // 1 = a miss, for now
    if (b < 0) continue;
    int at = -1;
    for (int j = 0; j < K; ++j) at = blocks[j] == b ? j : at;
    if (at >= 0) {
      hit[at] = 1;
      atomicAdd(&s_hits, 1);
    } else {
      miss_rank[i] = 1;
      atomicAdd(&s_misses, 1);
    }
  }
  __syncthreads();
  int ranks[kSelectMaxK / kSelectThreads];
  for (int i = threadIdx.x, t = 0; i < K; i += blockDim.x, ++t) {
    int rank = -1;
    if (miss_rank[i] == 1) {
      rank = 0;
      for (int i2 = 0; i2 < i; ++i2) rank += miss_rank[i2];
    }
    ranks[t] = rank;
  }
  __syncthreads();
  for (int i = threadIdx.x, t = 0; i < K; i += blockDim.x, ++t) miss_rank[i] = ranks[t];
  __syncthreads();
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    if (hit[j]) {
      age[j] = 0;
    } else if (blocks[j] >= 0) {
      age[j] = age[j] == INT_MAX ? age[j] : age[j] + 1;
    }
  }
  __syncthreads();
  // 4: victims ordered: empty slots (ascending j), then by descending age, ties ascending j.
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    const bool victim = blocks[j] < 0 || !hit[j];
    if (!victim) continue;
    atomicAdd(&s_victims, 1);
    const bool empty = blocks[j] < 0;
    int rank = 0;
    for (int j2 = 0; j2 < K; ++j2) {
      if (j2 == j || !(blocks[j2] < 0 || !hit[j2])) continue;
      const bool e2 = blocks[j2] < 0;
      bool before;
      if (e2 != empty) {
        before = e2;
      } else if (empty) {
        before = j2 < j;
      } else {
        before = age[j2] > age[j] || (age[j2] == age[j] && j2 < j);
      }
      rank += before;
    }
    if (rank < C) victim_at[rank] = j;
  }
  __syncthreads();
  // 5: admit n = min(misses, C, victims), best-scored misses first.
  const int n = min(min(s_misses, C), s_victims);
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    const int m = miss_rank[i];
    if (m < 0 || m >= n) continue;
    const int j = victim_at[m], b = pred[i];
    src[m] = b < p.max_blocks ? table[b] : -1;
    dst[m] = slots[j];
    blocks[j] = b;
    age[j] = 0;
  }
  __syncthreads();
  // 6: resident slots by ascending logical block.
  int32_t* res = p.resident_slots + base * K;
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    g_blocks[j] = blocks[j];
    g_age[j] = age[j];
    res[j] = -1;
  }
  __syncthreads();
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    if (blocks[j] < 0) continue;
    atomicAdd(&s_resident, 1);
    int rank = 0;
    for (int j2 = 0; j2 < K; ++j2) rank += blocks[j2] >= 0 && blocks[j2] < blocks[j];
    res[rank] = slots[j];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    p.num_resident[base] = s_resident;
    p.stats[base * 3] += s_hits;
    p.stats[base * 3 + 1] += s_misses;
    p.stats[base * 3 + 2] += n;
  }
}

// ---- Head-block copies (the UVA gather): each CTA moves whole blocks, 16 bytes per thread.
constexpr int kCopyThreads = 256;

__global__ void __launch_bounds__(kCopyThreads) CopyBlocksKernel(const bf16* src_k, const bf16* src_v,
                                                                 const int32_t* src_slots, bf16* dst_k, bf16* dst_v,
                                                                 const int32_t* dst_slots, int64_t n, int head_dim) {
  const int64_t vecs = int64_t{kBlockTokens} * head_dim / 8;  // 16-byte vectors per block
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t s = src_slots[i], d = dst_slots[i];
    if (s < 0 || d < 0) continue;
    const uint4* sk = reinterpret_cast<const uint4*>(src_k) + s * vecs;
    const uint4* sv = reinterpret_cast<const uint4*>(src_v) + s * vecs;
    uint4* dk = reinterpret_cast<uint4*>(dst_k) + d * vecs;
    uint4* dv = reinterpret_cast<uint4*>(dst_v) + d * vecs;
    for (int64_t v = threadIdx.x; v < vecs; v += blockDim.x) {
      const uint4 a = sk[v], b = sv[v];
      dk[v] = a;
      dv[v] = b;
    }
  }
}

__global__ void CopyTokensKernel(const bf16* src_k, const bf16* src_v, const int64_t* src_index, bf16* dst_k,
                                 bf16* dst_v, const int64_t* dst_index, int64_t n, int head_dim) {
  const int vecs = head_dim / 8;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= n * vecs) return;
  const int64_t i = item / vecs, v = item % vecs;
  const int64_t s = src_index[i], d = dst_index[i];
  if (s < 0 || d < 0) return;
  reinterpret_cast<uint4*>(dst_k)[d * vecs + v] = reinterpret_cast<const uint4*>(src_k)[s * vecs + v];
  reinterpret_cast<uint4*>(dst_v)[d * vecs + v] = reinterpret_cast<const uint4*>(src_v)[s * vecs + v];
}

__global__ void AssembleTablesKernel(AssembleTablesParams p) {
  const int item = blockIdx.x * blockDim.x + threadIdx.x;
  if (item >= p.num_seqs * p.num_kv_heads) return;
  const int s = item / p.num_kv_heads, h = item % p.num_kv_heads;
  const int r = p.seq_rows[s];
  if (r < 0) return;
  const int tail = p.tail_lens[s];
  const int nt = (tail + kBlockTokens - 1) / kBlockTokens;
  const int n = p.num_resident[r * p.num_kv_heads + h];
  if (n + nt > p.width) return;  // the host checked the widths; never write past a row
  int32_t* row = p.block_tables + static_cast<int64_t>(item) * p.width;
  const int32_t* res = p.resident_slots + (static_cast<int64_t>(r) * p.num_kv_heads + h) * p.k;
  for (int i = 0; i < n; ++i) row[i] = res[i];
  for (int i = 0; i < nt; ++i) row[n + i] = p.tail_slots[static_cast<int64_t>(item) * 2 + i];
  p.kv_lens[item] = n * kBlockTokens + tail;
}

__global__ void TopKOverlapKernel(const int32_t* predicted, const int32_t* actual, const int32_t* rows,
                                  int32_t* counts, int num_kv_heads, int k) {
  const int r = blockIdx.x / num_kv_heads;
  if (rows[r] < 0) return;
  const int32_t* pr = predicted + static_cast<int64_t>(blockIdx.x) * k;
  const int32_t* ac = actual + static_cast<int64_t>(blockIdx.x) * k;
  int overlap = 0, total = 0;
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    if (ac[i] < 0) continue;
    ++total;
    for (int j = 0; j < k; ++j) {
      if (pr[j] == ac[i]) {
        ++overlap;
        break;
      }
    }
  }
  __shared__ float scratch[32];
  const float o = BlockSum(static_cast<float>(overlap), scratch);
  const float t = BlockSum(static_cast<float>(total), scratch);
  if (threadIdx.x == 0) {
    counts[static_cast<int64_t>(blockIdx.x) * 2] += static_cast<int32_t>(o);
    counts[static_cast<int64_t>(blockIdx.x) * 2 + 1] += static_cast<int32_t>(t);
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

cudaError_t LaunchBlockSummaries(const bf16* k_pool, const int32_t* src_slots, const int32_t* num_tokens,
                                 const int32_t* dst_rows, bf16* kmin, bf16* kmax, int64_t n, int head_dim,
                                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > INT_MAX || head_dim <= 0) return cudaErrorInvalidValue;
  BlockSummariesKernel<<<static_cast<unsigned>(n), 128, 0, stream>>>(k_pool, src_slots, num_tokens, dst_rows, kmin,
                                                                     kmax, head_dim);
  return cudaGetLastError();
}

bool ScoreBlocksSupported(int head_dim, int group) {
  return (head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256) && group >= 1 &&
         group <= kScoreMaxGroup;
}

cudaError_t LaunchScoreBlocks(const ScoreBlocksParams& p, cudaStream_t stream) {
  if (p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0 ||
      !ScoreBlocksSupported(p.head_dim, p.num_q_heads / p.num_kv_heads) || !Aligned16(p.kmin) || !Aligned16(p.kmax)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0 || p.max_blocks == 0) return cudaSuccess;
  const dim3 grid(CeilDiv(p.max_blocks, kScoreBlocksPerCta), static_cast<unsigned>(p.rows * p.num_kv_heads));
  switch (p.head_dim) {
    case 32: ScoreBlocksKernel<32><<<grid, kScoreThreads, 0, stream>>>(p); break;
    case 64: ScoreBlocksKernel<64><<<grid, kScoreThreads, 0, stream>>>(p); break;
    case 128: ScoreBlocksKernel<128><<<grid, kScoreThreads, 0, stream>>>(p); break;
    default: ScoreBlocksKernel<256><<<grid, kScoreThreads, 0, stream>>>(p); break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchTopKBlocks(const float* scores, const int32_t* rows, const int32_t* num_blocks, int32_t* topk,
                             int num_rows, int num_kv_heads, int max_blocks, int k, cudaStream_t stream) {
  if (k < 1 || k > kTopKMax) return cudaErrorInvalidValue;
  if (num_rows == 0 || num_kv_heads == 0) return cudaSuccess;
  TopKBlocksKernel<<<static_cast<unsigned>(num_rows * num_kv_heads), kTopKThreads, 0, stream>>>(
      scores, rows, num_blocks, topk, num_kv_heads, max_blocks, k);
  return cudaGetLastError();
}

cudaError_t LaunchSelectBlocks(const SelectBlocksParams& p, cudaStream_t stream) {
  if (p.k < 1 || p.k > kSelectMaxK || p.c < 0) return cudaErrorInvalidValue;
  if (p.rows_count == 0 || p.num_kv_heads == 0) return cudaSuccess;
  SelectBlocksKernel<<<static_cast<unsigned>(p.rows_count * p.num_kv_heads), kSelectThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchCopyBlocks(const bf16* src_k, const bf16* src_v, const int32_t* src_slots, bf16* dst_k, bf16* dst_v,
                             const int32_t* dst_slots, int64_t n, int head_dim, int max_ctas, cudaStream_t stream) {
  if (head_dim % 8 != 0 || !Aligned16(src_k) || !Aligned16(src_v) || !Aligned16(dst_k) || !Aligned16(dst_v) ||
      max_ctas < 1) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  const int64_t grid = n < max_ctas ? n : max_ctas;
  CopyBlocksKernel<<<static_cast<unsigned>(grid), kCopyThreads, 0, stream>>>(src_k, src_v, src_slots, dst_k, dst_v,
                                                                             dst_slots, n, head_dim);
  return cudaGetLastError();
}

cudaError_t LaunchCopyTokens(const bf16* src_k, const bf16* src_v, const int64_t* src_index, bf16* dst_k, bf16* dst_v,
                             const int64_t* dst_index, int64_t n, int head_dim, cudaStream_t stream) {
  if (head_dim % 8 != 0 || !Aligned16(src_k) || !Aligned16(src_v) || !Aligned16(dst_k) || !Aligned16(dst_v)) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  const int64_t items = n * (head_dim / 8);
  CopyTokensKernel<<<CeilDiv(items, 256), 256, 0, stream>>>(src_k, src_v, src_index, dst_k, dst_v, dst_index, n,
                                                            head_dim);
  return cudaGetLastError();
}

cudaError_t LaunchAssembleSparseTables(const AssembleTablesParams& p, cudaStream_t stream) {
  const int items = p.num_seqs * p.num_kv_heads;
  if (items == 0) return cudaSuccess;
  AssembleTablesKernel<<<CeilDiv(items, 128), 128, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchTopKOverlap(const int32_t* predicted, const int32_t* actual, const int32_t* rows, int32_t* counts,
                              int num_rows, int num_kv_heads, int k, cudaStream_t stream) {
  if (k < 1) return cudaErrorInvalidValue;
  if (num_rows == 0 || num_kv_heads == 0) return cudaSuccess;
  TopKOverlapKernel<<<static_cast<unsigned>(num_rows * num_kv_heads), 128, 0, stream>>>(predicted, actual, rows,
                                                                                        counts, num_kv_heads, k);
  return cudaGetLastError();
}

}  // namespace oasis::kernels
