// Benchmark: split-K decode attention (kernels/attention_decode.h) over head-level block tables
// at Qwen3-8B attention shapes (GQA 32/8, head_dim 128, bf16). The tables are the ones the engine
// builds (BlockAllocator + HeadBlockTable, one reservation per sequence); the main shape also
// runs over random slots from the whole pool (a fragmented pool), and the RESULT line has both.
//
// Each case: warm-up, then >= 30 timed launches (split + merge kernels), each after an L2 flush,
// timed with CUDA events; the median is reported as GB/s over the K+V bytes the step must read
// (sum over sequences and KV heads of kv_len × head_dim × 2 bytes × 2), next to the read-only
// streaming ceiling (4.56 TB/s, DESIGN.md §5) and, with --torch-gbs, the ratio to PyTorch SDPA's
// GB/s for the same case measured in the same call (tools/bench/bench_decode_attention_torch.py
// prints the list as its PEER_GBS line; tools/gpu_suite.sh runs it first and passes it on).
// Without it no ratio is printed ("no peer measured"). The "graph bound" case has short contexts
// but a table as wide as, and a max_kv_len hint of, 16K tokens, as CUDA graphs capture it.
// The last line starts with RESULT (collected by tools/gpu_suite.sh).
//
// --kv-dtype fp8: the pools hold e4m3 bytes (random numbers, per-head scales) and every kernel
// runs its FP8 variant; GB/s are over the bytes actually read (head_dim × 1 byte × 2 per token),
// half of bf16's, against the same ceiling. The PyTorch peer still reads bf16: "vs torch" is the
// ratio of step times (PyTorch's bf16 time / ours), which for bf16 equals the GB/s ratio.
//
//   bench_decode_attention [--runs N] [--sweep] [--torch-gbs G1,G2,...] [--kv-dtype bf16|fp8]
//     --sweep: also every forced split count; --torch-gbs: PyTorch's GB/s per case of
//     bench_decode_attention_torch.py, in its order (its PEER_GBS line)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_decode.h"
#include "kernels/attention_prefill.h"
#include "kvcache/block_allocator.h"
#include "kvcache/head_block_table.h"

namespace {

using bf16 = __nv_bfloat16;
constexpr double kCeilingGBs = 4560.0;  // read-only streaming, H200 (DESIGN.md §5)
constexpr int kHq = 32, kHkv = 8, kHeadDim = 128, kPage = 16;

#define BENCH_CHECK(expr)                                                  \
  do {                                                                     \
    cudaError_t err_ = (expr);                                             \
    if (err_ != cudaSuccess) {                                             \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(err_));                              \
      std::exit(1);                                                        \
    }                                                                      \
  } while (0)

__global__ void FillRandomBf16(bf16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15, x *= 2246822519u, x ^= x >> 13, x *= 3266489917u, x ^= x >> 16;
    p[i] = __float2bfloat16(static_cast<float>(x & 0xffff) / 32768.0f - 1.0f);
  }
}

// Random e4m3 numbers (never the NaN encodings 0x7f / 0xff), magnitudes up to 448.
__global__ void FillRandomFp8(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15, x *= 2246822519u, x ^= x >> 13, x *= 3266489917u, x ^= x >> 16;
    const uint8_t b = static_cast<uint8_t>(x);
    p[i] = (b & 0x7f) == 0x7f ? static_cast<uint8_t>(b ^ 1) : b;
  }
}

__global__ void FillFloat(float* p, int n, float value) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = value;
}

struct Case {
  const char* name;
  int batch, context, q_len;
  int peer;       // index of the same shape in bench_decode_attention_torch.py's cases (-1: none)
  int bound = 0;  // table width and max_kv_len hint in tokens (0: the context)
  // Slots: false = what the engine gives a dense request (a fresh BlockAllocator, one
  // HeadBlockTable::Reserve of the whole context per sequence: one run of slots per head);
  // true = random slots from the whole pool (a fragmented pool, worst-case locality).
  bool random_slots = false;
};

