#include <array>
#include <cstdint>
#include <mutex>

#include "kernels/common.cuh"
#include "kernels/gemv.h"
#include "kernels/rope.cuh"

namespace oasis::kernels {
namespace {

// The weight rows of group g (features past `out` are clamped: computed, never written). With
// kPair the weights are [gate | up] halves and group g holds F/2 gate rows and the F/2 up rows
// with the same indices (the SiLU·mul epilogue combines them).
template <int F, bool kPair = false>
__device__ __forceinline__ void GroupRows(const bf16* w, int64_t in, int64_t out, int64_t g,
                                          const uint4* (&wrow)[F]) {
#pragma unroll
  for (int f = 0; f < F; ++f) {
    int64_t feat;
    if constexpr (kPair) {
      const int64_t half = out / 2;
      int64_t j = g * (F / 2) + f % (F / 2);
      j = j < half ? j : half - 1;
      feat = f < F / 2 ? j : half + j;
    } else {
      feat = g * F + f < out ? g * F + f : out - 1;
    }
    wrow[f] = reinterpret_cast<const uint4*>(w + feat * in);
  }
}

// U K-steps of weight vectors from vector v on.
template <int F, int T, int U>
__device__ __forceinline__ void LoadWeights(const uint4* const (&wrow)[F], int64_t v,
                                            uint4 (&wv)[U][F]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int f = 0; f < F; ++f) wv[u][f] = __ldcs(wrow[f] + v + u * T);
}

// Whether persistent CTAs load the next group's weights before reducing the current one (see
// GemvGroup): on for 2–4 rows (batch 4 × 2K decode 5.79 → 5.52 ms on the H200), off for one row,
// where the extra registers and in-flight loads made the Qwen3-8B step slower.
template <int R>
inline constexpr bool kCrossGroupPrefetch = R > 1;

// What a GEMV writes: the dot products (kPlain), or SiLU(gate)·up of paired gate/up rows
// (kSiluPair: out has half the weight's features), or the dot products followed by the QKV
// heads' norm/RoPE/KV append (kQkvRope into bf16 pools, kQkvRopeFp8 into FP8 pools; see
// QkvHeadEpilogue).
enum Epilogue : int { kPlain = 0, kSiluPair = 1, kQkvRope = 2, kQkvRopeFp8 = 3 };

// One group: the F·R dot products of the weight rows with the R rows of x ([R][vecs] 16-byte
// vectors, in shared memory when kSharedX), reduced over the CTA and written out. `wv`
// already holds the first K-steps when `loaded`. f0 is the group's first output feature
// (g·F, or g·F/2 for kSiluPair); `out` the weight's feature count.
//
// `next`, when `prefetch`: the next group's rows. Their first K-steps are loaded into `wv` (free
// once the group's loop has consumed it) before the reduction and the epilogue, so a persistent
// CTA keeps weight loads in flight across its groups instead of idling through each reduction.
template <int R, int F, int T, int U, bool kSharedX, int kEpi = kPlain>
__device__ __forceinline__ void GemvGroup(const uint4* xv, int64_t vecs,
                                          const uint4* const (&wrow)[F], uint4 (&wv)[U][F],
                                          bool loaded, float (&partial)[T / 32][F * R], int64_t f0,
                                          int64_t out, bf16* out_bf16, float* out_f32,
                                          const uint4* const (&next)[F], bool prefetch) {
  auto x_at = [&](int64_t i) { return kSharedX ? xv[i] : __ldg(xv + i); };
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float acc[F][R];
#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[f][r] = 0.0f;
  int64_t v = threadIdx.x;
  for (; v + (U - 1) * T < vecs; v += U * T) {
    if (!loaded) LoadWeights<F, T, U>(wrow, v, wv);
    loaded = false;
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const uint4 xr = x_at(r * vecs + v + u * T);
#pragma unroll
        for (int f = 0; f < F; ++f) Dot8(wv[u][f], xr, acc[f][r]);
      }
    }
  }
  for (; v < vecs; v += T) {
#pragma unroll
    for (int f = 0; f < F; ++f) {
      const uint4 w1 = __ldcs(wrow[f] + v);
#pragma unroll
      for (int r = 0; r < R; ++r) Dot8(w1, x_at(r * vecs + v), acc[f][r]);
    }
  }
  if (prefetch && threadIdx.x + (U - 1) * T < vecs) LoadWeights<F, T, U>(next, threadIdx.x, wv);
