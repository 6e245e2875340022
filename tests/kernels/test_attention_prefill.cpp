// GPU: the tensor-core prefill attention kernels (kernels/attention_prefill.h) against
// CpuBackend::Attention on fresh random inputs: single prompts and variable-length batches,
// chunked prefill over cached context, GQA 32/8, 8/2 and MHA, head_dim 64 and 128, sparse
// heads (different lengths and tables per KV head), every tile configuration (the sm_90a
// wgmma kernel in both ring depths when the device is compute capability 9.0). KV pools hold
// NaN everywhere but in the visible tokens (partial blocks included), slots are shuffled,
// unused table entries are -1, and outputs are poisoned with NaN beforehand. Every output
// row must also match in relative L2 norm (a wrong fragment or descriptor mapping shows up
// there even where the element tolerance is loose, e.g. on long rows of small values).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "gpu_test_util.h"
#include "kernels/attention_prefill.h"

using namespace oasis;
using namespace oasis::testing;
using kernels::PrefillTileConfig;

namespace {

std::mt19937 FreshRng() { return std::mt19937(std::random_device{}()); }

std::unique_ptr<CudaBackend> MakeBackend() {
  auto b = CudaBackend::Create();
  REQUIRE(b.ok());
  return std::move(*b);
}

struct SeqSpec {
  int q_len;   // new tokens of this step
  int kv_len;  // cached context + q_len (for every KV head unless the problem is sparse)
};

// Host tensors of one attention problem (F32, bf16-exact values).
struct Problem {
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 0, max_query_len = 0;
  Tensor q;             // [tokens, num_q_heads, head_dim]
  LayerKvPool pool;     // [slots, 16, head_dim] each, NaN outside visible tokens
  Tensor query_start;   // [num_seqs + 1] int32
  Tensor kv_lens;       // [num_seqs, num_kv_heads] int32
  Tensor block_tables;  // [num_seqs, num_kv_heads, max_blocks] int32, -1 where unused
};

enum class HeadLengths { kSame, kSparse };

Problem MakeProblem(const std::vector<SeqSpec>& seqs, int hq, int hkv, int head_dim, std::mt19937& rng,
                    HeadLengths lengths = HeadLengths::kSame, float q_stddev = 1.0f) {
  Problem pr;
  pr.num_q_heads = hq;
  pr.num_kv_heads = hkv;
  pr.head_dim = head_dim;
  const int S = static_cast<int>(seqs.size());
  // Per-(sequence, head) lengths: sparse heads keep a random subset size >= q_len.
  std::vector<int> lens(static_cast<size_t>(S * hkv));
  int64_t tokens = 0, slots = 7, max_blocks = 1;
  for (int s = 0; s < S; ++s) {
    const SeqSpec sp = seqs[static_cast<size_t>(s)];
    REQUIRE(sp.kv_len >= sp.q_len);
    tokens += sp.q_len;
    pr.max_query_len = std::max(pr.max_query_len, sp.q_len);
    for (int h = 0; h < hkv; ++h) {
      int len = sp.kv_len;
      if (lengths == HeadLengths::kSparse) len = std::uniform_int_distribution<int>(sp.q_len, sp.kv_len)(rng);
      lens[static_cast<size_t>(s * hkv + h)] = len;
      slots += (len + 15) / 16;
      max_blocks = std::max<int64_t>(max_blocks, (len + 15) / 16 + 2);
    }
  }
  std::vector<int32_t> free_slots(static_cast<size_t>(slots));
  std::iota(free_slots.begin(), free_slots.end(), 0);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);

