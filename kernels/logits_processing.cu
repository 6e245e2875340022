// Logits processing: one grid of (chunks, rows). Each CTA processes one slice of one row
// element by element (oasis/logits_penalty.h), then, after a barrier, rewrites the tokens of
// its slice that have a per-step edit (bias, mask) with the edit applied.
#include <cstdint>

#include "include/oasis/logits_penalty.h"
#include "kernels/logits_processing.h"

namespace oasis::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 4096;  // logits per CTA

__device__ __forceinline__ float ProcessOne(const float* __restrict__ in, const LogitsRowDevice& r,
                                            int i, bool masked, float bias) {
  int32_t count = r.counts != nullptr ? r.counts[i] : 0;
  for (int d = 0; d < r.num_draft; ++d) count += r.draft[d] == i ? 1 : 0;
  const bool in_prompt = r.prompt != nullptr && r.prompt[i] != 0;
  masked = masked || (r.allowed != nullptr && r.allowed[i] == 0);
  return ProcessLogit(__ldg(in + i), masked, bias, count, in_prompt, r.repetition, r.frequency,
                      r.presence);
}

__global__ void __launch_bounds__(kThreads)
    ProcessLogitsKernel(const float* __restrict__ logits, int vocab, int64_t stride,
                        const LogitsRowDevice* __restrict__ rows,
                        const LogitsEntryDevice* __restrict__ entries, float* processed,
                        int64_t processed_stride) {
  __shared__ LogitsRowDevice r;
  if (threadIdx.x == 0) r = rows[blockIdx.y];
  __syncthreads();
  const int begin = blockIdx.x * kChunk;
  const int end = min(vocab, begin + kChunk);
  const float* in = logits + static_cast<int64_t>(r.logits_row) * stride;
  float* out = processed + static_cast<int64_t>(r.out_row) * processed_stride;
  for (int i = begin + threadIdx.x; i < end; i += kThreads)
    out[i] = ProcessOne(in, r, i, false, 0.0f);
  if (r.entries_begin == r.entries_end) return;
  __syncthreads();  // the slice's plain values are written: the edited tokens overwrite theirs
  // The row's entries inside [begin, end): a lower bound on the sorted tokens.
  int lo = r.entries_begin, hi = r.entries_end;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (entries[mid].token < begin) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  for (int e = lo + threadIdx.x; e < r.entries_end; e += kThreads) {
    const LogitsEntryDevice ent = entries[e];
    if (ent.token >= end) break;
    if (ent.token < 0) continue;
    out[ent.token] = ProcessOne(in, r, ent.token, ent.masked != 0, ent.bias);
  }
}

__global__ void TokenUpdatesKernel(const TokenUpdateDevice* __restrict__ updates, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const TokenUpdateDevice u = updates[i];
  if (u.op == 0) {
    atomicAdd(static_cast<int32_t*>(u.base) + u.token, 1);
  } else {
    static_cast<uint8_t*>(u.base)[u.token] = 1;
  }
}

}  // namespace

cudaError_t LaunchTokenUpdates(const TokenUpdateDevice* updates, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  TokenUpdatesKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(updates, n);
  return cudaGetLastError();
}

cudaError_t LaunchProcessLogits(const float* logits, int64_t vocab, int64_t stride,
                                const LogitsRowDevice* rows, int64_t num_rows,
                                const LogitsEntryDevice* entries, float* processed,
                                int64_t processed_stride, cudaStream_t stream) {
  if (num_rows <= 0) return cudaSuccess;
  if (vocab <= 0 || vocab > INT32_MAX || stride < vocab || processed_stride < vocab ||
      num_rows > 65535) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>((vocab + kChunk - 1) / kChunk),
                  static_cast<unsigned>(num_rows));
  ProcessLogitsKernel<<<grid, kThreads, 0, stream>>>(logits, static_cast<int>(vocab), stride, rows,
                                                     entries, processed, processed_stride);
  return cudaGetLastError();
}

}  // namespace oasis::kernels
