// The FP8 (e4m3) KV cache on the CUDA backend against the CPU reference (backend.h, LayerKvPool)
// on fresh random inputs: appends store the CPU's bytes and raise the same per-head amax (KvAppend,
// QkvRopeAppend, the fused decode input side); attention over FP8 pools (the split-K decode
// kernel, the mma.sync prefill kernel, the sm_90a wgmma prefill kernel through its explicit tiles,
// the reference kernel, and CudaBackend::Attention's choice among them) within bf16 tolerance of
// the CPU's FP8 attention; block summaries exact (bf16, and e4m3 summaries bit for bit);
// ScoreBlocks over e4m3 summaries within the bf16 ScoreBlocks test's tolerance and TopKBlocks on
// its scores identical (fresh seeds, printed on failure); mismatched summary dtypes refused; block
// and token copies byte-exact (device and mapped host pools, both gather kernels). Unwritten pool
// entries are e4m3 NaN (0x7f) and outputs NaN-poisoned, so reads past kv_len and unwritten rows
// show.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "gpu_test_util.h"
#include "kernels/attention.h"
#include "kernels/attention_decode.h"
#include "kernels/attention_prefill.h"
#include "kernels/sparse_kv.h"

using namespace oasis;
using namespace oasis::testing;

namespace {

constexpr uint8_t kNanFp8 = 0x7f;

std::mt19937 FreshRng() { return std::mt19937(std::random_device{}()); }

int RandInt(std::mt19937& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

float RandFloat(std::mt19937& rng, float lo, float hi) {
  return std::uniform_real_distribution<float>(lo, hi)(rng);
}

std::unique_ptr<CudaBackend> MakeBackend() {
  auto b = CudaBackend::Create();
  REQUIRE(b.ok());
  return std::move(*b);
}

Tensor Ints(std::vector<int64_t> shape, const std::vector<int32_t>& v) {
  Tensor t = Tensor::Empty(std::move(shape), DType::kI32);
  REQUIRE(static_cast<int64_t>(v.size()) == t.numel());
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

Tensor Int64s(std::vector<int64_t> shape, const std::vector<int64_t>& v) {
  Tensor t = Tensor::Empty(std::move(shape), DType::kI64);
  REQUIRE(static_cast<int64_t>(v.size()) == t.numel());
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

Tensor Floats(const std::vector<float>& v) {
  return Tensor::FromFloats(v, {static_cast<int64_t>(v.size())});
}

// Random e4m3 bytes that are numbers (no NaN), or any bytes.
enum class Bytes { kNumbers, kAny };
Tensor RandomFp8(std::vector<int64_t> shape, std::mt19937& rng, Bytes what = Bytes::kNumbers) {
  Tensor t = Tensor::Empty(std::move(shape), DType::kF8E4M3);
  uint8_t* p = t.data<uint8_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint8_t b = static_cast<uint8_t>(RandInt(rng, 0, 255));
    if (what == Bytes::kNumbers && (b & 0x7f) == 0x7f) b = 0x7e;
    p[i] = b;
  }
  return t;
}

// Per-KV-head scales, log-uniform in [lo, hi].
std::vector<float> RandomScales(std::mt19937& rng, int heads, float lo, float hi) {
  std::vector<float> s(static_cast<size_t>(heads));
  for (float& x : s) x = std::exp(RandFloat(rng, std::log(lo), std::log(hi)));
  return s;
}

// A host FP8 pool with scales and maxima (the CPU reference's; copy it before a CPU op changes it).
LayerKvPool HostFp8Pool(Tensor k, Tensor v, const std::vector<float>& k_scale,
                        const std::vector<float>& v_scale, const std::vector<float>& k_amax,
                        const std::vector<float>& v_amax) {
  LayerKvPool p;
  p.k = std::move(k);
  p.v = std::move(v);
  p.k_scale = Floats(k_scale);
  p.v_scale = Floats(v_scale);
  p.k_amax = Floats(k_amax);
  p.v_amax = Floats(v_amax);
  return p;
}

// K and V only (no scales: what copies and summaries need).
LayerKvPool KvOnly(Tensor k, Tensor v) {
  LayerKvPool p;
  p.k = std::move(k);
  p.v = std::move(v);
  return p;
}

LayerKvPool ClonePool(const LayerKvPool& p) {
  LayerKvPool c;
  c.k = p.k.Clone();
  c.v = p.v.Clone();
  if (p.k_scale.defined()) {
    c.k_scale = p.k_scale.Clone();
    c.v_scale = p.v_scale.Clone();
    c.k_amax = p.k_amax.Clone();
    c.v_amax = p.v_amax.Clone();
  }
  return c;
}

LayerKvPool UploadPool(CudaBackend& gpu, const LayerKvPool& host) {
  LayerKvPool d;
  d.k = gpu.Upload(host.k);
  d.v = gpu.Upload(host.v);
  if (host.k_scale.defined()) {
    d.k_scale = gpu.Upload(host.k_scale);
    d.v_scale = gpu.Upload(host.v_scale);
    d.k_amax = gpu.Upload(host.k_amax);
    d.v_amax = gpu.Upload(host.v_amax);
  }
  return d;
}

// Same bytes; two e4m3 NaNs (either sign) count as equal.
void ExpectSameBytes(const Tensor& got, const Tensor& want, const char* what) {
  REQUIRE(got.nbytes() == want.nbytes());
  const uint8_t* g = static_cast<const uint8_t*>(got.raw());
  const uint8_t* w = static_cast<const uint8_t*>(want.raw());
  int64_t first = -1, count = 0;
  for (size_t i = 0; i < got.nbytes(); ++i) {
    const bool same = g[i] == w[i] || ((g[i] & 0x7f) == 0x7f && (w[i] & 0x7f) == 0x7f);
    if (!same && count++ == 0) first = static_cast<int64_t>(i);
  }
  INFO(what << ": " << count << " bytes differ; first at " << first << ": got "
            << (first >= 0 ? int(g[first]) : 0) << " want " << (first >= 0 ? int(w[first]) : 0));
  CHECK(count == 0);
}

// Same float bits (amax values).
void ExpectSameFloats(const Tensor& got, const Tensor& want, const char* what) {
  REQUIRE(got.numel() == want.numel());
  for (int64_t i = 0; i < got.numel(); ++i) {
    INFO(what << "[" << i << "]: got " << got.data<float>()[i] << " want "
              << want.data<float>()[i]);
    CHECK(std::memcmp(got.data<float>() + i, want.data<float>() + i, sizeof(float)) == 0);
  }
}

// A slot mapping [tokens, heads] of distinct pool rows, about one in `skip_every` entries -1.
Tensor RandomMapping(std::mt19937& rng, int64_t tokens, int heads, int64_t pool_rows,
                     int skip_every) {
  std::vector<int64_t> rows(static_cast<size_t>(pool_rows));
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), rng);
  std::vector<int64_t> m(static_cast<size_t>(tokens * heads));
  for (size_t i = 0; i < m.size(); ++i) m[i] = RandInt(rng, 0, skip_every - 1) == 0 ? -1 : rows[i];
  return Int64s({tokens, heads}, m);
}

// The rows of a downloaded bf16 pool at a slot mapping, as F32 [tokens, heads, head_dim] (zeros
// where the mapping skips): what a bf16 pool holds after an append.
Tensor RowsAt(const Tensor& pool_f32, const Tensor& mapping, int64_t head_dim) {
  const int64_t n = mapping.numel();
  Tensor out = Tensor::Zeros({mapping.dim(0), mapping.dim(1), head_dim}, DType::kF32);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = mapping.data<int64_t>()[i];
    if (r >= 0)
      std::memcpy(out.data<float>() + i * head_dim, pool_f32.data<float>() + r * head_dim,
                  head_dim * sizeof(float));
  }
  return out;
}

}  // namespace

// ---- Appends ------------------------------------------------------------------------------------