#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float s = WarpSum(acc[f][r]);
      if (lane == 0) partial[warp][f * R + r] = s;
    }
  __syncthreads();
  if constexpr (kEpi == kSiluPair) {
    // Rounds like the GEMV to bf16 followed by SiluMulKernel.
    if (threadIdx.x < F / 2 * R) {
      const int f = threadIdx.x / R, r = threadIdx.x % R;
      const int64_t half = out / 2;
      float sg = 0.0f, su = 0.0f;
#pragma unroll
      for (int wi = 0; wi < T / 32; ++wi) {
        sg += partial[wi][f * R + r];
        su += partial[wi][(f + F / 2) * R + r];
      }
      if (f0 + f < half) {
        const float x = ToFloat(ToBf16(sg));
        const float silu = x / (1.0f + __expf(-x));
        out_bf16[r * half + f0 + f] = ToBf16(ToFloat(ToBf16(silu)) * ToFloat(ToBf16(su)));
      }
    }
  } else if (threadIdx.x < F * R) {
    const int f = threadIdx.x / R, r = threadIdx.x % R;
    float s = 0.0f;
#pragma unroll
    for (int wi = 0; wi < T / 32; ++wi) s += partial[wi][threadIdx.x];
    if (f0 + f < out) {
      if (out_f32) {
        out_f32[r * out + f0 + f] = s;
      } else {
        out_bf16[r * out + f0 + f] = ToBf16(s);
      }
    }
  }
  __syncthreads();  // partial is reused by the next group
}

// A CTA of T threads computes F output features (a "group") for all R rows at a time; its
// threads split the K dimension in 16-byte vectors, U K-steps (U·F weight loads in flight
// per thread) per iteration; partial sums are reduced through shared memory. Persistent
// launches loop over groups with a grid of what fits on the device (no partial last wave);
// otherwise one CTA per group.
//
// PDL: the first weight vectors are loaded before waiting for the kernel that produces x,
// overlapping its tail. Weights are never written by the kernel before, and a PDL launch is
// never overlapped with a preceding copy (tests/kernels/test_pdl.cu), so this is safe.
template <int R, int F, int T, int U>
__global__ void __launch_bounds__(T)
    GemvKernel(const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* out_bf16,
               float* out_f32, int64_t in, int64_t out, int64_t groups) {
  const int64_t vecs = in / 8;
  __shared__ float partial[T / 32][F * R];
  const bool fits = threadIdx.x + (U - 1) * T < vecs;  // the first U K-steps exist for this thread
  if constexpr (!kCrossGroupPrefetch<R>) {
    // One row (one CTA per group by default): no prefetch across groups. On the H200 it cost
    // registers and decode time there (4.35 vs 4.21 ms per Qwen3-8B step), and helps 2–4 rows.
    bool waited = false;
    for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
      const uint4* wrow[F];
      GroupRows<F>(w, in, out, g, wrow);
      uint4 wv[U][F];
      if (fits) LoadWeights<F, T, U>(wrow, threadIdx.x, wv);
      if (!waited) {
        GridDependencyWait();
        AllowDependentLaunch();
        waited = true;
      }
      GemvGroup<R, F, T, U, false>(reinterpret_cast<const uint4*>(x), vecs, wrow, wv, fits, partial,
                                   g * F, out, out_bf16, out_f32, wrow, false);
    }
    if (!waited) {
      GridDependencyWait();
      AllowDependentLaunch();
    }
    return;
  }
  int64_t g = blockIdx.x;
  const uint4* wrow[F];
  uint4 wv[U][F];
  GroupRows<F>(w, in, out, g, wrow);
  bool loaded = g < groups && fits;
  if (loaded) LoadWeights<F, T, U>(wrow, threadIdx.x, wv);
  GridDependencyWait();
  AllowDependentLaunch();
  for (; g < groups; g += gridDim.x) {
    const int64_t gn = g + gridDim.x;
    const uint4* next[F];
    GroupRows<F>(w, in, out, gn < groups ? gn : g, next);
    GemvGroup<R, F, T, U, false>(reinterpret_cast<const uint4*>(x), vecs, wrow, wv, loaded, partial,
                                 g * F, out, out_bf16, out_f32, next, gn < groups);
    loaded = gn < groups && fits;
#pragma unroll
    for (int f = 0; f < F; ++f) wrow[f] = next[f];
  }
}