  pr.q = RandomBf16Exact({tokens, hq, head_dim}, rng, q_stddev);
  pr.query_start = Tensor::Empty({S + 1}, DType::kI32);
  pr.kv_lens = Tensor::Empty({S, hkv}, DType::kI32);
  pr.block_tables = Tensor::Empty({S, hkv, max_blocks}, DType::kI32);
  std::fill_n(pr.block_tables.data<int32_t>(), pr.block_tables.numel(), -1);
  pr.pool.k = Tensor::Empty({slots, 16, head_dim}, DType::kF32);
  pr.pool.v = Tensor::Empty({slots, 16, head_dim}, DType::kF32);
  std::fill_n(pr.pool.k.data<float>(), pr.pool.k.numel(), std::numeric_limits<float>::quiet_NaN());
  std::fill_n(pr.pool.v.data<float>(), pr.pool.v.numel(), std::numeric_limits<float>::quiet_NaN());
  Tensor kv_values = RandomBf16Exact({2, slots * 16, head_dim}, rng);  // a source of random rows
  size_t next = 0;
  int32_t row = 0;
  for (int s = 0; s < S; ++s) {
    pr.query_start.data<int32_t>()[s] = row;
    row += seqs[static_cast<size_t>(s)].q_len;
    for (int h = 0; h < hkv; ++h) {
      const int len = lens[static_cast<size_t>(s * hkv + h)];
      pr.kv_lens.data<int32_t>()[s * hkv + h] = len;
      int32_t* table = pr.block_tables.data<int32_t>() + (s * hkv + h) * max_blocks;
      for (int b = 0; b < (len + 15) / 16; ++b) table[b] = free_slots[next++];
      for (int p = 0; p < len; ++p) {
        const int64_t at = (int64_t{table[p / 16]} * 16 + p % 16) * head_dim;  // same place in source and pool
        std::copy_n(kv_values.data<float>() + at, head_dim, pr.pool.k.data<float>() + at);
        std::copy_n(kv_values.data<float>() + slots * 16 * head_dim + at, head_dim, pr.pool.v.data<float>() + at);
      }
    }
  }
  pr.query_start.data<int32_t>()[S] = row;
  return pr;
}

const char* ConfigName(PrefillTileConfig c) {
  switch (c) {
    case PrefillTileConfig::kAuto: return "auto";
    case PrefillTileConfig::kM128W4: return "m128w4";
    case PrefillTileConfig::kM128W8: return "m128w8";
    case PrefillTileConfig::kM64W4: return "m64w4";
    case PrefillTileConfig::kSm90: return "sm90";
    case PrefillTileConfig::kSm90S2: return "sm90s2";
  }
  return "?";
}

// Every configuration the current device runs; kAuto first (it also exercises the grid bound
// without max_query_len).
std::vector<PrefillTileConfig> Configs() {
  std::vector<PrefillTileConfig> configs = {PrefillTileConfig::kAuto, PrefillTileConfig::kM128W4,
                                            PrefillTileConfig::kM128W8, PrefillTileConfig::kM64W4};
  if (kernels::PrefillAttentionSm90Available()) {
    configs.push_back(PrefillTileConfig::kSm90);
    configs.push_back(PrefillTileConfig::kSm90S2);
  }
  return configs;
}

// Each row of head_dim values (one query row of one head): ||got - want|| <= rel * ||want||
// (+ a floor for rows of tiny norm). bf16 rounding of P and of the output gives ~2e-3.
void ExpectRowsClose(const Tensor& got, const Tensor& want, int head_dim, double rel) {
  REQUIRE(got.numel() == want.numel());
  double worst = 0;
  int64_t worst_row = -1;
  for (int64_t r = 0; r < got.numel() / head_dim; ++r) {
    double err = 0, norm = 0;
    for (int64_t i = r * head_dim; i < (r + 1) * head_dim; ++i) {
      const double g = got.data<float>()[i], w = want.data<float>()[i];
      err += (g - w) * (g - w);
      norm += w * w;
    }
    const double ratio = std::isfinite(err) ? std::sqrt(err) / std::max(std::sqrt(norm), 1e-3) : INFINITY;
    if (!(ratio <= worst)) {
      worst = ratio;
      worst_row = r;
    }
  }
  INFO("worst row " << worst_row << " (token " << worst_row / std::max<int64_t>(1, got.dim(1)) << ", head "
                    << worst_row % std::max<int64_t>(1, got.dim(1)) << "): relative L2 error " << worst);
  CHECK(worst <= rel);
}