TEST_CASE("FP8 KvAppend on the GPU stores the CPU's bytes and raises the same amax", "[gpu][fp8]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  for (int head_dim : {64, 128, 256}) {
    const int heads = 4;
    const int64_t tokens = RandInt(rng, 1, 40), slots = tokens * heads / kBlockSize + 5;
    Tensor k = RandomBf16Exact({tokens, heads, head_dim}, rng, 1.0f);
    Tensor v = RandomBf16Exact({tokens, heads, head_dim}, rng, 3.0f);
    // Head 2's keys are large: many saturate at ±448 · scale. One NaN key (head 1): stored as NaN,
    // ignored by amax.
    for (int64_t t = 0; t < tokens; ++t)
      for (int d = 0; d < head_dim; ++d) {
        float& x = k.data<float>()[(t * heads + 2) * head_dim + d];
        x = Bf16BitsToFloat(FloatToBf16Bits(x * 300.0f));
      }
    k.data<float>()[(0 * heads + 1) * head_dim + 3] = NAN;
    const Tensor mapping = RandomMapping(rng, tokens, heads, slots * kBlockSize, 8);
    // Scales from 1/448 (N(0,1) values saturate now and then) to 8/448; amax starts at [0, 2).
    std::vector<float> amax0(heads), amax1(heads);
    for (int h = 0; h < heads; ++h)
      amax0[h] = RandFloat(rng, 0.0f, 2.0f), amax1[h] = RandFloat(rng, 0.0f, 2.0f);
    amax0[3] = 1e6f;  // larger than anything appended: unchanged
    LayerKvPool host = HostFp8Pool(RandomFp8({slots, kBlockSize, head_dim}, rng),
                                   RandomFp8({slots, kBlockSize, head_dim}, rng),
                                   RandomScales(rng, heads, 1.0f / 448, 8.0f / 448),
                                   RandomScales(rng, heads, 1.0f / 448, 8.0f / 448), amax0, amax1);
    LayerKvPool dev = UploadPool(*gpu, host);
    cpu.KvAppend(k, v, mapping, host);
    gpu->KvAppend(UploadBf16(*gpu, k), UploadBf16(*gpu, v), gpu->Upload(mapping), dev);
    INFO("head_dim " << head_dim << " tokens " << tokens);
    ExpectSameBytes(gpu->Download(dev.k), host.k, "K pool");
    ExpectSameBytes(gpu->Download(dev.v), host.v, "V pool");
    ExpectSameFloats(gpu->Download(dev.k_amax), host.k_amax, "k_amax");
    ExpectSameFloats(gpu->Download(dev.v_amax), host.v_amax, "v_amax");
  }
}

TEST_CASE("FP8 QkvRopeAppend and the fused decode input side store e4m3 of what the bf16 pool gets",
          "[gpu][fp8]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  const int hq = 8, hkv = 2;
  for (int head_dim : {64, 128, 256}) {
    RopeParams rope;
    for (int i = 0; i < head_dim / 2; ++i)
      rope.inv_freq.push_back(
          std::pow(1e6f, -2.0f * static_cast<float>(i) / static_cast<float>(head_dim)));
    const int64_t width = (hq + 2 * hkv) * head_dim, hidden = 256;
    for (int64_t tokens : {1, 2, 4, 9}) {
      INFO("head_dim " << head_dim << " tokens " << tokens);
      const int64_t slots = tokens * hkv / kBlockSize + 4;
      std::vector<int32_t> pos(static_cast<size_t>(tokens));
      for (auto& p : pos) p = RandInt(rng, 0, 30000);
      const Tensor positions = gpu->Upload(Ints({tokens}, pos));
      const Tensor mapping_h = RandomMapping(rng, tokens, hkv, slots * kBlockSize, 5);
      const Tensor mapping = gpu->Upload(mapping_h);
      Tensor qn_h = RandomBf16Exact({head_dim}, rng, 0.2f),
             kn_h = RandomBf16Exact({head_dim}, rng, 0.2f);
      for (int64_t i = 0; i < head_dim; ++i) {
        qn_h.data<float>()[i] = Bf16BitsToFloat(FloatToBf16Bits(1.0f + qn_h.data<float>()[i]));
        kn_h.data<float>()[i] = Bf16BitsToFloat(FloatToBf16Bits(1.0f + kn_h.data<float>()[i]));
      }
      const Tensor q_norm = UploadBf16(*gpu, qn_h), k_norm = UploadBf16(*gpu, kn_h);
      const LayerKvPool host0 =
          HostFp8Pool(RandomFp8({slots, kBlockSize, head_dim}, rng),
                      RandomFp8({slots, kBlockSize, head_dim}, rng),
                      RandomScales(rng, hkv, 0.5f / 448, 8.0f / 448),
                      RandomScales(rng, hkv, 0.5f / 448, 8.0f / 448), {0.25f, 0.0f}, {0.0f, 0.5f});

      // Runs `op` into a bf16 pool and into an FP8 pool (same inputs); checks q is identical and
      // the FP8 pool equals the CPU's FP8 KvAppend of the bf16 pool's new rows.
      auto check = [&](auto&& op, const char* what) {
        INFO(what);
        Tensor bf_k = UploadBf16(*gpu, Tensor::Zeros({slots, kBlockSize, head_dim}, DType::kF32));
        Tensor bf_v = UploadBf16(*gpu, Tensor::Zeros({slots, kBlockSize, head_dim}, DType::kF32));
        LayerKvPool bf = KvOnly(bf_k, bf_v);
        LayerKvPool dev = UploadPool(*gpu, host0);
        Tensor q_bf = PoisonedBf16(*gpu, {tokens, hq, head_dim}),
               q_fp8 = PoisonedBf16(*gpu, {tokens, hq, head_dim});
        op(q_bf, bf);
        op(q_fp8, dev);
        const Tensor qa = gpu->Download(q_bf), qb = gpu->Download(q_fp8);
        CHECK(std::memcmp(qa.raw(), qb.raw(), qa.nbytes()) == 0);
        LayerKvPool want = ClonePool(host0);
        cpu.KvAppend(RowsAt(DownloadF32(*gpu, bf.k), mapping_h, head_dim),
                     RowsAt(DownloadF32(*gpu, bf.v), mapping_h, head_dim), mapping_h, want);
        ExpectSameBytes(gpu->Download(dev.k), want.k, "K pool");
        ExpectSameBytes(gpu->Download(dev.v), want.v, "V pool");
        ExpectSameFloats(gpu->Download(dev.k_amax), want.k_amax, "k_amax");
        ExpectSameFloats(gpu->Download(dev.v_amax), want.v_amax, "v_amax");
      };

      const Tensor qkv_h = RandomBf16Exact({tokens, width}, rng, 2.0f);
      check(
          [&](Tensor& q, LayerKvPool& pool) {
            const Tensor qkv = UploadBf16(*gpu, qkv_h);
            gpu->QkvRopeAppend(qkv, q, &q_norm, &k_norm, 1e-6f, positions, rope, mapping, pool);
          },
          "QkvRopeAppend");
      check(
          [&](Tensor& q, LayerKvPool& pool) {
            const Tensor qkv = UploadBf16(*gpu, qkv_h);
            gpu->QkvRopeAppend(qkv, q, nullptr, nullptr, 1e-6f, positions, rope, mapping, pool);
          },
          "QkvRopeAppend without q/k norm");
      // The decode input side (the norm-fused QKV GEMV with its per-head epilogue for 1-4 rows).
      const Tensor x_h = RandomBf16Exact({tokens, hidden}, rng),
                   res_h = RandomBf16Exact({tokens, hidden}, rng);
      Tensor nw_h = RandomBf16Exact({hidden}, rng, 0.1f);
      for (int64_t i = 0; i < hidden; ++i)
        nw_h.data<float>()[i] = Bf16BitsToFloat(FloatToBf16Bits(1.0f + nw_h.data<float>()[i]));
      const Tensor w = UploadBf16(*gpu, RandomBf16Exact({width, hidden}, rng, 0.1f));
      const Tensor x = UploadBf16(*gpu, x_h), residual = UploadBf16(*gpu, res_h),
                   norm_w = UploadBf16(*gpu, nw_h);
      check(
          [&](Tensor& q, LayerKvPool& pool) {
            Tensor qkv = gpu->Empty({tokens, width}, DType::kBF16);
            Tensor res_out = gpu->Empty({tokens, hidden}, DType::kBF16);
            gpu->AddRmsNormQkvRopeAppend(&x, residual, &res_out, norm_w, 1e-6f, w, qkv, q, &q_norm,
                                         &k_norm, positions, rope, mapping, pool);
          },
          "AddRmsNormQkvRopeAppend");
    }
  }
}

// ---- Attention ----------------------------------------------------------------------------------