template <int R, int F, int T, int U>
cudaError_t LaunchConfig(const bf16* x, const bf16* w, bf16* ob, float* of, int64_t in, int64_t out,
                         bool persistent, cudaStream_t stream) {
  const int64_t groups = (out + F - 1) / F;
  int64_t grid = groups;
  if (persistent) {
    static int resident = 0;  // CTAs the device holds at once, per configuration
    static std::once_flag once;
    std::call_once(once, [] {
      int dev = 0, sms = 0, per_sm = 0;
      cudaGetDevice(&dev);
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, GemvKernel<R, F, T, U>, T, 0);
      resident = sms * (per_sm > 0 ? per_sm : 1);
    });
    grid = groups < resident ? groups : resident;
  }
  return LaunchPdl(GemvKernel<R, F, T, U>, dim3(static_cast<unsigned>(grid)), dim3(T), 0, stream, x,
                   w, ob, of, in, out, groups);
}

// The two configurations LaunchGemv picks between (bench_gemv on the H200, 2026-11-29, Qwen3-8B
// shapes; the six others it measured are in docs/benchmarks.md): one row streams at 0.98 of the
// read ceiling with 4 features × 256 threads per CTA, one CTA per group; 2–4 rows need more
// features per CTA (x is reused across them) and a persistent grid: 8 × 128 reaches 0.80 where
// the one-row shape reaches 0.44.
template <int R>
cudaError_t LaunchGemvConfig(GemvConfig config, const bf16* x, const bf16* w, bf16* ob, float* of,
                             int64_t in, int64_t out, cudaStream_t stream) {
  switch (config) {
    case GemvConfig::kPerGroup:
      return LaunchConfig<R, 4, 256, 2>(x, w, ob, of, in, out, false, stream);
    case GemvConfig::kPersistent:
      return LaunchConfig<R, 8, 128, 2>(x, w, ob, of, in, out, true, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// CTAs per SM of the persistent norm-fused GEMVs: what fits, or fewer (OASIS_GEMV_NORM_CTAS_PER_SM,
// for tuning runs) so the next kernel's CTAs can become resident early under PDL.
// One row over fewer input features than OASIS_GEMV_NARROW_K (4,096): 4 features × 256
// threads stream at 0.98 of the read ceiling from 4,096 up, but below that each thread holds a
// single 16-byte vector per feature and no K-step is in flight (Qwen3-30B-A3B's hidden 2,048:
// the QKV projection, the router and the lm_head); 8 features × 128 threads keep two K-steps
// of 8 rows in flight there. Plain and norm-fused GEMVs alike.
bool NarrowRow(int64_t in) { return in < GetTuning().gemv_narrow_below; }

int NormCtasPerSm(int fits) {
  const int cap = GetTuning().gemv_norm_ctas_per_sm;
  return cap > 0 && cap < fits ? cap : fits;
}

// kQkvRope: after a CTA has written its group of the QKV projection (bf16, into `qkv`), the
// last CTA to finish a head (a per-head arrival counter, reset by that CTA) applies what
// QkvRopeAppendKernel does to that head for every row: q heads normed + roped into rope.q,
// k heads into the K pool, v heads copied into the V pool. Groups never straddle heads
// (F divides head_dim). The arrival is published by a fence, the last CTA fences before
// reading the other CTAs' values (through L2: __ldcg).
inline constexpr int kQkvEpilogueMaxHeadDim = 256;
struct GemvQkvEpilogue {
  QkvRopeAppendParams rope;  // rope.qkv is the GEMV's bf16 output
  int* counters;             // [num_q_heads + 2 * num_kv_heads] zero between launches
};

template <int R, int F, int T, bool kFp8>
__device__ __forceinline__ void QkvHeadEpilogue(const GemvQkvEpilogue& ep, int64_t f0, int64_t out,
                                                bf16 (&stage)[R][kQkvEpilogueMaxHeadDim],
                                                int& s_last) {
  const QkvRopeAppendParams& p = ep.rope;
  const int d = p.head_dim;
  const int head = static_cast<int>(f0 / d);
  // The group's outputs were written before the __syncthreads that ends GemvGroup; thread
  // 0's fence (cumulative) publishes them before its arrival, so one fence per group suffices.
  if (threadIdx.x == 0) {
    __threadfence();
    const int prev = atomicAdd(ep.counters + head, 1);
    s_last = prev == d / F - 1;
    if (s_last) ep.counters[head] = 0;  // every other CTA of this head has arrived
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = warp; r < R; r += T / 32) {
    const bf16* src = p.qkv + r * out + static_cast<int64_t>(head) * d;
    for (int i = lane; i < d; i += 32) stage[r][i] = __ldcg(src + i);
    __syncwarp();
    if (head >= p.num_q_heads + p.num_kv_heads) {  // v
      const int kv = head - p.num_q_heads - p.num_kv_heads;
      const int64_t dst = p.slot_mapping[r * p.num_kv_heads + kv];
      if (dst >= 0) {
        if constexpr (kFp8)
          StoreHeadFp8(stage[r], p.v_pool_fp8 + dst * d, d, lane, p.v_scale[kv], p.v_amax + kv);
        else
          for (int i = lane; i < d; i += 32) p.v_pool[dst * d + i] = stage[r][i];
      }
      continue;
    }
    const bool is_q = head < p.num_q_heads;
    bf16* dst;
    if (is_q) {
      dst = p.q + (static_cast<int64_t>(r) * p.num_q_heads + head) * d;
    } else {
      const int kv = head - p.num_q_heads;
      const int64_t slot = p.slot_mapping[r * p.num_kv_heads + kv];
      if (slot < 0) continue;
      if constexpr (kFp8) {
        NormRopeHeadFp8(stage[r], p.k_pool_fp8 + slot * d, p.k_norm,
                        static_cast<float>(p.positions[r]), p.inv_freq, p.attention_scaling, p.eps,
                        d, lane, p.k_scale[kv], p.k_amax + kv);
        continue;
      }
      dst = p.k_pool + slot * d;
    }
    NormRopeHead(stage[r], dst, is_q ? p.q_norm : p.k_norm, static_cast<float>(p.positions[r]),
                 p.inv_freq, p.attention_scaling, p.eps, d, lane);
  }
}

// RMSNorm (+ residual add) fused into the GEMV that consumes it: every CTA first builds the
// normalised rows in shared memory — v = bf16(residual + x) (or the residual alone), written to
// residual_out by CTA 0; n = bf16(norm_w · bf16(v · rsqrt(mean(v²) + eps))), rounded like
// RmsNormKernel — then streams its weight groups against them. A persistent grid keeps the
// per-CTA prologue (2 × in × 2 bytes per row from L2) to one per resident CTA.
template <int R, int F, int T, int U, int kEpi>
__global__ void __launch_bounds__(T)
    GemvNormKernel(const bf16* __restrict__ x, const bf16* __restrict__ residual,
                   bf16* residual_out, const bf16* __restrict__ norm_w, float eps,
                   const bf16* __restrict__ w, bf16* out_bf16, float* out_f32, int64_t in,
                   int64_t out, int64_t groups, GemvQkvEpilogue ep, bf16* normed_out) {
  extern __shared__ uint4 xs_raw[];  // [R][in] bf16
  bf16* xs = reinterpret_cast<bf16*>(xs_raw);
  __shared__ float partial[T / 32][F * R];
  __shared__ float red[T / 32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t vecs = in / 8;
  // Constant data first (PDL): the first weight vectors of the first group.
  uint4 wv[U][F];
  const int64_t g0 = blockIdx.x;
  const uint4* wrow[F];
  GroupRows<F, kEpi == kSiluPair>(w, in, out, g0, wrow);
  bool loaded = g0 < groups && threadIdx.x + (U - 1) * T < vecs;
  if (loaded) LoadWeights<F, T, U>(wrow, threadIdx.x, wv);
  GridDependencyWait();
  AllowDependentLaunch();
  for (int r = 0; r < R; ++r) {
    const uint4* res = reinterpret_cast<const uint4*>(residual + r * in);
    const uint4* xr = x ? reinterpret_cast<const uint4*>(x + r * in) : nullptr;
    uint4* xsr = reinterpret_cast<uint4*>(xs + r * in);
    float ss = 0.0f;
    for (int64_t v = threadIdx.x; v < vecs; v += T) {
      uint4 a = res[v];
      if (xr) {
        const uint4 b = xr[v];
        __nv_bfloat162* a2 = reinterpret_cast<__nv_bfloat162*>(&a);
        const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 fa = __bfloat1622float2(a2[i]), fb = __bfloat1622float2(b2[i]);
          a2[i] = __floats2bfloat162_rn(fa.x + fb.x, fa.y + fb.y);
        }
        if (residual_out != nullptr && blockIdx.x == 0)
          reinterpret_cast<uint4*>(residual_out + r * in)[v] = a;
      }
      const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(a2[i]);
        ss = fmaf(f.x, f.x, fmaf(f.y, f.y, ss));
      }
      xsr[v] = a;
    }
    ss = WarpSum(ss);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < T / 32; ++i) total += red[i];
    const float inv = rsqrtf(total / static_cast<float>(in) + eps);
    const uint4* nw = reinterpret_cast<const uint4*>(norm_w);
    for (int64_t v = threadIdx.x; v < vecs; v += T) {
      uint4 a = xsr[v];
      const uint4 g = nw[v];
      __nv_bfloat162* a2 = reinterpret_cast<__nv_bfloat162*>(&a);
      const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&g);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 fa = __bfloat1622float2(a2[i]), fg = __bfloat1622float2(g2[i]);
        const float n0 = ToFloat(ToBf16(fa.x * inv)), n1 = ToFloat(ToBf16(fa.y * inv));
        a2[i] = __floats2bfloat162_rn(fg.x * n0, fg.y * n1);
      }
      xsr[v] = a;
      if (normed_out != nullptr && blockIdx.x == 0)
        reinterpret_cast<uint4*>(normed_out + r * in)[v] = a;
    }
    __syncthreads();  // red is reused by the next row; xs complete
  }
  constexpr bool kQkv = kEpi == kQkvRope || kEpi == kQkvRopeFp8;
  constexpr int kStageRows = kQkv ? R : 1;
  __shared__ bf16 stage[kStageRows][kQkvEpilogueMaxHeadDim];
  __shared__ int s_last;
  for (int64_t g = g0; g < groups; g += gridDim.x) {
    const int64_t gn = g + gridDim.x;
    const uint4* next[F];
    GroupRows<F, kEpi == kSiluPair>(w, in, out, gn < groups ? gn : g, next);
    const int64_t f0 = kEpi == kSiluPair ? g * (F / 2) : g * F;
    constexpr bool kPrefetch = kCrossGroupPrefetch<R>;
    GemvGroup<R, F, T, U, true, kEpi>(xs_raw, vecs, wrow, wv, loaded, partial, f0, out, out_bf16,
                                      out_f32, next, kPrefetch && gn < groups);
    if constexpr (kQkv) QkvHeadEpilogue<R, F, T, kEpi == kQkvRopeFp8>(ep, f0, out, stage, s_last);
    loaded = kPrefetch && gn < groups && threadIdx.x + (U - 1) * T < vecs;
#pragma unroll
    for (int f = 0; f < F; ++f) wrow[f] = next[f];
  }
  (void)stage;
  (void)s_last;
}