// Runs the CPU reference once and the GPU kernel in every tile configuration; each output
// must match within bf16 tolerance.
void CheckAgainstCpu(CudaBackend& gpu, const Problem& pr) {
  CpuBackend cpu;
  const int64_t tokens = pr.q.dim(0);
  const int d = pr.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  Tensor want = Tensor::Empty({tokens, pr.num_q_heads, d}, DType::kF32);
  cpu.Attention(pr.q, pr.pool, {pr.query_start, pr.kv_lens, pr.block_tables, pr.max_query_len}, scale, want);

  Tensor q = UploadBf16(gpu, pr.q), k_pool = UploadBf16(gpu, pr.pool.k), v_pool = UploadBf16(gpu, pr.pool.v);
  Tensor qs = gpu.Upload(pr.query_start), lens = gpu.Upload(pr.kv_lens), tables = gpu.Upload(pr.block_tables);
  for (PrefillTileConfig config : Configs()) {
    Tensor out = PoisonedBf16(gpu, {tokens, pr.num_q_heads, d});
    kernels::PrefillAttentionParams p;
    p.q = static_cast<const __nv_bfloat16*>(q.raw());
    p.k_pool = static_cast<const __nv_bfloat16*>(k_pool.raw());
    p.v_pool = static_cast<const __nv_bfloat16*>(v_pool.raw());
    p.query_start = qs.data<int32_t>();
    p.kv_lens = lens.data<int32_t>();
    p.block_tables = tables.data<int32_t>();
    p.out = static_cast<__nv_bfloat16*>(out.raw());
    p.tokens = tokens;
    p.num_seqs = static_cast<int>(pr.query_start.numel() - 1);
    p.num_q_heads = pr.num_q_heads;
    p.num_kv_heads = pr.num_kv_heads;
    p.head_dim = d;
    p.max_blocks = static_cast<int>(pr.block_tables.dim(2));
    // kAuto also exercises the grid bound without max_query_len.
    p.max_query_len = config == PrefillTileConfig::kAuto ? 0 : pr.max_query_len;
    p.scale = scale;
    p.tile = config;
    REQUIRE(kernels::LaunchPrefillAttention(p, gpu.stream()) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(gpu.stream()) == cudaSuccess);
    INFO("config " << ConfigName(config) << ", GQA " << pr.num_q_heads << "/" << pr.num_kv_heads << ", head_dim " << d
                   << ", tokens " << tokens);
    const Tensor got = DownloadF32(gpu, out);
    ExpectClose(got, want, 1e-2, 2e-2);
    ExpectRowsClose(got, want, d, 2e-2);
  }
}

}  // namespace

TEST_CASE("prefill attention: single prompts of many lengths (GQA 8/2, head_dim 128)", "[gpu][attention][prefill]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  for (int n : {1, 15, 16, 17, 63, 64, 65, 100, 127, 128, 129, 255, 1000, 3000}) {
    INFO("prompt " << n);
    CheckAgainstCpu(*gpu, MakeProblem({{n, n}}, 8, 2, 128, rng));
  }
}

TEST_CASE("prefill attention: variable-length batch with chunked prefill (GQA 32/8, head_dim 128)",
          "[gpu][attention][prefill]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  // Fresh prompts, chunks over cached context (q_len < kv_len), and a decode-like row.
  CheckAgainstCpu(*gpu, MakeProblem({{1, 1}, {7, 7}, {33, 33}, {128, 128}, {200, 200}, {500, 500},
                                     {100, 900}, {64, 1064}, {1, 50}, {129, 1000}},
                                    32, 8, 128, rng));
}

TEST_CASE("prefill attention: MHA and head_dim 64, chunked, peaky softmax", "[gpu][attention][prefill]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  const std::vector<SeqSpec> seqs = {{130, 1500}, {17, 2000}, {300, 301}, {64, 128}, {1000, 1000}};
  CheckAgainstCpu(*gpu, MakeProblem(seqs, 4, 4, 64, rng));
  // Large |q| makes each row's softmax nearly one-hot: the running max must be exact.
  CheckAgainstCpu(*gpu, MakeProblem(seqs, 4, 4, 64, rng, HeadLengths::kSame, 4.0f));
  CheckAgainstCpu(*gpu, MakeProblem({{250, 700}, {77, 77}}, 4, 4, 128, rng, HeadLengths::kSame, 4.0f));
}