// Device buffers shared by all cases (sized for the largest).
struct Buffers {
  void *k = nullptr, *v = nullptr;  // bf16 or e4m3 pools
  float *k_scale = nullptr, *v_scale = nullptr;
  bf16 *q = nullptr, *out = nullptr;
  int32_t *qstart = nullptr, *lens = nullptr, *tables = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  char* flush = nullptr;  // written before every timed launch to evict K/V from the 60 MB L2
  size_t flush_bytes = size_t{256} << 20;
};

struct Stats {
  double median_ms, min_ms;
};

template <typename Launch>
Stats Time(Launch&& launch, const Buffers& buf, cudaStream_t stream, int runs) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 5; ++i) BENCH_CHECK(launch());
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    BENCH_CHECK(cudaMemsetAsync(buf.flush, i & 0xff, buf.flush_bytes, stream));
    BENCH_CHECK(cudaEventRecord(start, stream));
    BENCH_CHECK(launch());
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 30;
  bool sweep = false;
  std::vector<double> torch_gbs;  // PyTorch SDPA's GB/s per peer case, measured in the same call
  bool fp8 = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--kv-dtype") && i + 1 < argc) {
      const char* d = argv[++i];
      if (std::strcmp(d, "fp8") && std::strcmp(d, "bf16")) {
        std::fprintf(stderr, "--kv-dtype: bf16 or fp8, got %s\n", d);
        return 2;
      }
      fp8 = !std::strcmp(d, "fp8");
    }
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) runs = std::max(20, std::atoi(argv[++i]));
    if (!std::strcmp(argv[i], "--sweep")) sweep = true;
    if (!std::strcmp(argv[i], "--torch-gbs") && i + 1 < argc) {
      for (char* tok = std::strtok(argv[++i], ","); tok != nullptr;
           tok = std::strtok(nullptr, ",")) {
        torch_gbs.push_back(std::atof(tok));
      }
    }
  }

  const std::vector<Case> cases = {
      {"batch 32 x 16K, q_len 1", 32, 16384, 1, 0},
      {"batch 32 x 16K, q_len 1, random slots", 32, 16384, 1, 0, 0, true},
      {"batch 32 x 16K, q_len 2", 32, 16384, 2, 1},
      {"batch 64 x 4K, q_len 1", 64, 4096, 1, 2},
      {"batch 1 x 16K, q_len 1", 1, 16384, 1, 3},
      {"batch 48 x 2064 (sparse set), q_len 2", 48, 2064, 2, 4},
      {"batch 32 x 1K, graph bound 16K", 32, 1024, 1, -1, 16384},
      {"batch 1 x 2K, graph bound 16K", 1, 2048, 1, -1, 16384},
      // Speculation chains of k drafts verify 1 + k query tokens (k = 4: 5); each also runs
      // the prefill kernel on the same inputs (the backend's choice past its decode bound).
      {"batch 32 x 16K, q_len 4", 32, 16384, 4, -1},
      {"batch 32 x 16K, q_len 5", 32, 16384, 5, -1},
      {"batch 32 x 16K, q_len 8", 32, 16384, 8, -1},
      {"batch 1 x 16K, q_len 5", 1, 16384, 5, -1},
      {"batch 64 x 4K, q_len 5", 64, 4096, 5, -1},
      {"batch 64 x 4K, q_len 8", 64, 4096, 8, -1},
  };
  int max_slots = 0, max_tokens = 0, max_blocks = 0, max_seqs = 0;
  for (const Case& c : cases) {
    const int pages = (std::max(c.context, c.bound) + kPage - 1) / kPage;
    max_slots = std::max(max_slots, c.batch * kHkv * pages);
    max_tokens = std::max(max_tokens, c.batch * c.q_len);
    max_blocks = std::max(max_blocks, pages);
    max_seqs = std::max(max_seqs, c.batch);
  }

  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  std::printf(
      "decode attention: GQA %d/%d, head_dim %d, %s KV, the engine's slot order (random where "
      "named); median of "
      "%d runs, L2 flushed\n",
      kHq, kHkv, kHeadDim, fp8 ? "fp8 (e4m3)" : "bf16", runs);

  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Buffers buf;
  const size_t pool_elems = size_t{static_cast<size_t>(max_slots)} * kPage * kHeadDim;
  const size_t kv_elem_bytes = fp8 ? 1 : sizeof(bf16);
  BENCH_CHECK(cudaMalloc(&buf.k, pool_elems * kv_elem_bytes));
  BENCH_CHECK(cudaMalloc(&buf.v, pool_elems * kv_elem_bytes));
  BENCH_CHECK(cudaMalloc(&buf.k_scale, kHkv * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&buf.v_scale, kHkv * sizeof(float)));
  BENCH_CHECK(
      cudaMalloc(&buf.q, size_t{static_cast<size_t>(max_tokens)} * kHq * kHeadDim * sizeof(bf16)));
  BENCH_CHECK(cudaMalloc(&buf.out,
                         size_t{static_cast<size_t>(max_tokens)} * kHq * kHeadDim * sizeof(bf16)));
  BENCH_CHECK(cudaMalloc(&buf.qstart, (max_seqs + 1) * sizeof(int32_t)));
  BENCH_CHECK(
      cudaMalloc(&buf.lens, size_t{static_cast<size_t>(max_seqs)} * kHkv * sizeof(int32_t)));
  BENCH_CHECK(cudaMalloc(
      &buf.tables, size_t{static_cast<size_t>(max_seqs)} * kHkv * max_blocks * sizeof(int32_t)));
  BENCH_CHECK(cudaMalloc(&buf.flush, buf.flush_bytes));
  if (fp8) {
    FillRandomFp8<<<1024, 256, 0, stream>>>(static_cast<uint8_t*>(buf.k), pool_elems, 1);
    FillRandomFp8<<<1024, 256, 0, stream>>>(static_cast<uint8_t*>(buf.v), pool_elems, 2);
  } else {
    FillRandomBf16<<<1024, 256, 0, stream>>>(static_cast<bf16*>(buf.k), pool_elems, 1);
    FillRandomBf16<<<1024, 256, 0, stream>>>(static_cast<bf16*>(buf.v), pool_elems, 2);
  }
  FillFloat<<<1, 32, 0, stream>>>(buf.k_scale, kHkv, 1.0f / 256);
  FillFloat<<<1, 32, 0, stream>>>(buf.v_scale, kHkv, 1.0f / 256);
  FillRandomBf16<<<1024, 256, 0, stream>>>(
      buf.q, size_t{static_cast<size_t>(max_tokens)} * kHq * kHeadDim, 3);
  BENCH_CHECK(cudaGetLastError());

  std::mt19937 rng(1234);
  std::vector<int32_t> all_slots(static_cast<size_t>(max_slots));
  std::iota(all_slots.begin(), all_slots.end(), 0);
  double main_gbs = 0, random_gbs = 0, main_us = 0, main_bf16_gb = 0;
  std::printf("\n%-40s %6s %10s %9s %10s %9s %8s %9s\n", "case", "splits", "median us", "KV GB",
              "GB/s", "ceiling", "ratio", "vs torch");
  for (const Case& c : cases) {
    const int pages = (std::max(c.context, c.bound) + kPage - 1) / kPage;
    std::vector<int32_t> qstart(c.batch + 1),
        lens(size_t{static_cast<size_t>(c.batch)} * kHkv, c.context);
    std::vector<int32_t> tables(size_t{static_cast<size_t>(c.batch)} * kHkv * pages);
    for (int s = 0; s <= c.batch; ++s) qstart[s] = s * c.q_len;
    if (c.random_slots) {
      std::shuffle(all_slots.begin(), all_slots.end(), rng);  // random slots from the whole pool
      std::copy_n(all_slots.begin(), tables.size(), tables.begin());
    } else {
      oasis::BlockAllocator allocator(max_slots);
      for (int s = 0; s < c.batch; ++s) {
        oasis::HeadBlockTable table(kHkv);
        if (!table.Reserve(c.context, allocator).ok()) {
          std::fprintf(stderr, "pool too small for case %s\n", c.name);
          return 1;
        }
        for (int h = 0; h < kHkv; ++h)  // entries past the context (a graph bound) are never read
          std::copy(table.head_slots(h).begin(), table.head_slots(h).end(),
                    tables.begin() + (size_t(s) * kHkv + h) * pages);
        (void)table.TakeSlots();  // the pool is rebuilt for the next case
      }
    }
    BENCH_CHECK(cudaMemcpyAsync(buf.qstart, qstart.data(), qstart.size() * 4,
                                cudaMemcpyHostToDevice, stream));
    BENCH_CHECK(
        cudaMemcpyAsync(buf.lens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice, stream));
    BENCH_CHECK(cudaMemcpyAsync(buf.tables, tables.data(), tables.size() * 4,
                                cudaMemcpyHostToDevice, stream));

    oasis::kernels::DecodeAttentionParams p;
    p.q = buf.q, p.out = buf.out;
    if (fp8) {
      p.kv_dtype = oasis::kernels::KvDtype::kFp8E4M3;
      p.k_pool_fp8 = static_cast<const uint8_t*>(buf.k);
      p.v_pool_fp8 = static_cast<const uint8_t*>(buf.v);
      p.k_scale = buf.k_scale, p.v_scale = buf.v_scale;
    } else {
      p.k_pool = static_cast<const bf16*>(buf.k), p.v_pool = static_cast<const bf16*>(buf.v);
    }
    p.query_start = buf.qstart, p.kv_lens = buf.lens, p.block_tables = buf.tables;
    p.tokens = int64_t{c.batch} * c.q_len;
    p.num_seqs = c.batch, p.num_q_heads = kHq, p.num_kv_heads = kHkv, p.head_dim = kHeadDim;
    p.max_blocks = pages, p.max_query_len = c.q_len, p.scale = 1.0f / std::sqrt(float(kHeadDim));
    p.max_kv_len = c.bound;
    auto run = [&](const oasis::kernels::DecodeAttentionParams& q) {
      const size_t ws = oasis::kernels::DecodeAttentionWorkspaceBytes(q);
      if (ws > buf.workspace_bytes) {
        if (buf.workspace) BENCH_CHECK(cudaFree(buf.workspace));
        BENCH_CHECK(cudaMalloc(&buf.workspace, ws));
        buf.workspace_bytes = ws;
      }
      return Time(
          [&] { return oasis::kernels::LaunchDecodeAttention(q, buf.workspace, ws, stream); }, buf,
          stream, runs);
    };
    // Bytes the step reads: K and V of every visible token (fp8: one byte per value).
    const double kv_gb = double(c.batch) * kHkv * c.context * kHeadDim * kv_elem_bytes * 2 / 1e9;
    const double bf16_gb = double(c.batch) * kHkv * c.context * kHeadDim * 2 * 2 / 1e9;
    if (sweep) {
      for (int forced : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64}) {
        oasis::kernels::DecodeAttentionParams q = p;
        q.num_splits = forced;
        if (oasis::kernels::DecodeAttentionNumSplits(q) != forced) continue;
        const Stats sw = run(q);
        std::printf("  sweep %-32s %6d %10.1f %9.3f %10.0f\n", c.name, forced, sw.median_ms * 1e3,
                    kv_gb, kv_gb / (sw.median_ms * 1e-3));
      }
    }
    const Stats st = run(p);
    // The output must be finite (a cheap guard; tests/kernels/test_attention_decode.cpp checks
    // values).
    std::vector<uint16_t> out(static_cast<size_t>(p.tokens) * kHq * kHeadDim);
    BENCH_CHECK(cudaMemcpy(out.data(), buf.out, out.size() * 2, cudaMemcpyDeviceToHost));
    for (uint16_t b : out)
      if ((b & 0x7f80) == 0x7f80) {
        std::fprintf(stderr, "non-finite output in case %s\n", c.name);
        return 1;
      }
    const double gbs = kv_gb / (st.median_ms * 1e-3);
    char vs[32] = "-";
    const double peer_gbs =
        c.peer >= 0 && c.peer < static_cast<int>(torch_gbs.size()) ? torch_gbs[c.peer] : 0.0;
    // PyTorch's (bf16) step time over ours (= the GB/s ratio when both read bf16).
    if (peer_gbs > 0)
      std::snprintf(vs, sizeof(vs), "%.2fx", bf16_gb / peer_gbs / (st.median_ms * 1e-3));
    std::printf("%-40s %6d %10.1f %9.3f %10.0f %9.0f %8.3f %9s\n", c.name,
                oasis::kernels::DecodeAttentionNumSplits(p), st.median_ms * 1e3, kv_gb, gbs,
                kCeilingGBs, gbs / kCeilingGBs, vs);
    if (c.q_len >= 4) {  // the prefill kernel on the same inputs
      oasis::kernels::PrefillAttentionParams f;
      f.q = p.q, f.k_pool = p.k_pool, f.v_pool = p.v_pool, f.query_start = p.query_start;
      f.kv_dtype = p.kv_dtype, f.k_pool_fp8 = p.k_pool_fp8, f.v_pool_fp8 = p.v_pool_fp8;
      f.k_scale = p.k_scale, f.v_scale = p.v_scale;
      f.kv_lens = p.kv_lens, f.block_tables = p.block_tables, f.out = p.out, f.tokens = p.tokens;
      f.num_seqs = p.num_seqs, f.num_q_heads = kHq, f.num_kv_heads = kHkv, f.head_dim = kHeadDim;
      f.max_blocks = pages, f.max_query_len = c.q_len, f.scale = p.scale;
      const Stats pf = Time([&] { return oasis::kernels::LaunchPrefillAttention(f, stream); }, buf,
                            stream, runs);
      std::printf("%-40s %6s %10.1f %9.3f %10.0f %9.0f %8.3f  decode/prefill time %.2f\n",
                  "  (prefill kernel, same case)", "-", pf.median_ms * 1e3, kv_gb,
                  kv_gb / (pf.median_ms * 1e-3), kCeilingGBs,
                  kv_gb / (pf.median_ms * 1e-3) / kCeilingGBs, st.median_ms / pf.median_ms);
    }
    if (c.random_slots) random_gbs = gbs;  // the main shape's random-slot case
    if (&c == &cases.front()) {
      main_gbs = gbs;
      main_us = st.median_ms * 1e3;
      main_bf16_gb = bf16_gb;
      // The reference-grade kernel (one CTA per row and query head) on the same inputs, for scale.
      oasis::kernels::PagedAttentionParams r;
      r.q = p.q, r.k_pool = p.k_pool, r.v_pool = p.v_pool, r.query_start = p.query_start,
      r.kv_lens = p.kv_lens;
      r.kv_dtype = p.kv_dtype, r.k_pool_fp8 = p.k_pool_fp8, r.v_pool_fp8 = p.v_pool_fp8;
      r.k_scale = p.k_scale, r.v_scale = p.v_scale;
      r.block_tables = p.block_tables, r.out = p.out, r.tokens = p.tokens, r.num_seqs = p.num_seqs;
      r.num_q_heads = kHq, r.num_kv_heads = kHkv, r.head_dim = kHeadDim, r.max_blocks = pages,
      r.scale = p.scale;
      const Stats ref =
          Time([&] { return oasis::kernels::LaunchPagedAttention(r, stream); }, buf, stream, 20);
      std::printf("%-40s %6s %10.1f %9.3f %10.0f %9.0f %8.3f\n", "  (reference kernel, same case)",
                  "-", ref.median_ms * 1e3, kv_gb, kv_gb / (ref.median_ms * 1e-3), kCeilingGBs,
                  kv_gb / (ref.median_ms * 1e-3) / kCeilingGBs);
    }
  }
  char peer[128] = "no peer measured";
  if (!torch_gbs.empty() && torch_gbs[0] > 0) {
    if (fp8) {
      std::snprintf(peer, sizeof(peer),
                    "vs PyTorch SDPA bf16 %.0f GB/s (same call): %.2fx its speed", torch_gbs[0],
                    main_bf16_gb / torch_gbs[0] / (main_us * 1e-6));
    } else {
      std::snprintf(peer, sizeof(peer), "vs PyTorch SDPA %.0f GB/s (same call): %.2fx",
                    torch_gbs[0], main_gbs / torch_gbs[0]);
    }
  }
  std::printf(
      "\nRESULT decode_attention b32x16K GQA32/8 d128%s: %.0f GB/s of KV (random slots %.0f), "
      "ceiling %.0f GB/s, "
      "ratio %.3f; %s\n",
      fp8 ? " fp8" : "", main_gbs, random_gbs, kCeilingGBs, main_gbs / kCeilingGBs, peer);
  return 0;
}