template <int R, int F, int T, int U, int kEpi>
cudaError_t LaunchNormConfig(const bf16* x, const bf16* residual, bf16* residual_out,
                             const bf16* norm_w, float eps, const bf16* w, bf16* ob, float* of,
                             int64_t in, int64_t out, const GemvQkvEpilogue& ep, bf16* normed_out,
                             cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(R) * in * 2;
  // The dynamic shared-memory limit is a per-device attribute (tensor parallelism launches
  // on several GPUs from one process), so it and the occupancy are cached per device.
  constexpr int kMaxDevices = 64;
  struct PerDevice {
    int sms = 0, per_sm = -1;
    size_t smem = 0;
  };
  static std::array<PerDevice, kMaxDevices> state;
  static std::mutex mu;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices)
    return cudaErrorInvalidDevice;
  int per_sm, sms;
  {
    std::lock_guard<std::mutex> lock(mu);
    PerDevice& d = state[static_cast<size_t>(dev)];
    if (d.sms == 0) {
      cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
      cudaFuncSetAttribute(GemvNormKernel<R, F, T, U, kEpi>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, kGemvNormMaxSmem);
    }
    if (d.per_sm < 0 || smem != d.smem) {
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&d.per_sm, GemvNormKernel<R, F, T, U, kEpi>, T,
                                                    smem);
      d.smem = smem;
    }
    per_sm = d.per_sm;
    sms = d.sms;
  }
  const int64_t groups = kEpi == kSiluPair ? (out / 2 + F / 2 - 1) / (F / 2) : (out + F - 1) / F;
  const int64_t resident = static_cast<int64_t>(sms) * NormCtasPerSm(per_sm > 0 ? per_sm : 1);
  const int64_t grid = groups < resident ? groups : resident;
  return LaunchPdl(GemvNormKernel<R, F, T, U, kEpi>, dim3(static_cast<unsigned>(grid)), dim3(T),
                   smem, stream, x, residual, residual_out, norm_w, eps, w, ob, of, in, out, groups,
                   ep, normed_out);
}