namespace {

// One batch: int32 metadata, bf16-exact F32 queries, and a host FP8 pool (stored values
// e4m3(N(0, 1) · 64), unwritten rows NaN) with per-head scales around 1/64.
struct Fp8Problem {
  int hq = 0, hkv = 0, head_dim = 0, max_query_len = 0, max_blocks = 0, max_kv_len = 0;
  int64_t tokens = 0;
  Tensor qstart, lens, tables;
  Tensor q;
  LayerKvPool pool;
};

Fp8Problem MakeFp8Problem(std::mt19937& rng, int hq, int hkv, int head_dim,
                          const std::vector<int>& q_lens,
                          const std::vector<std::vector<int>>& kv_lens, float q_std = 1.0f,
                          int table_width = 0) {
  Fp8Problem pr;
  pr.hq = hq, pr.hkv = hkv, pr.head_dim = head_dim;
  const int S = static_cast<int>(q_lens.size());
  int64_t slots = 5;  // a few slots no table uses
  for (int s = 0; s < S; ++s) {
    pr.tokens += q_lens[s];
    pr.max_query_len = std::max(pr.max_query_len, q_lens[s]);
    for (int h = 0; h < hkv; ++h) {
      pr.max_blocks = std::max(pr.max_blocks, (kv_lens[s][h] + 15) / 16);
      pr.max_kv_len = std::max(pr.max_kv_len, kv_lens[s][h]);
      slots += (kv_lens[s][h] + 15) / 16;
    }
  }
  pr.max_blocks += RandInt(rng, 0, 2);
  if (table_width > 0) pr.max_blocks = table_width;
  std::vector<int32_t> free_slots(static_cast<size_t>(slots));
  std::iota(free_slots.begin(), free_slots.end(), 0);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);
  pr.qstart = Tensor::Empty({S + 1}, DType::kI32);
  pr.lens = Tensor::Empty({S, hkv}, DType::kI32);
  pr.tables = Tensor::Empty({S, hkv, pr.max_blocks}, DType::kI32);
  std::fill_n(pr.tables.data<int32_t>(), pr.tables.numel(), -1);
  Tensor k = Tensor::Empty({slots, kBlockSize, head_dim}, DType::kF8E4M3);
  Tensor v = Tensor::Empty({slots, kBlockSize, head_dim}, DType::kF8E4M3);
  std::fill_n(k.data<uint8_t>(), k.numel(), kNanFp8);
  std::fill_n(v.data<uint8_t>(), v.numel(), kNanFp8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  size_t next = 0;
  int32_t row = 0;
  for (int s = 0; s < S; ++s) {
    pr.qstart.data<int32_t>()[s] = row;
    row += q_lens[s];
    for (int h = 0; h < hkv; ++h) {
      const int len = kv_lens[s][h];
      REQUIRE(len >= q_lens[s]);
      pr.lens.data<int32_t>()[s * hkv + h] = len;
      int32_t* table = pr.tables.data<int32_t>() + (int64_t{s} * hkv + h) * pr.max_blocks;
      for (int b = 0; b < (len + 15) / 16; ++b) table[b] = free_slots[next++];
      for (int t = 0; t < len; ++t) {
        const int64_t base = (int64_t{table[t / 16]} * 16 + t % 16) * head_dim;
        for (int d = 0; d < head_dim; ++d) {
          k.data<uint8_t>()[base + d] = FloatToFp8E4M3(normal(rng) * 64.0f);
          v.data<uint8_t>()[base + d] = FloatToFp8E4M3(normal(rng) * 64.0f);
        }
      }
    }
  }
  pr.qstart.data<int32_t>()[S] = row;
  pr.q = RandomBf16Exact({pr.tokens, hq, head_dim}, rng, q_std);
  pr.pool = HostFp8Pool(std::move(k), std::move(v), RandomScales(rng, hkv, 0.25f / 64, 4.0f / 64),
                        RandomScales(rng, hkv, 0.25f / 64, 4.0f / 64),
                        std::vector<float>(hkv, 0.0f), std::vector<float>(hkv, 0.0f));
  return pr;
}

float ScaleFor(int head_dim) { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

Tensor Reference(const Fp8Problem& pr) {
  CpuBackend cpu;
  Tensor want = Tensor::Empty({pr.tokens, pr.hq, pr.head_dim}, DType::kF32);
  cpu.Attention(pr.q, pr.pool, AttentionMetadata{pr.qstart, pr.lens, pr.tables, pr.max_query_len},
                ScaleFor(pr.head_dim), want);
  return want;
}

// The problem on the device, and the fields every attention kernel's params share.
struct DeviceProblem {
  Tensor q, qstart, lens, tables, out;
  LayerKvPool pool;
  DeviceProblem(CudaBackend& gpu, const Fp8Problem& pr)
      : q(UploadBf16(gpu, pr.q)),
        qstart(gpu.Upload(pr.qstart)),
        lens(gpu.Upload(pr.lens)),
        tables(gpu.Upload(pr.tables)),
        out(PoisonedBf16(gpu, {pr.tokens, pr.hq, pr.head_dim})),
        pool(UploadPool(gpu, pr.pool)) {}
  template <typename Params>
  Params Fill(const Fp8Problem& pr) const {
    Params p;
    p.q = static_cast<const __nv_bfloat16*>(q.raw());
    p.k_pool = p.v_pool = nullptr;
    p.query_start = qstart.data<int32_t>();
    p.kv_lens = lens.data<int32_t>();
    p.block_tables = tables.data<int32_t>();
    p.out = static_cast<__nv_bfloat16*>(out.raw());
    p.tokens = pr.tokens;
    p.num_seqs = static_cast<int>(pr.qstart.numel() - 1);
    p.num_q_heads = pr.hq;
    p.num_kv_heads = pr.hkv;
    p.head_dim = pr.head_dim;
    p.max_blocks = pr.max_blocks;
    p.scale = ScaleFor(pr.head_dim);
    p.kv_dtype = kernels::KvDtype::kFp8E4M3;
    p.k_pool_fp8 = static_cast<const uint8_t*>(pool.k.raw());
    p.v_pool_fp8 = static_cast<const uint8_t*>(pool.v.raw());
    p.k_scale = pool.k_scale.data<float>();
    p.v_scale = pool.v_scale.data<float>();
    return p;
  }
};

constexpr double kAtol = 1e-2, kRtol = 2e-2;

// The decode kernel with `num_splits` (0: its choice) and a max_kv_len hint (0: none).
Tensor RunDecode(CudaBackend& gpu, const Fp8Problem& pr, int num_splits, int max_kv_len,
                 int* splits_used = nullptr) {
  DeviceProblem dp(gpu, pr);
  auto p = dp.Fill<kernels::DecodeAttentionParams>(pr);
  p.max_query_len = pr.max_query_len;
  p.num_splits = num_splits;
  p.max_kv_len = max_kv_len;
  const size_t bytes = kernels::DecodeAttentionWorkspaceBytes(p);
  const int splits = kernels::DecodeAttentionNumSplits(p);
  CHECK((splits == 1) == (bytes == 0));
  if (splits_used) *splits_used = splits;
  Tensor workspace = gpu.Empty({static_cast<int64_t>(std::max<size_t>(bytes, 16))}, DType::kU8);
  if (bytes > 0)
    REQUIRE(kernels::LaunchDecodeAttention(p, workspace.raw(), bytes - 1, gpu.stream()) ==
            cudaErrorInvalidValue);
  REQUIRE(kernels::LaunchDecodeAttention(p, bytes ? workspace.raw() : nullptr, bytes,
                                         gpu.stream()) == cudaSuccess);
  return DownloadF32(gpu, dp.out);
}

Tensor RunPrefill(CudaBackend& gpu, const Fp8Problem& pr, kernels::PrefillTileConfig tile) {
  DeviceProblem dp(gpu, pr);
  auto p = dp.Fill<kernels::PrefillAttentionParams>(pr);
  p.max_query_len = pr.max_query_len;
  p.tile = tile;
  REQUIRE(kernels::LaunchPrefillAttention(p, gpu.stream()) == cudaSuccess);
  return DownloadF32(gpu, dp.out);
}

Tensor RunReference(CudaBackend& gpu, const Fp8Problem& pr) {
  DeviceProblem dp(gpu, pr);
  auto p = dp.Fill<kernels::PagedAttentionParams>(pr);
  REQUIRE(kernels::LaunchPagedAttention(p, gpu.stream()) == cudaSuccess);
  return DownloadF32(gpu, dp.out);
}

Tensor RunBackend(CudaBackend& gpu, const Fp8Problem& pr) {
  DeviceProblem dp(gpu, pr);
  AttentionMetadata meta{dp.qstart, dp.lens, dp.tables, pr.max_query_len, pr.max_kv_len};
  gpu.Attention(dp.q, dp.pool, meta, ScaleFor(pr.head_dim), dp.out);
  return DownloadF32(gpu, dp.out);
}

// Per-head lengths: dense (the same for every head) or sparse (each head its own).
std::vector<std::vector<int>> Lens(std::mt19937& rng, const std::vector<int>& q_lens, int hkv,
                                   int max_len, bool sparse) {
  std::vector<std::vector<int>> lens;
  for (int q : q_lens) {
    const int pick = RandInt(rng, 0, 3);
    const int dense = pick == 0   ? q
                      : pick == 1 ? 16 * RandInt(rng, 1, max_len / 16)
                                  : RandInt(rng, q, max_len);
    std::vector<int> row;
    for (int h = 0; h < hkv; ++h) row.push_back(sparse ? RandInt(rng, q, max_len) : dense);
    lens.push_back(row);
  }
  return lens;
}

}  // namespace

TEST_CASE(
    "FP8 decode attention matches the CPU: GQA groups 1/4/8, head_dim 64/128/256, 1-8 query "
    "tokens, sparse heads, "
    "split counts",
    "[gpu][fp8][attention]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  for (auto [hq, hkv] : {std::pair{8, 8}, std::pair{32, 8}, std::pair{16, 2}}) {
    for (int head_dim : {64, 128, 256}) {
      for (int max_q : {1, 4, 8}) {
        const int batch = RandInt(rng, 1, 4);
        std::vector<int> q_lens;
        for (int s = 0; s < batch; ++s) q_lens.push_back(RandInt(rng, 1, max_q));
        q_lens[0] = max_q;
        const bool sparse = RandInt(rng, 0, 1) == 1;
        const Fp8Problem pr =
            MakeFp8Problem(rng, hq, hkv, head_dim, q_lens, Lens(rng, q_lens, hkv, 2000, sparse));
        const Tensor want = Reference(pr);
        for (int forced : {0, 1, 3, 7}) {
          int splits = 0;
          const Tensor got = RunDecode(*gpu, pr, forced, 0, &splits);
          INFO("hq " << hq << " hkv " << hkv << " head_dim " << head_dim << " max_q " << max_q
                     << " batch " << batch << " sparse " << sparse << " forced " << forced
                     << " -> splits " << splits);
          ExpectClose(got, want, kAtol, kRtol);
        }
      }
    }
  }
}

