// Token sampling, one CTA of 512 threads per logits row. The candidate set of the CPU
// sampler — a prefix of the vocabulary in (logit desc, id asc) order — is found without
// sorting: radix selection over order-preserving 32-bit keys of the logits finds the top-k
// and top-p boundaries (counts and probability masses per 8-bit digit, four passes each),
// and a second selection over ids resolves exact ties at a boundary. The token is then the
// Gumbel-max over the candidates with the counter-based noise the CPU sampler uses.
#include <cfloat>
#include <climits>
#include <cstdint>

#include "include/oasis/sampling_noise.h"
#include "kernels/common.cuh"
#include "kernels/sampling.h"

namespace oasis::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kProbes = 15;  // thresholds per pass of SelectKey: 4 bits of the key

// Larger float -> larger key (total order on non-NaN floats).
__device__ __forceinline__ uint32_t OrderKey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float FromKey(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct Shared {
  float rf[kWarps];
  double rd[kWarps];
  int ri[kWarps];
  float sums[kWarps][kProbes + 1];
  float totals[kProbes + 1];
  int top_n;
  int top_ids[kSampleMaxTop];
  float top_vals[kSampleMaxTop];
};

template <typename T>
__device__ __forceinline__ void ArgMaxStep(T& v, int& i, T ov, int oi) {
  if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
}

// Block-wide argmax, larger value first, then lower index. Every thread gets the result.
__device__ void BlockArgMax(float& v, int& i, Shared& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ArgMaxStep(v, i, __shfl_xor_sync(~0u, v, o), __shfl_xor_sync(~0u, i, o));
  __syncthreads();
  if (lane == 0) s.rf[warp] = v, s.ri[warp] = i;
  __syncthreads();
  v = lane < kWarps ? s.rf[lane] : -FLT_MAX, i = lane < kWarps ? s.ri[lane] : INT_MAX;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ArgMaxStep(v, i, __shfl_xor_sync(~0u, v, o), __shfl_xor_sync(~0u, i, o));
}

__device__ void BlockArgMax(double& v, int& i, Shared& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ArgMaxStep(v, i, __shfl_xor_sync(~0u, v, o), __shfl_xor_sync(~0u, i, o));
  __syncthreads();
  if (lane == 0) s.rd[warp] = v, s.ri[warp] = i;
  __syncthreads();
  v = lane < kWarps ? s.rd[lane] : -DBL_MAX, i = lane < kWarps ? s.ri[lane] : INT_MAX;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ArgMaxStep(v, i, __shfl_xor_sync(~0u, v, o), __shfl_xor_sync(~0u, i, o));
}

__device__ float BlockSumF(float v, Shared& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) s.rf[warp] = v;
  __syncthreads();
  return WarpSum(lane < kWarps ? s.rf[lane] : 0.0f);
}

// Sums each of kProbes values over the block; every thread gets the totals.
__device__ void BlockSums(float (&v)[kProbes], Shared& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < kProbes; ++j) v[j] = WarpSum(v[j]);
  __syncthreads();
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < kProbes; ++j) s.sums[warp][j] = v[j];
  }
  __syncthreads();
  if (threadIdx.x < kProbes) {
    float t = 0.0f;
    for (int w = 0; w < kWarps; ++w) t += s.sums[w][threadIdx.x];
    s.totals[threadIdx.x] = t;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kProbes; ++j) v[j] = s.totals[j];
}