// The norm-fused configurations by row count (H200: 4 × 256 streams one row best; 2–4 rows
// reuse x across 8 features × 128 threads).
template <int kEpi>
cudaError_t LaunchNormRows(const bf16* x, const bf16* residual, bf16* residual_out,
                           const bf16* norm_w, float eps, const bf16* w, bf16* ob, float* of,
                           int64_t rows, int64_t in, int64_t out, const GemvQkvEpilogue& ep,
                           cudaStream_t stream, bf16* normed_out = nullptr) {
  switch (rows) {
    case 1:
      // OASIS_GEMV_NARROW_NORM: 4 × 256 with one K-step (the whole row of 2,048 features loaded
      // before the PDL wait, twice the CTAs); its sums are the plain kPerGroup GEMV's
      // (GemvConfigMatchingNorm).
      if (NarrowRow(in) && GetTuning().gemv_narrow_norm)
        return LaunchNormConfig<1, 4, 256, 1, kEpi>(x, residual, residual_out, norm_w, eps, w, ob,
                                                    of, in, out, ep, normed_out, stream);
      if (NarrowRow(in))
        return LaunchNormConfig<1, 8, 128, 2, kEpi>(x, residual, residual_out, norm_w, eps, w, ob,
                                                    of, in, out, ep, normed_out, stream);
      return LaunchNormConfig<1, 4, 256, 2, kEpi>(x, residual, residual_out, norm_w, eps, w, ob, of,
                                                  in, out, ep, normed_out, stream);
    case 2:
      return LaunchNormConfig<2, 8, 128, 2, kEpi>(x, residual, residual_out, norm_w, eps, w, ob, of,
                                                  in, out, ep, normed_out, stream);
    case 3:
      return LaunchNormConfig<3, 8, 128, 2, kEpi>(x, residual, residual_out, norm_w, eps, w, ob, of,
                                                  in, out, ep, normed_out, stream);
    default:
      return LaunchNormConfig<4, 8, 128, 2, kEpi>(x, residual, residual_out, norm_w, eps, w, ob, of,
                                                  in, out, ep, normed_out, stream);
  }
}