TEST_CASE(
    "FP8 decode attention: per-head extremes, a CUDA-graph bound, large score spreads and long "
    "groups",
    "[gpu][fp8][attention]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  for (int head_dim : {64, 128, 256}) {
    // One sequence with extreme per-head differences (minimal, block edges, the sparse working
    // set).
    const std::vector<int> q_lens = {2, 1, 3};
    std::vector<std::vector<int>> lens = {{2, 16, 17, 2064, 33, 4097, 17, 1000}, {}, {}};
    for (int s = 1; s < 3; ++s)
      for (int h = 0; h < 8; ++h) lens[s].push_back(RandInt(rng, q_lens[s], 1500));
    for (float q_std : {1.0f, 4.0f}) {
      const Fp8Problem pr = MakeFp8Problem(rng, 32, 8, head_dim, q_lens, lens, q_std);
      const Tensor want = Reference(pr);
      for (auto [forced, hint] : {std::pair{0, 0}, std::pair{2, 0}, std::pair{64, 0},
                                  std::pair{0, 100}, std::pair{0, 5000}}) {
        int splits = 0;
        const Tensor got = RunDecode(*gpu, pr, forced, hint, &splits);
        INFO("head_dim " << head_dim << " q_std " << q_std << " forced " << forced << " hint "
                         << hint << " -> splits " << splits);
        ExpectClose(got, want, kAtol, kRtol);
      }
    }
  }
  // Short contexts under a 16K-token bound with 1024-entry tables: most split CTAs empty; one long
  // sequence takes the merge path.
  for (int batch : {1, 5}) {
    std::vector<int> q_lens, ctx;
    for (int s = 0; s < batch; ++s)
      q_lens.push_back(RandInt(rng, 1, 2)), ctx.push_back(RandInt(rng, 2, 600));
    if (batch == 1) ctx[0] = 1999;
    std::vector<std::vector<int>> lens;
    for (int c : ctx) lens.emplace_back(8, c);
    const Fp8Problem pr = MakeFp8Problem(rng, 32, 8, 128, q_lens, lens, 1.0f, 1024);
    const Tensor want = Reference(pr);
    int splits = 0;
    const Tensor got = RunDecode(*gpu, pr, 0, 16384, &splits);
    INFO("graph bound, batch " << batch << " splits " << splits);
    if (batch == 1) CHECK(splits > 1);
    ExpectClose(got, want, kAtol, kRtol);
  }
  // Groups of more than 16 query rows (several row chunks) and q_len up to the kernel's limit.
  for (auto [hq, hkv, q_len, head_dim] : {std::tuple{16, 1, 4, 128}, std::tuple{8, 2, 9, 64},
                                          std::tuple{4, 1, 16, 128}, std::tuple{8, 1, 8, 256}}) {
    const Fp8Problem pr = MakeFp8Problem(
        rng, hq, hkv, head_dim, {q_len, 1, q_len},
        {std::vector<int>(hkv, 1500), std::vector<int>(hkv, 40), std::vector<int>(hkv, q_len)});
    const Tensor want = Reference(pr);
    const Tensor got = RunDecode(*gpu, pr, 0, 0);
    INFO("hq " << hq << " hkv " << hkv << " q_len " << q_len << " head_dim " << head_dim);
    ExpectClose(got, want, kAtol, kRtol);
  }
}

TEST_CASE(
    "FP8 prefill attention (mma.sync kernel, every tile shape) matches the CPU on long query "
    "chunks",
    "[gpu][fp8][attention]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  using kernels::PrefillTileConfig;
  for (auto [hq, hkv] : {std::pair{8, 2}, std::pair{4, 4}, std::pair{16, 2}}) {
    for (int head_dim : {64, 128}) {
      // Chunks of 1..200 query tokens after cached contexts of 0..300 tokens; per-head lengths
      // differ in one sequence (its queries are the last q_len of each head's keys).
      std::vector<int> q_lens = {RandInt(rng, 100, 200), RandInt(rng, 1, 70),
                                 RandInt(rng, 129, 160)};
      std::vector<std::vector<int>> lens;
      for (size_t s = 0; s < q_lens.size(); ++s) {
        std::vector<int> row;
        const int ctx = RandInt(rng, 0, 300);
        for (int h = 0; h < hkv; ++h)
          row.push_back(q_lens[s] + (s == 2 ? RandInt(rng, 0, 300) : ctx));
        lens.push_back(row);
      }
      for (float q_std : {1.0f, 3.0f}) {
        const Fp8Problem pr = MakeFp8Problem(rng, hq, hkv, head_dim, q_lens, lens, q_std);
        const Tensor want = Reference(pr);
        for (PrefillTileConfig tile : {PrefillTileConfig::kAuto, PrefillTileConfig::kM128W4,
                                       PrefillTileConfig::kM128W8, PrefillTileConfig::kM64W4}) {
          const Tensor got = RunPrefill(*gpu, pr, tile);
          INFO("hq " << hq << " hkv " << hkv << " head_dim " << head_dim << " q_std " << q_std
                     << " tile " << static_cast<int>(tile));
          ExpectClose(got, want, kAtol, kRtol);
        }
      }
    }
  }
}

namespace {

// ‖got − want‖ ≤ rtol·‖want‖ + 1e-3 over every output row (head_dim values): the element
// tolerance is loose on long rows of small values, where a wrong fragment, descriptor or swizzle
// would still be O(1) in relative norm.
void ExpectRowsClose(const Tensor& got, const Tensor& want, int head_dim, double rtol) {
  REQUIRE(got.numel() == want.numel());
  double worst = 0;
  int64_t worst_row = -1;
  for (int64_t r = 0; r < got.numel() / head_dim; ++r) {
    double diff = 0, norm = 0;
    for (int d = 0; d < head_dim; ++d) {
      const double g = got.data<float>()[r * head_dim + d],
                   w = want.data<float>()[r * head_dim + d];
      diff += (g - w) * (g - w);
      norm += w * w;
    }
    const double excess =
        std::isfinite(diff) ? std::sqrt(diff) - (rtol * std::sqrt(norm) + 1e-3) : INFINITY;
    if (excess > worst) worst = excess, worst_row = r;
  }
  INFO("worst row (token * num_q_heads + head) " << worst_row << ": |got - want| exceeds " << rtol
                                                 << " |want| + 1e-3 by " << worst);
  CHECK(worst_row == -1);
}

// One problem through both wgmma tiles against the CPU (element and row tolerances).
void CheckSm90Prefill(CudaBackend& gpu, const Fp8Problem& pr) {
  const Tensor want = Reference(pr);
  for (kernels::PrefillTileConfig tile :
       {kernels::PrefillTileConfig::kSm90, kernels::PrefillTileConfig::kSm90S2}) {
    const Tensor got = RunPrefill(gpu, pr, tile);
    INFO("tile " << (tile == kernels::PrefillTileConfig::kSm90 ? "kSm90" : "kSm90S2"));
    ExpectClose(got, want, kAtol, kRtol);
    ExpectRowsClose(got, want, pr.head_dim, 2e-2);
  }
}

}  // namespace

TEST_CASE(
    "FP8 prefill attention on the sm_90a wgmma kernel (explicit kSm90 / kSm90S2) matches the CPU: "
    "GQA groups 1/4/8, head_dim 64/128, chunks over long cached contexts, per-head lengths",
    "[gpu][fp8][attention]") {
  auto gpu = MakeBackend();
  if (!kernels::PrefillAttentionSm90Available()) {
    WARN("not a compute capability 9.0 device: the wgmma kernel does not run here");
    return;
  }
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (auto [hq, hkv] : {std::pair{8, 8}, std::pair{16, 4}, std::pair{16, 2}}) {
    for (int head_dim : {64, 128}) {
      // A chunk of 129..240 rows (two query tiles) after 300..2000 cached tokens (the K/V rings
      // wrap many times), a short chunk (one consumer warpgroup has no real row), a chunk of
      // 64..128 rows over a shorter context, and one whose heads have their own lengths (its
      // queries are the last q_len of each head's keys). (The CPU reference is the slow part.)
      const std::vector<int> q_lens = {RandInt(rng, 129, 240), RandInt(rng, 1, 64),
                                       RandInt(rng, 64, 128), RandInt(rng, 100, 200)};
      std::vector<std::vector<int>> lens;
      const int ctx[3] = {RandInt(rng, 300, 2000), RandInt(rng, 0, 700), RandInt(rng, 0, 400)};
      for (size_t s = 0; s < q_lens.size(); ++s) {
        std::vector<int> row;
        for (int h = 0; h < hkv; ++h)
          row.push_back(q_lens[s] + (s == 3 ? RandInt(rng, 0, 1200) : ctx[s]));
        lens.push_back(row);
      }
      const float q_std = RandInt(rng, 0, 1) == 1 ? 3.0f : 1.0f;
      INFO("hq " << hq << " hkv " << hkv << " head_dim " << head_dim << " q_std " << q_std
                 << " q_lens " << q_lens[0] << "," << q_lens[1] << "," << q_lens[2] << ","
                 << q_lens[3] << " ctx " << ctx[0] << "," << ctx[1] << "," << ctx[2]);
      CheckSm90Prefill(*gpu, MakeFp8Problem(rng, hq, hkv, head_dim, q_lens, lens, q_std));
    }
  }
}

