// Sparse-KV select (kernels/sparse_kv.h): the working set's hits, misses and fetches under the
// per-step cap, and the per-layer block tables assembled from the resident slots.
#include <climits>

#include "kernels/common.cuh"
#include "kernels/sparse_kv.h"

namespace oasis::kernels {
namespace {

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
  int32_t* rout = p.remote != nullptr ? p.remote_out + base * p.cr : nullptr;
  for (int i = threadIdx.x; rout != nullptr && i < p.cr; i += blockDim.x) rout[i] = -1;
  if (p.rows[r] < 0) return;
  __shared__ int pred[kSelectMaxK], blocks[kSelectMaxK], age[kSelectMaxK], hit[kSelectMaxK],
      miss_rank[kSelectMaxK];
  __shared__ int victim_at[kSelectMaxK];
  // Step 6's candidates: [0, K) the in-place predicted blocks (by topk index), [K, 2K) the
  // working slots; -1 = not listed.
  __shared__ int cand_block[2 * kSelectMaxK], cand_slot[2 * kSelectMaxK];
  __shared__ int s_hits, s_misses, s_local, s_victims, s_resident, s_fresh;
  const uint8_t* rmask = p.remote != nullptr ? p.remote + base * p.max_blocks : nullptr;
  const int32_t* topk = p.topk + base * K;
  const int32_t* table = p.host_tables + base * p.max_blocks;
  const int32_t* slots = p.ws_slots + base * K;
  int32_t* g_blocks = p.ws_blocks + base * K;
  int32_t* g_age = p.ws_age + base * K;
  const int32_t base_in_place = p.in_place_base;
  const auto in_place = [&](int b) {
    return b >= 0 && b < p.max_blocks && table[b] >= base_in_place;
  };
  if (threadIdx.x == 0) s_hits = s_misses = s_local = s_victims = s_resident = s_fresh = 0;
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    pred[j] = topk[j];
    const int b = g_blocks[j];
    blocks[j] = in_place(b) ? -1 : b;  // a working slot never shadows an in-place block
    age[j] = g_age[j];
    hit[j] = 0;
    victim_at[j] = -1;
    cand_block[j] = -1;
  }
  __syncthreads();
  // 1–3: hits mark their slot; misses are ranked in topk order (best score first); predicted
  // in-place blocks are hits listed as candidates.
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    const int b = pred[i];
    miss_rank[i] = 0;  // 1 = a miss, for now
    if (b < 0) continue;
    if (in_place(b)) {
      cand_block[i] = b;
      cand_slot[i] = table[b] - base_in_place;
      atomicAdd(&s_hits, 1);
      atomicAdd(&s_fresh, 1);
      continue;
    }
    int at = -1;
    for (int j = 0; j < K; ++j) at = blocks[j] == b ? j : at;
    if (at >= 0) {
      hit[at] = 1;
      atomicAdd(&s_hits, 1);
    } else if (rmask != nullptr && b < p.max_blocks && rmask[b] != 0) {
      miss_rank[i] = 2;  // remote: listed, not fetched
      atomicAdd(&s_misses, 1);
    } else {
      miss_rank[i] = 1;
      atomicAdd(&s_misses, 1);
      atomicAdd(&s_local, 1);
    }
  }
  __syncthreads();
  int ranks[kSelectMaxK / kSelectThreads];
  for (int i = threadIdx.x, t = 0; i < K; i += blockDim.x, ++t) {
    int rank = -1;
    const int kind = miss_rank[i];
    if (kind != 0) {
      int before = 0;
      for (int i2 = 0; i2 < i; ++i2) before += miss_rank[i2] == kind;
      if (kind == 1) {
        rank = before;
      } else if (before < p.cr) {
        rout[before] = pred[i];
      }
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
  const int cap =
      p.fetch_cap != nullptr ? max(0, min(C, p.fetch_cap[blockIdx.x % p.num_kv_heads])) : C;
  const int n = min(min(s_local, cap), s_victims);
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    const int m = miss_rank[i];
    if (m < 0 || m >= n) continue;
    const int j = victim_at[m], b = pred[i];
    src[m] = b < p.max_blocks ? table[b] : -1;
    dst[m] = slots[j];
    blocks[j] = b;
    age[j] = 0;
    hit[j] = 1;  // fetched: listed like a hit
  }
  __syncthreads();
  // 6: resident slots by ascending logical block: in-place predicted blocks, predicted and
  // fetched working slots, then stale working slots (ascending j) while fewer than K.
  int32_t* res = p.resident_slots + base * K;
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    g_blocks[j] = blocks[j];
    g_age[j] = age[j];
    res[j] = -1;
    if (blocks[j] >= 0 && hit[j]) atomicAdd(&s_fresh, 1);
  }
  __syncthreads();
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    bool listed = blocks[j] >= 0 && hit[j];
    if (blocks[j] >= 0 && !hit[j]) {
      int stale_before = 0;
      for (int j2 = 0; j2 < j; ++j2) stale_before += blocks[j2] >= 0 && !hit[j2];
      listed = s_fresh + stale_before < K;
    }
    cand_block[K + j] = listed ? blocks[j] : -1;
    cand_slot[K + j] = slots[j];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * K; c += blockDim.x) {
    const int b = cand_block[c];
    if (b < 0) continue;
    atomicAdd(&s_resident, 1);
    int rank = 0;
    for (int c2 = 0; c2 < 2 * K; ++c2) rank += cand_block[c2] >= 0 && cand_block[c2] < b;
    res[rank] = cand_slot[c];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    p.num_resident[base] = s_resident;
    p.stats[base * 3] += s_hits;
    p.stats[base * 3 + 1] += s_misses;
    p.stats[base * 3 + 2] += n;
  }
}