bool NormArgsValid(const bf16* x, const bf16* residual, const bf16* residual_out,
                   const bf16* norm_w, const bf16* w, int64_t rows, int64_t in) {
  const auto misaligned = [](const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 != 0;
  };
  return GemvNormSupported(rows, in, residual, w) && (x == nullptr || !misaligned(x)) &&
         (residual_out == nullptr || !misaligned(residual_out)) && !misaligned(norm_w) &&
         !(x == nullptr && residual_out != nullptr);
}

}  // namespace

bool GemvSupported(int64_t rows, int64_t in, const void* x, const void* w) {
  return rows >= 1 && rows <= kGemvMaxRows && in % 8 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

cudaError_t LaunchGemvWith(GemvConfig config, const bf16* x, const bf16* w, bf16* ob, float* of,
                           int64_t rows, int64_t in, int64_t out, cudaStream_t stream) {
  if (!GemvSupported(rows, in, x, w) || (ob == nullptr) == (of == nullptr))
    return cudaErrorInvalidValue;
  if (config == GemvConfig::kAuto)
    config = rows == 1 && !NarrowRow(in) ? GemvConfig::kPerGroup : GemvConfig::kPersistent;
  switch (rows) {
    case 1:
      return LaunchGemvConfig<1>(config, x, w, ob, of, in, out, stream);
    case 2:
      return LaunchGemvConfig<2>(config, x, w, ob, of, in, out, stream);
    case 3:
      return LaunchGemvConfig<3>(config, x, w, ob, of, in, out, stream);
    default:
      return LaunchGemvConfig<4>(config, x, w, ob, of, in, out, stream);
  }
}

GemvConfig GemvConfigMatchingNorm(int64_t rows, int64_t in) {
  // (U, the K-steps in flight, does not change a thread's order of vectors: 4 × 256 × 1 sums as
  // 4 × 256 × 2 does.)
  return rows == 1 && NarrowRow(in) && GetTuning().gemv_narrow_norm ? GemvConfig::kPerGroup
                                                                    : GemvConfig::kAuto;
}

bool GemvNormSupported(int64_t rows, int64_t in, const void* residual, const void* w) {
  return GemvSupported(rows, in, residual, w) &&
         static_cast<size_t>(rows) * in * 2 <= kGemvNormMaxSmem;
}

cudaError_t LaunchGemvRmsNorm(const bf16* x, const bf16* residual, bf16* residual_out,
                              const bf16* norm_w, float eps, const bf16* w, bf16* ob, float* of,
                              int64_t rows, int64_t in, int64_t out, cudaStream_t stream,
                              bf16* normed_out) {
  if (!NormArgsValid(x, residual, residual_out, norm_w, w, rows, in) ||
      (ob == nullptr) == (of == nullptr) ||
      (normed_out != nullptr && reinterpret_cast<uintptr_t>(normed_out) % 16 != 0)) {
    return cudaErrorInvalidValue;
  }
  return LaunchNormRows<kPlain>(x, residual, residual_out, norm_w, eps, w, ob, of, rows, in, out,
                                GemvQkvEpilogue{}, stream, normed_out);
}

cudaError_t LaunchGemvRmsNormSiluMul(const bf16* x, const bf16* residual, bf16* residual_out,
                                     const bf16* norm_w, float eps, const bf16* w, bf16* out,
                                     int64_t rows, int64_t in, int64_t inter, cudaStream_t stream) {
  if (!NormArgsValid(x, residual, residual_out, norm_w, w, rows, in) || out == nullptr ||
      inter < 1) {
    return cudaErrorInvalidValue;
  }
  return LaunchNormRows<kSiluPair>(x, residual, residual_out, norm_w, eps, w, out, nullptr, rows,
                                   in, 2 * inter, GemvQkvEpilogue{}, stream);
}

bool GemvQkvRopeSupported(int64_t rows, int64_t in, int num_heads, int head_dim,
                          const void* residual, const void* w) {
  return GemvNormSupported(rows, in, residual, w) && head_dim % 8 == 0 && head_dim >= 8 &&
         head_dim <= kQkvEpilogueMaxHeadDim && num_heads >= 1 && num_heads <= kGemvQkvMaxHeads;
}

cudaError_t LaunchGemvRmsNormQkvRope(const bf16* x, const bf16* residual, bf16* residual_out,
                                     const bf16* norm_w, float eps, const bf16* w, int64_t in,
                                     const QkvRopeAppendParams& rope, int* counters,
                                     cudaStream_t stream) {
  const int heads = rope.num_q_heads + 2 * rope.num_kv_heads;
  if (!NormArgsValid(x, residual, residual_out, norm_w, w, rope.tokens, in) ||
      !GemvQkvRopeSupported(rope.tokens, in, heads, rope.head_dim, residual, w) ||
      counters == nullptr || rope.qkv == nullptr || !QkvRopeAppendFp8Ready(rope)) {
    return cudaErrorInvalidValue;
  }
  GemvQkvEpilogue ep{rope, counters};
  if (rope.kv_dtype == KvDtype::kFp8E4M3)
    return LaunchNormRows<kQkvRopeFp8>(x, residual, residual_out, norm_w, eps, w,
                                       const_cast<bf16*>(rope.qkv), nullptr, rope.tokens, in,
                                       int64_t{heads} * rope.head_dim, ep, stream);
  return LaunchNormRows<kQkvRope>(x, residual, residual_out, norm_w, eps, w,
                                  const_cast<bf16*>(rope.qkv), nullptr, rope.tokens, in,
                                  int64_t{heads} * rope.head_dim, ep, stream);
}

cudaError_t LaunchGemv(const bf16* x, const bf16* w, bf16* ob, float* of, int64_t rows, int64_t in,
                       int64_t out, cudaStream_t stream) {
  return LaunchGemvWith(GemvConfig::kAuto, x, w, ob, of, rows, in, out, stream);
}

}  // namespace oasis::kernels