TEST_CASE(
    "FP8 prefill attention on the sm_90a wgmma kernel: causal edges, fresh prompts and wide "
    "tables",
    "[gpu][fp8][attention]") {
  auto gpu = MakeBackend();
  if (!kernels::PrefillAttentionSm90Available()) {
    WARN("not a compute capability 9.0 device: the wgmma kernel does not run here");
    return;
  }
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int head_dim : {64, 128}) {
    // Context offsets around the 128-key tile and the 64-row warpgroup split, with 1, 64, 65 or
    // 129 new rows: a fully masked tile for the first warpgroup, the diagonal across two KV tiles,
    // a second warpgroup with no real row; and fresh prompts (kv_len == q_len) around 128.
    std::vector<int> q_lens;
    std::vector<std::vector<int>> lens;
    for (int ctx : {1, 63, 64, 65, 127, 128, 200}) {
      const int q = std::array<int, 4>{1, 64, 65, 129}[RandInt(rng, 0, 3)];
      q_lens.push_back(q);
      lens.emplace_back(4, q + ctx);
    }
    for (int q : {127, 128, 129, 255, 256, 257}) {
      q_lens.push_back(q);
      lens.emplace_back(4, q);
    }
    INFO("head_dim " << head_dim);
    CheckSm90Prefill(*gpu, MakeFp8Problem(rng, 16, 4, head_dim, q_lens, lens, 1.0f));
    // Long peaky prompts through 1024-entry tables (unused entries -1).
    const int q = RandInt(rng, 200, 280);
    CheckSm90Prefill(*gpu, MakeFp8Problem(rng, 8, 1, head_dim, {q, 17},
                                          {{q + RandInt(rng, 1500, 2500)}, {17 + 3}}, 4.0f, 1024));
  }
}

TEST_CASE("FP8 reference attention kernel matches the CPU (head_dim 64, 96, 128, 256)",
          "[gpu][fp8][attention]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  for (int head_dim : {64, 96, 128, 256}) {
    const std::vector<int> q_lens = {1, RandInt(rng, 2, 40), 5};
    const Fp8Problem pr =
        MakeFp8Problem(rng, 8, 2, head_dim, q_lens, Lens(rng, q_lens, 2, 900, true));
    const Tensor want = Reference(pr);
    INFO("head_dim " << head_dim);
    ExpectClose(RunReference(*gpu, pr), want, kAtol, kRtol);
  }
}

TEST_CASE("CudaBackend::Attention over an FP8 pool picks kernels that match the CPU",
          "[gpu][fp8][attention]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  // Decode (<= 8 query tokens), prefill (longer chunks), head_dim 256 beyond the decode kernel's
  // 16 query tokens (the reference kernel), head_dim 96 (the reference kernel).
  for (auto [head_dim, max_q] :
       {std::pair{128, 4}, std::pair{64, 8}, std::pair{128, 100}, std::pair{64, 65},
        std::pair{256, 12}, std::pair{256, 20}, std::pair{96, 3}}) {
    std::vector<int> q_lens = {max_q, RandInt(rng, 1, max_q)};
    const Fp8Problem pr =
        MakeFp8Problem(rng, 16, 4, head_dim, q_lens, Lens(rng, q_lens, 4, 1200, true));
    const Tensor want = Reference(pr);
    INFO("head_dim " << head_dim << " max_query_len " << max_q);
    ExpectClose(RunBackend(*gpu, pr), want, kAtol, kRtol);
  }
}

TEST_CASE("FP8 attention launches without their pools or scales are refused",
          "[gpu][fp8][attention]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  const Fp8Problem pr = MakeFp8Problem(rng, 8, 2, 128, {1, 2}, {{40, 40}, {17, 17}});
  DeviceProblem dp(*gpu, pr);
  auto d = dp.Fill<kernels::DecodeAttentionParams>(pr);
  d.max_query_len = pr.max_query_len;
  d.num_splits = 1;
  auto d2 = d;
  d2.k_scale = nullptr;
  CHECK(kernels::LaunchDecodeAttention(d2, nullptr, 0, gpu->stream()) == cudaErrorInvalidValue);
  d2 = d, d2.v_pool_fp8 = nullptr;
  CHECK(kernels::LaunchDecodeAttention(d2, nullptr, 0, gpu->stream()) == cudaErrorInvalidValue);
  d2 = d, d2.k_pool_fp8 += 8;  // not 16-byte aligned
  CHECK(kernels::LaunchDecodeAttention(d2, nullptr, 0, gpu->stream()) == cudaErrorInvalidValue);
  auto f = dp.Fill<kernels::PrefillAttentionParams>(pr);
  auto f2 = f;
  f2.v_scale = nullptr;
  CHECK(kernels::LaunchPrefillAttention(f2, gpu->stream()) == cudaErrorInvalidValue);
  f2 = f, f2.k_pool_fp8 = nullptr, f2.tile = kernels::PrefillTileConfig::kSm90;
  CHECK(kernels::LaunchPrefillAttention(f2, gpu->stream()) == cudaErrorInvalidValue);
  if (!kernels::PrefillAttentionSm90Available()) {  // the wgmma kernel runs on CC 9.0 only
    f2 = f, f2.tile = kernels::PrefillTileConfig::kSm90S2;
    CHECK(kernels::LaunchPrefillAttention(f2, gpu->stream()) == cudaErrorInvalidValue);
  }
  auto r = dp.Fill<kernels::PagedAttentionParams>(pr);
  r.k_scale = nullptr;
  CHECK(kernels::LaunchPagedAttention(r, gpu->stream()) == cudaErrorInvalidValue);
  CHECK(cudaStreamSynchronize(gpu->stream()) == cudaSuccess);
}

// ---- Summaries and copies
// -------------------------------------------------------------------------

TEST_CASE(
    "FP8 BlockSummaries are the stored values' min/max, exactly the CPU's (device and host pools)",
    "[gpu][fp8][sparse]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  for (int d : {64, 128, 256}) {
    const int64_t slots = 40, rows = 50, n = 30;
    const Tensor k = RandomFp8({slots, kBlockSize, d}, rng),
                 v = RandomFp8({slots, kBlockSize, d}, rng);
    std::vector<int32_t> src(n), cnt(n), dst(n), perm(rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < n; ++i) {
      src[i] = RandInt(rng, 0, slots - 1);
      cnt[i] = RandInt(rng, -1, kBlockSize);
      dst[i] = i % 7 == 3 ? -1 : perm[i];
    }
    Tensor kmin = Tensor::Zeros({rows, d}, DType::kF32),
           kmax = Tensor::Zeros({rows, d}, DType::kF32);
    cpu.BlockSummaries(KvOnly(k, v), Ints({n}, src), Ints({n}, cnt), Ints({n}, dst), kmin, kmax);
    LayerKvPool hpool = KvOnly(gpu->EmptyHost({slots, kBlockSize, d}, DType::kF8E4M3),
                               gpu->EmptyHost({slots, kBlockSize, d}, DType::kF8E4M3));
    std::memcpy(hpool.k.raw(), k.raw(), k.nbytes());
    std::memcpy(hpool.v.raw(), v.raw(), v.nbytes());
    for (bool host : {false, true}) {
      INFO("head_dim " << d << (host ? " host pool" : " device pool"));
      const LayerKvPool pool = host ? hpool : KvOnly(gpu->Upload(k), gpu->Upload(v));
      Tensor gmin = UploadBf16(*gpu, Tensor::Zeros({rows, d}, DType::kF32)),
             gmax = UploadBf16(*gpu, Tensor::Zeros({rows, d}, DType::kF32));
      gpu->BlockSummaries(pool, gpu->Upload(Ints({n}, src)), gpu->Upload(Ints({n}, cnt)),
                          gpu->Upload(Ints({n}, dst)), gmin, gmax);
      ExpectClose(DownloadF32(*gpu, gmin), kmin, 0, 0);
      ExpectClose(DownloadF32(*gpu, gmax), kmax, 0, 0);
    }
  }
}