// Among the elements i in [0, n) with pred(i), each of weight w(i) > 0, finds the largest
// key K with W(key >= K) >= target (the key where the cumulative weight in descending key
// order first reaches `target`), and W(key > K) and W(key >= K). A 16-ary search over the
// 32-bit key space: each pass over the row sums the weight above 15 probes in registers and
// reduces them over the block — 8 passes, no atomics, and the same floating-point sums on
// every run. Requires 0 < target <= W(all); callers clamp.
template <typename Key, typename Pred, typename Weight>
__device__ uint32_t SelectKey(int n, float target, Key key, Pred pred, Weight weight, Shared& s, float& w_above,
                              float& w_at_or_above) {
  uint64_t lo = 0, hi = uint64_t{1} << 32;
  float w_lo = -1.0f, w_hi = 0.0f;  // W(key >= lo) (unknown until a probe lands on it), W(key >= hi)
  while (hi - lo > 1) {
    const uint64_t step = (hi - lo + kProbes) / (kProbes + 1);
    uint32_t probe[kProbes];
    float sums[kProbes];
#pragma unroll
    for (int j = 0; j < kProbes; ++j) {
      const uint64_t pj = lo + (j + 1) * step;
      probe[j] = static_cast<uint32_t>(pj < hi ? pj : hi - 1);
      sums[j] = 0.0f;
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      if (!pred(i)) continue;
      const uint32_t k = key(i);
      const float w = weight(i);
#pragma unroll
      for (int j = 0; j < kProbes; ++j) sums[j] += k >= probe[j] ? w : 0.0f;
    }
    BlockSums(sums, s);
    uint64_t new_lo = lo, new_hi = hi;
    float new_w_lo = w_lo, new_w_hi = w_hi;
    for (int j = 0; j < kProbes; ++j) {
      const uint64_t pj = lo + (j + 1) * step;
      if (pj >= hi) break;
      if (sums[j] >= target) {
        new_lo = pj, new_w_lo = sums[j];
      } else {
        new_hi = pj, new_w_hi = sums[j];
        break;
      }
    }
    lo = new_lo, hi = new_hi, w_lo = new_w_lo, w_hi = new_w_hi;
  }
  if (w_lo < 0.0f) {  // lo stayed 0: W(key >= 0) is the total
    float t = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) t += pred(i) ? weight(i) : 0.0f;
    w_lo = BlockSumF(t, s);
  }
  w_above = w_hi;
  w_at_or_above = w_lo;
  return static_cast<uint32_t>(lo);
}

// SelectKey by count: the key of the r-th element (1-based, r <= their number) in
// descending key order; `above` and `at` count the elements with a greater / equal key.
template <typename Key, typename Pred>
__device__ uint32_t SelectByCount(int n, int r, Key key, Pred pred, Shared& s, int& above, int& at) {
  float a, ge;
  const uint32_t k = SelectKey(n, static_cast<float>(r), key, pred, [](int) { return 1.0f; }, s, a, ge);
  above = static_cast<int>(a);
  at = static_cast<int>(ge) - above;
  return k;
}

// The `needed`-th smallest id among the elements with key == k (and pred): ties at a
// boundary are admitted lowest id first. INT_MAX when all of them are admitted.
template <typename Key, typename Pred>
__device__ int TieIdCut(int n, uint32_t k, int needed, int at, Key key, Pred pred, Shared& s) {
  if (needed >= at) return INT_MAX;
  int above, same;
  const uint32_t inv = SelectByCount(
      n, needed, [](int i) { return ~static_cast<uint32_t>(i); }, [&](int i) { return pred(i) && key(i) == k; }, s,
      above, same);
  return static_cast<int>(~inv);
}

