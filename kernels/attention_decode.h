// Split-K flash-decoding attention over head-level block tables, for decode steps whose
// sequences have only a few query tokens (1–8: the next token, or draft/verify tokens).
//
// Semantics are exactly those of Backend::Attention (src/backend/backend.h) and of the
// reference LaunchPagedAttention (kernels/attention.h): sequence s owns query rows
// [query_start[s], query_start[s+1]); for KV head h its visible keys are the first
// kv_lens[s, h] tokens listed by block_tables[s, h, :] (slots of 16 tokens); its queries are
// the last q_len of those tokens, causal among themselves; query head j reads KV head
// j / (num_q_heads / num_kv_heads). Heads of one sequence may have different lengths and
// tables (sparse requests). Only the visible tokens of a slot are read into the result:
// the unwritten tail of a sequence's last slot may hold anything, NaN included.
//
// How it runs (docs/kernels/decode_attention.md has the details and the measurements):
//  1. split kernel: one 4-warp CTA per (sequence, KV head, KV split, 8- or 16-row chunk of the
//     GQA group × q tokens); each warp takes every 4th of the split's head-blocks and
//     streams them from HBM into a 2-deep (3 at head_dim 64) cp.async ring in shared memory,
//     computes K·Qᵀ and Vᵀ·Pᵀ for all query heads of the group and all q tokens of the sequence
//     with bf16 tensor-core MMAs (m16n8k16 with the rows as N, float accumulation) and an
//     online softmax, so each K/V byte is read once per GQA group. The warps are combined in
//     shared memory; a (sequence, KV head) whose real length needs one split is written out
//     directly.
//  2. merge kernel (only when the grid has more than one split): a programmatic dependent
//     launch that combines the used splits' partial outputs by their log-sum-exp.
// The split count comes from the host-known shapes (max_kv_len) and the GPU's resident-CTA
// capacity; the device then cuts each (sequence, KV head)'s real length into at most that many
// splits of at least 8 head-blocks, so short contexts under a large bound (CUDA graphs) leave
// the surplus CTAs empty (they exit at once). No host read of device memory: a launch can be
// captured in a CUDA graph.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kv_dtype.h"

namespace oasis::kernels {

// Largest query tokens per sequence the decode kernel accepts (the backend gives it up to 8 at
// head_dim 64/128: at 5 and 8 it takes 0.19-0.25 of the prefill kernel's time on the H200).
inline constexpr int kDecodeMaxQueryLen = 16;

// All pointers are device pointers; q, k_pool, v_pool and out must be 16-byte aligned.
struct DecodeAttentionParams {
  const __nv_bfloat16* q;       // [tokens, num_q_heads, head_dim]
  const __nv_bfloat16* k_pool;  // [num_slots, 16, head_dim]
  const __nv_bfloat16* v_pool;  // [num_slots, 16, head_dim]
  const int32_t* query_start;   // [num_seqs + 1], sorted, query_start[0] = 0
  const int32_t* kv_lens;       // [num_seqs, num_kv_heads], kv_lens[s, h] >= q_len(s)
  const int32_t* block_tables;  // [num_seqs, num_kv_heads, max_blocks] slot ids
  __nv_bfloat16* out;           // [tokens, num_q_heads, head_dim]
  int64_t tokens = 0;           // query_start[num_seqs]
  int num_seqs = 0;
  int num_q_heads = 0;  // a multiple of num_kv_heads
  int num_kv_heads = 0;
  int head_dim = 0;       // 64, 128 or 256
  int max_blocks = 0;     // width of block_tables
  int max_query_len = 0;  // host-known bound of q_len over the batch, 1..kDecodeMaxQueryLen
  float scale = 1.0f;     // softmax(q·k * scale)
  // Optional host-known bound of kv_lens, only used to choose the split count (0: max_blocks*16).
  // A bound that is too small costs balance, never correctness.
  int max_kv_len = 0;
  // Number of KV splits in the grid: 0 chooses from the shapes and the GPU; n > 0 forces
  // min(n, head-blocks of the bound), each real length then cut into n pieces of >= 1 head-block
  // (tests, tuning). DecodeAttentionNumSplits says how many a launch will use.
  int num_splits = 0;
  // FP8 pools (kv_dtype kFp8E4M3): k_pool / v_pool are unused; these hold the e4m3 bytes
  // (16-byte aligned) and the per-KV-head scales. The kernel streams the bytes (half of bf16's),
  // widens them exactly to f16 in registers and runs f16 MMAs (q converted to f16 once, P in
  // f16), with k_scale[h] folded into the softmax scale and v_scale[h] into the output.
  KvDtype kv_dtype = KvDtype::kBf16;
  const uint8_t* k_pool_fp8 = nullptr;  // [num_slots, 16, head_dim]
  const uint8_t* v_pool_fp8 = nullptr;  // [num_slots, 16, head_dim]
  const float* k_scale = nullptr;       // [num_kv_heads]
  const float* v_scale = nullptr;       // [num_kv_heads]
  // The launch right before this one (PDL) is the step's KV append: it wrote q and the K/V of
  // the query tokens, and nothing this kernel reads besides was written by it (query_start,
  // kv_lens, block_tables and the K/V of every token before a sequence's query run were
  // written earlier). The kernel then reads the tables and requests its first head-blocks of
  // older tokens before it waits on the append. False: it waits before reading anything.
  bool after_append = false;
};

// The number of KV splits a launch with these params uses (1: no merge, no workspace).
// Reads the current device's SM count and the kernel's occupancy (cached); no device memory.
int DecodeAttentionNumSplits(const DecodeAttentionParams& p);

// Workspace bytes a launch with these params needs for the splits' partial results (0 when
// one split is used): tokens × num_q_heads × splits × (head_dim + 1) × 4 bytes, where splits
// never exceed ceil(2 × resident CTAs / (num_seqs × num_kv_heads × row chunks)) (nor
// max_kv_len / 128) unless num_splits forces more. A function of the params only (kv_dtype
// included: the FP8 kernel plans its own split count): size a CUDA graph's workspace with the
// params it captures.
size_t DecodeAttentionWorkspaceBytes(const DecodeAttentionParams& p);

// Decode attention (see above). `workspace` must hold DecodeAttentionWorkspaceBytes(p) bytes
// (may be null when that is 0), 16-byte aligned. Returns cudaErrorInvalidValue for shapes it
// does not support (head_dim not 64/128/256, num_q_heads % num_kv_heads != 0, max_query_len out
// of range, misaligned pointers, workspace too small, an FP8 launch without its pools or
// scales), else the launch error. Enqueues on
// `stream` only; no host synchronisation.
cudaError_t LaunchDecodeAttention(const DecodeAttentionParams& p, void* workspace,
                                  size_t workspace_bytes, cudaStream_t stream);

}  // namespace oasis::kernels