TEST_CASE(
    "FP8 CopyBlocks and CopyTokens move the CPU's bytes (device <-> mapped host, both gather "
    "kernels)",
    "[gpu][fp8][sparse]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  for (int d : {64, 128, 256}) {
    const int64_t src_slots = 30, dst_slots = 40, n = 25;
    std::vector<int32_t> from(n), to(n), perm(dst_slots);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < n; ++i) {
      from[i] = i % 9 == 4 ? -1 : RandInt(rng, 0, src_slots - 1);
      to[i] = i % 11 == 6 ? -1 : perm[i];
    }
    const Tensor sk = RandomFp8({src_slots, kBlockSize, d}, rng, Bytes::kAny),
                 sv = RandomFp8({src_slots, kBlockSize, d}, rng, Bytes::kAny);
    const Tensor dk = RandomFp8({dst_slots, kBlockSize, d}, rng, Bytes::kAny),
                 dv = RandomFp8({dst_slots, kBlockSize, d}, rng, Bytes::kAny);
    LayerKvPool want = KvOnly(dk.Clone(), dv.Clone());
    cpu.CopyBlocks(KvOnly(sk, sv), Ints({n}, from), want, Ints({n}, to));
    // Token rows: the first n of a shuffled order, some skipped.
    std::vector<int64_t> trow_from(n), trow_to(n), tperm(dst_slots * kBlockSize);
    std::iota(tperm.begin(), tperm.end(), 0);
    std::shuffle(tperm.begin(), tperm.end(), rng);
    for (int64_t i = 0; i < n; ++i) {
      trow_from[i] = i % 6 == 1 ? -1 : RandInt(rng, 0, src_slots * kBlockSize - 1);
      trow_to[i] = tperm[i];
    }
    LayerKvPool want_tok = KvOnly(dk.Clone(), dv.Clone());
    cpu.CopyTokens(KvOnly(sk, sv), Int64s({n}, trow_from), want_tok, Int64s({n}, trow_to));

    auto host_pool = [&](const Tensor& k, const Tensor& v) {
      LayerKvPool p = KvOnly(gpu->EmptyHost(k.shape(), DType::kF8E4M3),
                             gpu->EmptyHost(v.shape(), DType::kF8E4M3));
      std::memcpy(p.k.raw(), k.raw(), k.nbytes());
      std::memcpy(p.v.raw(), v.raw(), v.nbytes());
      return p;
    };
    auto fetch = [&](const LayerKvPool& p) {
      REQUIRE(cudaStreamSynchronize(gpu->stream()) == cudaSuccess);
      if (p.k.device() == Device::kCpu) return std::pair{p.k.Clone(), p.v.Clone()};
      return std::pair{gpu->Download(p.k), gpu->Download(p.v)};
    };
    for (int dir = 0; dir < 3;
         ++dir) {  // device -> device, host -> device (gather), device -> host
      const char* names[] = {"device -> device", "host -> device", "device -> host"};
      INFO("head_dim " << d << " " << names[dir]);
      auto make_src = [&] {
        return dir == 1 ? host_pool(sk, sv) : KvOnly(gpu->Upload(sk), gpu->Upload(sv));
      };
      auto make_dst = [&] {
        return dir == 2 ? host_pool(dk, dv) : KvOnly(gpu->Upload(dk), gpu->Upload(dv));
      };
      {  // through the backend (its configured gather kernel)
        LayerKvPool src = make_src(), dst = make_dst();
        gpu->CopyBlocks(src, gpu->Upload(Ints({n}, from)), dst, gpu->Upload(Ints({n}, to)));
        auto [gk, gv] = fetch(dst);
        ExpectSameBytes(gk, want.k, "CopyBlocks K");
        ExpectSameBytes(gv, want.v, "CopyBlocks V");
      }
      for (kernels::GatherKernel kernel :
           {kernels::GatherKernel::kTma, kernels::GatherKernel::kRegisters}) {
        INFO("gather kernel " << static_cast<int>(kernel));
        LayerKvPool src = make_src(), dst = make_dst();
        const Tensor f = gpu->Upload(Ints({n}, from)), t = gpu->Upload(Ints({n}, to));
        REQUIRE(kernels::LaunchCopyBlockBytes(src.k.raw(), src.v.raw(), f.data<int32_t>(),
                                              dst.k.raw(), dst.v.raw(), t.data<int32_t>(), n, d, 8,
                                              gpu->stream(), kernel) == cudaSuccess);
        auto [gk, gv] = fetch(dst);
        ExpectSameBytes(gk, want.k, "LaunchCopyBlockBytes K");
        ExpectSameBytes(gv, want.v, "LaunchCopyBlockBytes V");
      }
      {
        LayerKvPool src = make_src(), dst = make_dst();
        gpu->CopyTokens(src, gpu->Upload(Int64s({n}, trow_from)), dst,
                        gpu->Upload(Int64s({n}, trow_to)));
        auto [gk, gv] = fetch(dst);
        ExpectSameBytes(gk, want_tok.k, "CopyTokens K");
        ExpectSameBytes(gv, want_tok.v, "CopyTokens V");
      }
    }
  }
}

// ---- e4m3 summaries and scoring over them --------------------------------------------------

namespace {

// A fresh seed per test case; callers INFO it, so that a failure prints it.
uint32_t FreshSeed() { return std::random_device{}(); }

void ExpectSameInts(const Tensor& got, const Tensor& want, const char* what) {
  REQUIRE(got.numel() == want.numel());
  int64_t first = -1, count = 0;
  for (int64_t i = 0; i < got.numel(); ++i)
    if (got.data<int32_t>()[i] != want.data<int32_t>()[i] && count++ == 0) first = i;
  INFO(what << ": " << count << " differences; first at " << first << ": got "
            << (first >= 0 ? got.data<int32_t>()[first] : 0) << " want "
            << (first >= 0 ? want.data<int32_t>()[first] : 0));
  CHECK(count == 0);
}

// Runs `fn` in a forked child and expects it to fail an OASIS_CHECK (abort) with `text` in its
// message. The child only checks arguments: it makes no CUDA call before the check fails.
void ExpectCheckFails(const std::function<void()>& fn, const std::string& text) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    std::signal(SIGABRT, SIG_DFL);  // not Catch's handler: no report from the child
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    fn();
    _exit(0);  // no check failed
  }
  close(fds[1]);
  std::string message;
  char buf[512];
  for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) > 0;) message.append(buf, got);
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  INFO("expected a failed check naming \"" << text << "\"; the child's stderr: " << message);
  CHECK(WIFSIGNALED(status));
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT));
  CHECK(message.find(text) != std::string::npos);
}

}  // namespace