TEST_CASE("prefill attention: more than 32 sequences of random lengths (GQA 8/2, head_dim 64 and 128)",
          "[gpu][attention][prefill]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  for (int d : {64, 128}) {
    std::vector<SeqSpec> seqs;
    std::uniform_int_distribution<int> q_len(1, 150), ctx(0, 300), empty_ctx(0, 3);
    for (int i = 0; i < 45; ++i) {
      const int q = q_len(rng);
      seqs.push_back({q, q + (empty_ctx(rng) == 0 ? 0 : ctx(rng))});
    }
    CheckAgainstCpu(*gpu, MakeProblem(seqs, 8, 2, d, rng));
  }
}

TEST_CASE("prefill attention: sparse heads with their own lengths and tables", "[gpu][attention][prefill]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  for (int d : {64, 128}) {
    CheckAgainstCpu(*gpu, MakeProblem({{40, 700}, {200, 900}, {3, 300}, {90, 90}}, 8, 2, d, rng, HeadLengths::kSparse));
  }
}

TEST_CASE("prefill attention: chunks whose context offset crosses tile and warpgroup boundaries",
          "[gpu][attention][prefill]") {
  // The wgmma kernel masks per 64-row warpgroup and per 128-key tile: a context offset of
  // 64..127 (mod 128) leaves the first warpgroup a fully masked tile, offsets 1..63 put the
  // diagonal in two tiles, a chunk of 1..64 rows leaves the second warpgroup without real rows.
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  for (int d : {128, 64}) {
    std::vector<SeqSpec> seqs;
    for (int ctx : {1, 63, 64, 65, 127, 128, 200}) {
      for (int q : {1, 64, 65, 129}) seqs.push_back({q, q + ctx});
    }
    INFO("head_dim " << d);
    CheckAgainstCpu(*gpu, MakeProblem(seqs, 4, 1, d, rng));
  }
}

TEST_CASE("prefill attention: long prompt, peaky softmax, GQA 8/2", "[gpu][attention][prefill]") {
  // Many KV tiles per CTA (the K/V ring wraps several times in every stage count) and a
  // nearly one-hot softmax, where a key or row mapped to the wrong place changes the output
  // by O(1) instead of averaging out.
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  CheckAgainstCpu(*gpu, MakeProblem({{1200, 1200}, {500, 1700}}, 8, 2, 128, rng, HeadLengths::kSame, 4.0f));
  CheckAgainstCpu(*gpu, MakeProblem({{1100, 1600}}, 8, 2, 64, rng, HeadLengths::kSame, 4.0f));
}

TEST_CASE("prefill attention: rejects unsupported shapes", "[gpu][attention][prefill]") {
  auto gpu = MakeBackend();
  kernels::PrefillAttentionParams p;
  Tensor buf = gpu->Empty({1024}, DType::kBF16);
  Tensor ints = gpu->Empty({16}, DType::kI32);
  p.q = p.k_pool = p.v_pool = static_cast<const __nv_bfloat16*>(buf.raw());
  p.out = static_cast<__nv_bfloat16*>(buf.raw());
  p.query_start = p.kv_lens = p.block_tables = ints.data<int32_t>();
  p.tokens = 1;
  p.num_seqs = 1;
  p.num_q_heads = 8;
  p.num_kv_heads = 2;
  p.max_blocks = 1;
  p.head_dim = 96;
  CHECK(kernels::LaunchPrefillAttention(p, gpu->stream()) == cudaErrorInvalidValue);
  p.head_dim = 128;
  p.num_kv_heads = 3;
  CHECK(kernels::LaunchPrefillAttention(p, gpu->stream()) == cudaErrorInvalidValue);
  p.num_kv_heads = 2;
  p.tokens = 0;  // nothing to do
  CHECK(kernels::LaunchPrefillAttention(p, gpu->stream()) == cudaSuccess);
  CHECK(!kernels::PrefillAttentionSupportsHeadDim(80));
  CHECK(kernels::PrefillAttentionSupportsHeadDim(64));
  int device = 0, major = 0, minor = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess);
  CHECK(kernels::PrefillAttentionSm90Available() == (major == 9 && minor == 0));
  if (!kernels::PrefillAttentionSm90Available()) {  // the wgmma configurations are refused elsewhere
    p.tokens = 1;
    p.tile = PrefillTileConfig::kSm90;
    CHECK(kernels::LaunchPrefillAttention(p, gpu->stream()) == cudaErrorInvalidValue);
  }
}