__global__ void __launch_bounds__(kThreads) SampleKernel(const float* __restrict__ logits, int vocab, int64_t stride,
                                                        const SampleParamsDevice* __restrict__ params,
                                                        SampleOutputDevice* __restrict__ out) {
  __shared__ Shared s;
  const SampleParamsDevice p = params[blockIdx.x];
  if (!p.needed) return;
  const float* row = logits + blockIdx.x * stride;
  auto logit = [&](int i) { return __ldg(row + i); };
  auto key = [&](int i) { return OrderKey(__ldg(row + i)); };
  auto all = [](int) { return true; };

  // Max / first argmax, then the log-partition function of the raw logits.
  float mx = -FLT_MAX;
  int arg = INT_MAX;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) ArgMaxStep(mx, arg, logit(i), i);
  BlockArgMax(mx, arg, s);
  if (arg == INT_MAX) arg = 0;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) sum += __expf(logit(i) - mx);
  const float log_z = mx + logf(BlockSumF(sum, s));

  int token = arg;
  const bool greedy = p.temperature == 0.0f || p.top_k == 1;
  if (!greedy) {
    const double inv_t = 1.0 / static_cast<double>(p.temperature);
    const float inv_tf = static_cast<float>(inv_t);
    // top-k boundary.
    uint32_t k_key = 0;
    int k_cut = INT_MAX;
    const bool use_k = p.top_k > 0 && p.top_k < vocab;
    if (use_k) {
      int above, at;
      k_key = SelectByCount(vocab, p.top_k, key, all, s, above, at);
      k_cut = TieIdCut(vocab, k_key, p.top_k - above, at, key, all, s);
    }
    auto in_k = [&](int i) {
      if (!use_k) return true;
      const uint32_t k = key(i);
      return k > k_key || (k == k_key && i <= k_cut);
    };
    auto q_of = [&](int i) { return __expf((logit(i) - mx) * inv_tf); };
    // top-p boundary over the top-k set.
    uint32_t p_key = 0;
    int p_cut = INT_MAX;
    const bool use_p = p.top_p < 1.0f;
    if (use_p) {
      float z = 0.0f;
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        if (in_k(i)) z += q_of(i);
      }
      z = BlockSumF(z, s);
      const float target = fminf(p.top_p * z, z);
      float mass_above, mass_ge;
      p_key = SelectKey(vocab, target, key, in_k, q_of, s, mass_above, mass_ge);
      int at = 0;
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) at += (in_k(i) && key(i) == p_key) ? 1 : 0;
      at = static_cast<int>(BlockSumF(static_cast<float>(at), s));
      // Ties at the boundary share one probability: admit as many as the mass needs.
      const float q_tie = __expf((FromKey(p_key) - mx) * inv_tf);
      int needed = at;
      if (q_tie > 0.0f) {
        needed = static_cast<int>(ceilf((target - mass_above) / q_tie));
        needed = max(1, min(needed, at));
      }
      p_cut = TieIdCut(vocab, p_key, needed, at, key, in_k, s);
    }
    auto in_set = [&](int i) {
      if (!in_k(i)) return false;
      if (use_p) {
        const uint32_t k = key(i);
        if (!(k > p_key || (k == p_key && i <= p_cut))) return false;
      }
      if (p.min_p > 0.0f && exp(static_cast<double>(logit(i) - mx) * inv_t) < static_cast<double>(p.min_p)) {
        return i == arg;  // the top token always stays
      }
      return true;
    };
    const uint64_t nkey = NoiseKey(p.seed, p.counter);
    double best = -DBL_MAX;
    int best_i = INT_MAX;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      if (!in_set(i)) continue;
      const double g = -log(-log(NoiseUniform(nkey, i)));
      ArgMaxStep(best, best_i, static_cast<double>(logit(i) - mx) * inv_t + g, i);
    }
    BlockArgMax(best, best_i, s);
    token = best_i == INT_MAX ? arg : best_i;
  }

  // Top log-probabilities: the num_top best (logit desc, id asc), sorted.
  const int num_top = min(p.num_top, min(kSampleMaxTop, vocab));
  if (num_top > 0) {
    int above, at;
    const uint32_t t_key = SelectByCount(vocab, num_top, key, all, s, above, at);
    const int t_cut = TieIdCut(vocab, t_key, num_top - above, at, key, all, s);
    if (threadIdx.x == 0) s.top_n = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      const uint32_t k = key(i);
      if (k > t_key || (k == t_key && i <= t_cut)) {
        const int slot = atomicAdd(&s.top_n, 1);
        if (slot < kSampleMaxTop) s.top_ids[slot] = i, s.top_vals[slot] = logit(i);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int n = min(s.top_n, kSampleMaxTop);
      for (int a = 1; a < n; ++a) {  // insertion sort, (logit desc, id asc)
        const int id = s.top_ids[a];
        const float v = s.top_vals[a];
        int b = a - 1;
        while (b >= 0 && (s.top_vals[b] < v || (s.top_vals[b] == v && s.top_ids[b] > id))) {
          s.top_ids[b + 1] = s.top_ids[b], s.top_vals[b + 1] = s.top_vals[b];
          --b;
        }
        s.top_ids[b + 1] = id, s.top_vals[b + 1] = v;
      }
      for (int a = 0; a < n; ++a) {
        out[blockIdx.x].top_tokens[a] = s.top_ids[a];
        out[blockIdx.x].top_logprobs[a] = s.top_vals[a] - log_z;
      }
    }
  }
  if (threadIdx.x == 0) {
    out[blockIdx.x].token = token;
    out[blockIdx.x].logprob = logit(token) - log_z;
  }
}

}  // namespace

cudaError_t LaunchSample(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                         const SampleParamsDevice* params, SampleOutputDevice* out, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || vocab > INT_MAX || stride < vocab) return cudaErrorInvalidValue;
  SampleKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, static_cast<int>(vocab), stride, params,
                                                                      out);
  return cudaGetLastError();
}

}  // namespace oasis::kernels