TEST_CASE(
    "FP8 BlockSummaries into e4m3 summaries are the CPU's bytes (device and host pools, partial "
    "blocks, ties of +0 and -0)",
    "[gpu][fp8][sparse]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  const uint32_t seed = FreshSeed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int d : {32, 64, 96, 128, 256}) {
    const int64_t slots = 48, rows = 64, n = 44;
    Tensor k = RandomFp8({slots, kBlockSize, d}, rng), v = RandomFp8({slots, kBlockSize, d}, rng);
    // Slots 0-7: a few values (many ties, +0 against -0, subnormals); 8-11: non-negative values
    // with both zeros (the min is +0 or -0: whichever token came first); 12-13: any bytes (NaN).
    const uint8_t few[] = {0x00, 0x80, 0x01, 0x81, 0x08, 0x88, 0x38, 0xb8};
    const uint8_t zeros[] = {0x00, 0x80, 0x00, 0x80, 0x01, 0x30};
    uint8_t* kb = k.data<uint8_t>();
    const int64_t per_slot = int64_t{kBlockSize} * d;
    for (int64_t i = 0; i < 8 * per_slot; ++i) kb[i] = few[RandInt(rng, 0, 7)];
    for (int64_t i = 8 * per_slot; i < 12 * per_slot; ++i) kb[i] = zeros[RandInt(rng, 0, 5)];
    for (int64_t i = 12 * per_slot; i < 14 * per_slot; ++i)
      kb[i] = static_cast<uint8_t>(RandInt(rng, 0, 255));
    std::vector<int32_t> src(n), cnt(n), dst(n), perm(rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < n; ++i) {
      src[i] = i < 14 ? static_cast<int32_t>(i) : RandInt(rng, 0, slots - 1);
      cnt[i] = i % 5 == 0 ? kBlockSize : RandInt(rng, -1, kBlockSize);  // partial blocks
      dst[i] = i % 7 == 3 ? -1 : perm[i];
    }
    cnt[1] = 1, cnt[2] = 0, dst[1] = perm[1], dst[2] = perm[2];  // one token; none (row unchanged)
    // Rows no entry writes keep their bytes.
    const Tensor init_min = RandomFp8({rows, d}, rng, Bytes::kAny),
                 init_max = RandomFp8({rows, d}, rng, Bytes::kAny);
    Tensor want_min = init_min.Clone(), want_max = init_max.Clone();
    cpu.BlockSummaries(KvOnly(k, v), Ints({n}, src), Ints({n}, cnt), Ints({n}, dst), want_min,
                       want_max);
    LayerKvPool hpool = KvOnly(gpu->EmptyHost({slots, kBlockSize, d}, DType::kF8E4M3),
                               gpu->EmptyHost({slots, kBlockSize, d}, DType::kF8E4M3));
    std::memcpy(hpool.k.raw(), k.raw(), k.nbytes());
    std::memcpy(hpool.v.raw(), v.raw(), v.nbytes());
    for (bool host : {false, true}) {
      INFO("head_dim " << d << (host ? " mapped host pool" : " device pool"));
      const LayerKvPool pool = host ? hpool : KvOnly(gpu->Upload(k), gpu->Upload(v));
      Tensor gmin = gpu->Upload(init_min), gmax = gpu->Upload(init_max);
      REQUIRE(gmin.dtype() == DType::kF8E4M3);
      gpu->BlockSummaries(pool, gpu->Upload(Ints({n}, src)), gpu->Upload(Ints({n}, cnt)),
                          gpu->Upload(Ints({n}, dst)), gmin, gmax);
      const Tensor got_min = gpu->Download(gmin), got_max = gpu->Download(gmax);
      // Bit for bit (+0 and -0 differ); NaN bytes (the any-bytes slots) pair with NaN bytes.
      ExpectSameBytes(got_min, want_min, "kmin");
      ExpectSameBytes(got_max, want_max, "kmax");
    }
    // The bf16 summaries of the same pool are those bytes' values.
    Tensor bmin = UploadBf16(*gpu, Tensor::Zeros({rows, d}, DType::kF32)),
           bmax = UploadBf16(*gpu, Tensor::Zeros({rows, d}, DType::kF32));
    Tensor fmin = Tensor::Zeros({rows, d}, DType::kF32),
           fmax = Tensor::Zeros({rows, d}, DType::kF32);
    cpu.BlockSummaries(KvOnly(k, v), Ints({n}, src), Ints({n}, cnt), Ints({n}, dst), fmin, fmax);
    gpu->BlockSummaries(KvOnly(gpu->Upload(k), gpu->Upload(v)), gpu->Upload(Ints({n}, src)),
                        gpu->Upload(Ints({n}, cnt)), gpu->Upload(Ints({n}, dst)), bmin, bmax);
    const Tensor gfmin = DownloadF32(*gpu, bmin), gfmax = DownloadF32(*gpu, bmax);
    for (int64_t i = 0; i < rows * d; ++i) {  // NaN == NaN here (the any-bytes slots)
      const float a = gfmin.data<float>()[i], b = fmin.data<float>()[i];
      const float c = gfmax.data<float>()[i], e = fmax.data<float>()[i];
      if (!((a == b || (std::isnan(a) && std::isnan(b))) &&
            (c == e || (std::isnan(c) && std::isnan(e))))) {
        INFO("bf16 summaries of the FP8 pool, head_dim " << d << " element " << i << ": min " << a
                                                         << " vs " << b << ", max " << c << " vs "
                                                         << e);
        CHECK(false);
        break;
      }
    }
  }
}

TEST_CASE("Summary dtypes that do not fit are refused (BlockSummaries, ScoreBlocks, the launcher)",
          "[gpu][fp8][sparse]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  const int d = 64, slots = 4, rows = 8;
  const Tensor idx = gpu->Upload(Ints({2}, {0, 1})), cnt = gpu->Upload(Ints({2}, {16, 3}));
  const LayerKvPool fp8 = KvOnly(gpu->Upload(RandomFp8({slots, kBlockSize, d}, rng)),
                                 gpu->Upload(RandomFp8({slots, kBlockSize, d}, rng)));
  const LayerKvPool bf = KvOnly(UploadBf16(*gpu, RandomBf16Exact({slots, kBlockSize, d}, rng)),
                                UploadBf16(*gpu, RandomBf16Exact({slots, kBlockSize, d}, rng)));
  Tensor smin8 = gpu->Upload(RandomFp8({rows, d}, rng)),
         smax8 = gpu->Upload(RandomFp8({rows, d}, rng));
  Tensor smin16 = UploadBf16(*gpu, RandomBf16Exact({rows, d}, rng)),
         smax16 = UploadBf16(*gpu, RandomBf16Exact({rows, d}, rng));
  Tensor smin32 = gpu->Upload(RandomBf16Exact({rows, d}, rng)),
         smax32 = gpu->Upload(RandomBf16Exact({rows, d}, rng));
  ExpectCheckFails([&] { gpu->BlockSummaries(bf, idx, cnt, idx, smin8, smax8); },
                   "F8_E4M3 summaries are for FP8 pools only");
  ExpectCheckFails([&] { gpu->BlockSummaries(fp8, idx, cnt, idx, smin8, smax16); },
                   "BlockSummaries kmax (the dtype of kmin)");
  ExpectCheckFails([&] { gpu->BlockSummaries(fp8, idx, cnt, idx, smin16, smax8); },
                   "BlockSummaries kmax (the dtype of kmin)");
  ExpectCheckFails([&] { gpu->BlockSummaries(fp8, idx, cnt, idx, smin32, smax32); },
                   "BlockSummaries kmin");

  const int hq = 4, hkv = 2, R = 2, mb = 5;
  const Tensor q = UploadBf16(*gpu, RandomBf16Exact({3, hq, d}, rng));
  const Tensor qr = gpu->Upload(Ints({R}, {0, 2})), nb = gpu->Upload(Ints({R}, {mb, 2}));
  const Tensor tb = gpu->Upload(Ints({R, hkv, mb}, std::vector<int32_t>(R * hkv * mb, 3)));
  Tensor scores = gpu->Upload(Tensor::Zeros({R, hkv, mb}, DType::kF32));
  ExpectCheckFails(
      [&] { gpu->ScoreBlocks(q, qr, nb, tb, smin8, smax16, GroupReduce::kSum, scores); },
      "ScoreBlocks kmax (the dtype of kmin)");
  ExpectCheckFails(
      [&] { gpu->ScoreBlocks(q, qr, nb, tb, smin16, smax8, GroupReduce::kSum, scores); },
      "ScoreBlocks kmax (the dtype of kmin)");
  ExpectCheckFails(
      [&] { gpu->ScoreBlocks(q, qr, nb, tb, smin32, smax32, GroupReduce::kSum, scores); },
      "expected BF16 or F8_E4M3 summaries");

  // The launcher: exactly one pair of summaries, 16-byte aligned.
  kernels::ScoreBlocksParams p;
  p.q = static_cast<const __nv_bfloat16*>(q.raw());
  p.query_rows = qr.data<int32_t>();
  p.num_blocks = nb.data<int32_t>();
  p.host_tables = tb.data<int32_t>();
  p.scores = scores.data<float>();
  p.rows = R, p.num_q_heads = hq, p.num_kv_heads = hkv, p.head_dim = d, p.max_blocks = mb;
  const auto* b16min = static_cast<const __nv_bfloat16*>(smin16.raw());
  const auto* b16max = static_cast<const __nv_bfloat16*>(smax16.raw());
  const auto* f8min = static_cast<const uint8_t*>(smin8.raw());
  const auto* f8max = static_cast<const uint8_t*>(smax8.raw());
  auto launch = [&](const __nv_bfloat16* a, const __nv_bfloat16* b, const uint8_t* c,
                    const uint8_t* e) {
    kernels::ScoreBlocksParams x = p;
    x.kmin = a, x.kmax = b, x.kmin_fp8 = c, x.kmax_fp8 = e;
    return kernels::LaunchScoreBlocks(x, gpu->stream());
  };
  CHECK(launch(b16min, b16max, nullptr, nullptr) == cudaSuccess);
  CHECK(launch(nullptr, nullptr, f8min, f8max) == cudaSuccess);
  CHECK(launch(b16min, b16max, f8min, f8max) == cudaErrorInvalidValue);
  CHECK(launch(nullptr, nullptr, f8min, nullptr) == cudaErrorInvalidValue);
  CHECK(launch(nullptr, b16max, f8min, f8max) == cudaErrorInvalidValue);
  CHECK(launch(nullptr, nullptr, nullptr, nullptr) == cudaErrorInvalidValue);
  CHECK(launch(nullptr, nullptr, f8min + 8, f8max) == cudaErrorInvalidValue);
  CHECK(cudaStreamSynchronize(gpu->stream()) == cudaSuccess);
}