// One warp per (sequence, KV head): the lanes copy the row's entries (a thread per row took
// ~26 µs at 32 × 8 rows of 129 entries, on the main stream of every sparse layer).
constexpr int kAssembleWarps = 4;

__global__ void __launch_bounds__(32 * kAssembleWarps)
    AssembleTablesKernel(AssembleTablesParams p) {
  const int item = blockIdx.x * kAssembleWarps + static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (item >= p.num_seqs * p.num_kv_heads) return;
  const int s = item / p.num_kv_heads, h = item % p.num_kv_heads;
  const int r = p.seq_rows[s];
  if (r < 0) return;
  const int tail = p.tail_lens[s];
  const int nt = (tail + kHeadBlockTokens - 1) / kHeadBlockTokens;
  const int n = p.num_resident[r * p.num_kv_heads + h];
  if (n + nt > p.width) return;  // the host checked the widths; never write past a row
  int32_t* row = p.block_tables + static_cast<int64_t>(item) * p.width;
  const int32_t* res = p.resident_slots + (static_cast<int64_t>(r) * p.num_kv_heads + h) * p.k;
  for (int i = lane; i < n; i += 32) row[i] = res[i];
  if (lane < nt) row[n + lane] = p.tail_slots[static_cast<int64_t>(item) * 2 + lane];
  if (lane == 0) p.kv_lens[item] = n * kHeadBlockTokens + tail;
}

__global__ void WriteIndexedKernel(const int32_t* values, const int32_t* index, int32_t* out,
                                   int64_t n, int64_t out_numel) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t at = index[i];
  if (at >= 0 && at < out_numel) out[at] = values[i];
}

}  // namespace

cudaError_t LaunchWriteIndexed(const int32_t* values, const int32_t* index, int32_t* out, int64_t n,
                               int64_t out_numel, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  WriteIndexedKernel<<<static_cast<unsigned>(CeilDiv(n, 256)), 256, 0, stream>>>(values, index, out,
                                                                                 n, out_numel);
  return cudaGetLastError();
}

cudaError_t LaunchSelectBlocks(const SelectBlocksParams& p, cudaStream_t stream) {
  if (p.k < 1 || p.k > kSelectMaxK || p.c < 0) return cudaErrorInvalidValue;
  if (p.rows_count == 0 || p.num_kv_heads == 0) return cudaSuccess;
  SelectBlocksKernel<<<static_cast<unsigned>(p.rows_count * p.num_kv_heads), kSelectThreads, 0,
                       stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchAssembleSparseTables(const AssembleTablesParams& p, cudaStream_t stream) {
  const int items = p.num_seqs * p.num_kv_heads;
  if (items == 0) return cudaSuccess;
  AssembleTablesKernel<<<CeilDiv(items, kAssembleWarps), 32 * kAssembleWarps, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace oasis::kernels