namespace {

// Summaries of a ScoreBlocks test (host F8E4M3 [rows, d]) and the unit of the tolerance.
enum class SummaryKind {
  kNormal,      // e4m3(N(0, 1)), kmin and kmax independent (either may be the larger)
  kCalibrated,  // e4m3(N(0, 1) · 64) (saturating now and then), kmin <= kmax element-wise
  kAnyFinite,   // every finite byte (subnormals, ±0, ±448), independent
  kExact,       // quarter-integers in [-8, 8]; with integer q every sum is exact in float32
};
const char* Name(SummaryKind k) {
  switch (k) {
    case SummaryKind::kNormal:
      return "N(0,1)";
    case SummaryKind::kCalibrated:
      return "N(0,1)*64 ordered";
    case SummaryKind::kAnyFinite:
      return "any finite byte";
    default:
      return "exact quarter-integers";
  }
}

std::pair<Tensor, Tensor> MakeSummaries(SummaryKind kind, int64_t rows, int d, std::mt19937& rng) {
  Tensor lo = Tensor::Empty({rows, d}, DType::kF8E4M3),
         hi = Tensor::Empty({rows, d}, DType::kF8E4M3);
  uint8_t* a = lo.data<uint8_t>();
  uint8_t* b = hi.data<uint8_t>();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < lo.numel(); ++i) {
    switch (kind) {
      case SummaryKind::kNormal:
        a[i] = FloatToFp8E4M3(normal(rng)), b[i] = FloatToFp8E4M3(normal(rng));
        break;
      case SummaryKind::kCalibrated: {
        const float x = Fp8E4M3ToFloat(FloatToFp8E4M3(64.0f * normal(rng)));
        const float y = Fp8E4M3ToFloat(FloatToFp8E4M3(64.0f * normal(rng)));
        a[i] = FloatToFp8E4M3(std::min(x, y)), b[i] = FloatToFp8E4M3(std::max(x, y));
        break;
      }
      case SummaryKind::kAnyFinite:
        for (uint8_t* p : {a + i, b + i}) {
          *p = static_cast<uint8_t>(RandInt(rng, 0, 255));
          if ((*p & 0x7f) == 0x7f) *p ^= 0x01;  // NaN -> ±448
        }
        break;
      case SummaryKind::kExact:
        a[i] = FloatToFp8E4M3(0.25f * static_cast<float>(RandInt(rng, -32, 32)));
        b[i] = FloatToFp8E4M3(0.25f * static_cast<float>(RandInt(rng, -32, 32)));
        break;
    }
  }
  return {lo, hi};
}

// RMS of the summaries' values (at least 1): the tolerance's unit.
double SummaryRms(const Tensor& lo, const Tensor& hi) {
  double s = 0;
  for (const Tensor* t : {&lo, &hi})
    for (int64_t i = 0; i < t->numel(); ++i) {
      const double x = Fp8E4M3ToFloat(t->data<uint8_t>()[i]);
      s += x * x;
    }
  return std::max(1.0, std::sqrt(s / static_cast<double>(2 * lo.numel())));
}

}  // namespace

TEST_CASE(
    "ScoreBlocks over e4m3 summaries matches the CPU (head_dim 32-256, GQA groups 1-16, sum and "
    "max, inactive rows, partial candidate lists, shuffled tables); TopKBlocks on its scores "
    "equals "
    "the CPU's",
    "[gpu][fp8][sparse]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  const uint32_t seed = FreshSeed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  struct Shape {
    int hq, hkv, d, mb, k, rows;
  };
  for (const Shape& sh :
       {Shape{32, 8, 128, 300, 128, 3}, Shape{8, 2, 64, 1100, 64, 3}, Shape{16, 2, 256, 90, 32, 3},
        Shape{4, 4, 128, 2048, 256, 3}, Shape{4, 2, 32, 40, 16, 3}, Shape{12, 4, 64, 200, 32, 3},
        Shape{48, 4, 128, 700, 64, 3}, Shape{16, 1, 32, 500, 64, 3}, Shape{32, 2, 256, 333, 64, 2},
        Shape{9, 1, 64, 100, 16, 2},
        // several steps per warp (the launcher's one-wave grid), each head_dim
        Shape{32, 8, 128, 4096, 128, 4}, Shape{8, 8, 32, 5000, 256, 4},
        Shape{16, 8, 64, 4000, 128, 4}, Shape{8, 2, 256, 3000, 128, 4}}) {
    const int group = sh.hq / sh.hkv;
    INFO("heads " << sh.hq << "/" << sh.hkv << " (group " << group << ") d " << sh.d << " MB "
                  << sh.mb << " K " << sh.k << " rows " << sh.rows);
    REQUIRE(kernels::ScoreBlocksSupported(sh.d, group));
    const int64_t R = sh.rows, T = 7;
    // Rows: 0 all MB candidates, 1 inactive, 2 a partial list (not a multiple of 16), 3 short.
    std::vector<int32_t> qrows(R), nblocks(R);
    for (int64_t r = 0; r < R; ++r) qrows[r] = RandInt(rng, 0, T - 1);
    qrows[1] = -1;
    nblocks[0] = sh.mb;
    nblocks[1] = RandInt(rng, 1, sh.mb);
    if (R > 2) nblocks[2] = std::max(1, RandInt(rng, sh.mb / 3, sh.mb - 1) | 1);
    if (R > 3) nblocks[3] = RandInt(rng, 0, 40);
    // Summary rows: a shuffled permutation of fewer rows than table entries (some repeat).
    const int64_t entries = R * sh.hkv * sh.mb, srows = std::max<int64_t>(16, entries * 3 / 4);
    std::vector<int32_t> perm(static_cast<size_t>(srows)), tables(static_cast<size_t>(entries));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < entries; ++i) tables[i] = perm[i % srows];
    std::shuffle(tables.begin(), tables.end(), rng);
    const Tensor qr = Ints({R}, qrows), nb = Ints({R}, nblocks),
                 tb = Ints({R, sh.hkv, sh.mb}, tables);
    const Tensor d_qr = gpu->Upload(qr), d_nb = gpu->Upload(nb), d_tb = gpu->Upload(tb);
    for (SummaryKind kind : {SummaryKind::kNormal, SummaryKind::kCalibrated,
                             SummaryKind::kAnyFinite, SummaryKind::kExact}) {
      const auto [lo, hi] = MakeSummaries(kind, srows, sh.d, rng);
      Tensor q = RandomBf16Exact({T, sh.hq, sh.d}, rng);
      float* qv = q.data<float>();
      if (kind == SummaryKind::kExact) {
        for (int64_t i = 0; i < q.numel(); ++i) qv[i] = static_cast<float>(RandInt(rng, -3, 3));
      } else {  // zeros and tiny components (their products are negligible, never NaN)
        for (int64_t i = 0; i < q.numel(); i += RandInt(rng, 1, 40))
          qv[i] = RandInt(rng, 0, 1) ? 0.0f : Bf16BitsToFloat(FloatToBf16Bits(qv[i] * 1e-30f));
      }
      const double unit = SummaryRms(lo, hi);
      const double atol = kind == SummaryKind::kExact ? 1e-3 : 1e-3 * sh.d * unit;
      const double rtol = kind == SummaryKind::kExact ? 0.0 : 1e-4;
      const Tensor d_q = UploadBf16(*gpu, q), d_lo = gpu->Upload(lo), d_hi = gpu->Upload(hi);
      for (GroupReduce reduce : {GroupReduce::kSum, GroupReduce::kMax}) {
        INFO(Name(kind) << (reduce == GroupReduce::kSum ? " sum" : " max") << ", tolerance " << atol
                        << " + " << rtol << "·|want|");
        constexpr float kUnwritten = -7.25f;
        Tensor init = Tensor::Empty({R, sh.hkv, sh.mb}, DType::kF32);
        std::fill(init.data<float>(), init.data<float>() + init.numel(), kUnwritten);
        Tensor want = init.Clone(), got = gpu->Upload(init);
        cpu.ScoreBlocks(q, qr, nb, tb, lo, hi, reduce, want);
        gpu->ScoreBlocks(d_q, d_qr, d_nb, d_tb, d_lo, d_hi, reduce, got);
        Tensor got_host = gpu->Download(got);
        ExpectClose(got_host, want, atol, rtol);
        // Inactive rows and blocks past num_blocks are left as they were, exactly.
        int64_t touched = 0;
        for (int64_t r = 0; r < R; ++r)
          for (int64_t h = 0; h < sh.hkv; ++h)
            for (int64_t b = 0; b < sh.mb; ++b) {
              const bool written = qrows[r] >= 0 && b < nblocks[r];
              const float g = got_host.data<float>()[(r * sh.hkv + h) * sh.mb + b];
              touched += !written && g != kUnwritten;
            }
        CHECK(touched == 0);

        // Top-K from identical scores: as computed, and quantised so that ties must break by id.
        for (bool quantised : {false, true}) {
          INFO((quantised ? "quantised scores" : "the GPU's scores"));
          Tensor s = got_host.Clone();
          if (quantised)
            for (int64_t i = 0; i < s.numel(); ++i)
              s.data<float>()[i] =
                  static_cast<float>(std::round(s.data<float>()[i] * 2.0 / unit) * unit / 2.0);
          const int k = std::min(sh.k, sh.mb);
          const Tensor init_topk = Ints({R, sh.hkv, k}, std::vector<int32_t>(R * sh.hkv * k, -7));
          Tensor want_topk = init_topk.Clone(), got_topk = gpu->Upload(init_topk);
          cpu.TopKBlocks(s, qr, nb, want_topk);
          gpu->TopKBlocks(gpu->Upload(s), d_qr, d_nb, got_topk);
          ExpectSameInts(gpu->Download(got_topk), want_topk, "TopKBlocks");
        }
      }
    }
  }
}
