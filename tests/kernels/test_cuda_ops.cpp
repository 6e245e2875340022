// Every CUDA op against the CPU reference on fresh random inputs (bf16-exact inputs, float
// reference), several shapes, outputs poisoned with NaN beforehand.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/rope.h"
#include "common/tuning.h"
#include "gpu_test_util.h"
#include "kernels/gemv.h"

using namespace oasis;
using namespace oasis::testing;

namespace {
// Fresh random inputs every run; the run's seed is printed and OASIS_TEST_SEED=N repeats it (each
// call draws the next generator of that run).
std::mt19937 FreshRng() {
  static const uint32_t base = [] {
    const char* env = std::getenv("OASIS_TEST_SEED");
    const uint32_t s = env != nullptr ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) : std::random_device{}();
    std::printf("test_gpu_ops: seed %u (OASIS_TEST_SEED=%u repeats it)\n", s, s);
    return s;
  }();
  static uint32_t calls = 0;
  return std::mt19937(base + 7919u * calls++);
}

Tensor IntTensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// Bit-level equality of two downloaded tensors; NaN (a poisoned, unwritten element) must be
// NaN in both.
void ExpectIdentical(const Tensor& got, const Tensor& want) {
  REQUIRE(got.numel() == want.numel());
  int64_t bad = -1, mismatches = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const float g = got.data<float>()[i], w = want.data<float>()[i];
    const bool same = (std::isnan(g) && std::isnan(w)) || g == w;
    if (!same && mismatches++ == 0) bad = i;
  }
  INFO(mismatches << " mismatches; first at " << bad << ": got " << (bad >= 0 ? got.data<float>()[bad] : 0.f)
                  << " want " << (bad >= 0 ? want.data<float>()[bad] : 0.f));
  CHECK(mismatches == 0);
}

std::unique_ptr<CudaBackend> MakeBackend() {
  auto b = CudaBackend::Create();
  REQUIRE(b.ok());
  return std::move(*b);
}
}  // namespace

TEST_CASE("Linear (cuBLAS bf16) matches the CPU", "[gpu][linear]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  // Rows 1..4 with in % 8 == 0 take the GEMV kernel; the others cuBLAS.
  for (auto [rows, in, outf] : {std::tuple{1, 64, 96}, std::tuple{7, 200, 130}, std::tuple{256, 1024, 512},
                                std::tuple{1, 4096, 1000}, std::tuple{3, 1032, 17}, std::tuple{4, 12288, 515}, std::tuple{8, 4096, 300},
                                std::tuple{5, 24, 3}, std::tuple{1, 2048, 5120}}) {
    INFO("rows " << rows << " in " << in << " out " << outf);
    Tensor x = RandomBf16Exact({rows, in}, rng), w = RandomBf16Exact({outf, in}, rng, 0.05f);
    Tensor want = Tensor::Empty({rows, outf}, DType::kF32);
    cpu.Linear(x, w, want);
    Tensor out = PoisonedBf16(*gpu, {rows, outf});
    gpu->Linear(UploadBf16(*gpu, x), UploadBf16(*gpu, w), out);
    // bf16 output: cuBLAS may split K and reduce the partial sums in bf16, so the error scales
    // with the size of the partial dot products (~ sqrt(in) * 0.05), not with the result.
    ExpectClose(DownloadF32(*gpu, out), want, std::max(2e-2, 1.5e-2 * std::sqrt(double(in)) * 0.05), 1e-2);
    Tensor out32 = gpu->Empty({rows, outf}, DType::kF32);
    gpu->Linear(UploadBf16(*gpu, x), UploadBf16(*gpu, w), out32);
    ExpectClose(DownloadF32(*gpu, out32), want, 1e-3, 1e-3);
  }
}

TEST_CASE("every GEMV configuration matches the CPU", "[gpu][linear]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  for (auto [rows, in, outf] : {std::tuple{1, 64, 96}, std::tuple{2, 4096, 1001}, std::tuple{3, 1032, 17},
                                std::tuple{4, 12288, 515}, std::tuple{1, 8, 5}, std::tuple{1, 2056, 4099}}) {
    Tensor x = RandomBf16Exact({rows, in}, rng), w = RandomBf16Exact({outf, in}, rng, 0.05f);
    Tensor want = Tensor::Empty({rows, outf}, DType::kF32);
    cpu.Linear(x, w, want);
    Tensor dx = UploadBf16(*gpu, x), dw = UploadBf16(*gpu, w);
    for (kernels::GemvConfig config : {kernels::GemvConfig::kPerGroup, kernels::GemvConfig::kPersistent}) {
      INFO("config " << static_cast<int>(config) << " rows " << rows << " in " << in << " out " << outf);
      Tensor out = PoisonedBf16(*gpu, {rows, outf});
      REQUIRE(kernels::LaunchGemvWith(config, static_cast<const __nv_bfloat16*>(dx.raw()),
                                      static_cast<const __nv_bfloat16*>(dw.raw()), static_cast<__nv_bfloat16*>(out.raw()),
                                      nullptr, rows, in, outf, gpu->stream()) == cudaSuccess);
      ExpectClose(DownloadF32(*gpu, out), want, 2e-2, 1e-2);
    }
  }
}

TEST_CASE("fused pre-norm + projection matches the CPU composition", "[gpu][linear][norm]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  // 1..4 rows take the fused GEMV; more rows the add+norm kernel and a cuBLAS GEMM. Both
  // one-row configurations below 4,096 features (OASIS_GEMV_NARROW_NORM off and on).
  const Tuning saved = GetTuning();
  for (auto [rows, in, outf] : {std::tuple{1, 4096, 1000}, std::tuple{1, 2048, 515}, std::tuple{2, 1024, 777}, std::tuple{3, 256, 64},
                                std::tuple{4, 2048, 515}, std::tuple{6, 512, 300}, std::tuple{64, 4096, 300}}) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool with_x = variant != 1;
      Tuning t = saved;
      t.gemv_narrow_norm = variant == 2;
      SetTuningForTesting(t);
      INFO("rows " << rows << " in " << in << " out " << outf << " with x " << with_x << " narrow-norm " << t.gemv_narrow_norm);
      Tensor x = RandomBf16Exact({rows, in}, rng), res = RandomBf16Exact({rows, in}, rng);
      Tensor nw = RandomBf16Exact({in}, rng, 0.5f), w = RandomBf16Exact({outf, in}, rng, 0.05f);
      Tensor want = Tensor::Empty({rows, outf}, DType::kF32), want_res = Tensor::Empty({rows, in}, DType::kF32);
      // The reference rounds the updated residual to bf16 like the GPU stream does.
      Tensor res_ref = res;
      if (with_x) {
        cpu.Add(res, x, want_res);
        res_ref = ToBf16Host(want_res).ToFloat();
      }
      Tensor normed = Tensor::Empty({rows, in}, DType::kF32);
      cpu.RmsNorm(res_ref, nw, 1e-6f, normed);
      cpu.Linear(normed, w, want);
      Tensor d_x = UploadBf16(*gpu, x), d_res = UploadBf16(*gpu, res);
      Tensor d_res_out = PoisonedBf16(*gpu, {rows, in});
      Tensor out = gpu->Empty({rows, outf}, DType::kF32);
      gpu->AddRmsNormLinear(with_x ? &d_x : nullptr, d_res, with_x ? &d_res_out : nullptr, UploadBf16(*gpu, nw), 1e-6f,
                            UploadBf16(*gpu, w), out);
      SetTuningForTesting(saved);
      ExpectClose(DownloadF32(*gpu, out), want, 3e-2, 2e-2);
      if (with_x) ExpectClose(DownloadF32(*gpu, d_res_out), res_ref, 0, 0);
    }
  }
}

TEST_CASE("RmsNorm, AddRmsNorm, Add, SiluMul match the CPU", "[gpu][norm]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  for (auto [rows, n] : {std::pair{1, 64}, std::pair{5, 4096}, std::pair{33, 1000}}) {
    Tensor x = RandomBf16Exact({rows, n}, rng), r = RandomBf16Exact({rows, n}, rng), w = RandomBf16Exact({n}, rng);
    Tensor want = Tensor::Empty({rows, n}, DType::kF32);
    cpu.RmsNorm(x, w, 1e-6f, want);
    Tensor out = PoisonedBf16(*gpu, {rows, n});
    gpu->RmsNorm(UploadBf16(*gpu, x), UploadBf16(*gpu, w), 1e-6f, out);
    ExpectClose(DownloadF32(*gpu, out), want, 1e-2, 1.6e-2);

    Tensor res_cpu = r.Clone();
    cpu.AddRmsNorm(x, res_cpu, w, 1e-6f, want);
    Tensor res_gpu = UploadBf16(*gpu, r);
    gpu->AddRmsNorm(UploadBf16(*gpu, x), res_gpu, UploadBf16(*gpu, w), 1e-6f, out);
    ExpectClose(DownloadF32(*gpu, res_gpu), res_cpu, 1e-2, 8e-3);
    ExpectClose(DownloadF32(*gpu, out), want, 2e-2, 2e-2);

    cpu.Add(x, r, want);
    gpu->Add(UploadBf16(*gpu, x), UploadBf16(*gpu, r), out);
    ExpectClose(DownloadF32(*gpu, out), want, 1e-2, 8e-3);

    Tensor gu = RandomBf16Exact({rows, 2 * n}, rng);
    Tensor act_want = Tensor::Empty({rows, n}, DType::kF32);
    cpu.SiluMul(gu, act_want);
    Tensor act = PoisonedBf16(*gpu, {rows, n});
    gpu->SiluMul(UploadBf16(*gpu, gu), act);
    ExpectClose(DownloadF32(*gpu, act), act_want, 1e-2, 1.6e-2);
  }
}

TEST_CASE("SiluMul: vectorised rows (inter % 8 == 0) and the scalar fallback", "[gpu][norm]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  // 70000 and 65537 rows: past grid.y's 65535 (a long prefill chunk), launched in pieces.
  for (auto [rows, n] : {std::pair{128, 12288}, std::pair{64, 1536}, std::pair{3, 1002}, std::pair{7, 8},
                         std::pair{70000, 16}, std::pair{65537, 6}}) {
    Tensor gu = RandomBf16Exact({rows, 2 * n}, rng);
    Tensor want = Tensor::Empty({rows, n}, DType::kF32);
    cpu.SiluMul(gu, want);
    Tensor act = PoisonedBf16(*gpu, {rows, n});
    gpu->SiluMul(UploadBf16(*gpu, gu), act);
    INFO("rows " << rows << " inter " << n);
    ExpectClose(DownloadF32(*gpu, act), want, 1e-2, 1.6e-2);
  }
}

TEST_CASE("Embedding, SplitQkv, GatherRows and ScatterRows copy exactly", "[gpu][copy]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  Tensor table = RandomBf16Exact({300, 48}, rng);
  Tensor ids = IntTensor({5, 0, 299, 5, 17});
  Tensor want = Tensor::Empty({5, 48}, DType::kF32);
  cpu.Embedding(ids, table, want);
  Tensor out = PoisonedBf16(*gpu, {5, 48});
  gpu->Embedding(gpu->Upload(ids), UploadBf16(*gpu, table), out);
  ExpectClose(DownloadF32(*gpu, out), want, 0, 0);

  Tensor qkv = RandomBf16Exact({9, 8 * 16 + 2 * 2 * 16}, rng);
  Tensor q = Tensor::Empty({9, 8, 16}, DType::kF32), k = Tensor::Empty({9, 2, 16}, DType::kF32),
         v = Tensor::Empty({9, 2, 16}, DType::kF32);
  cpu.SplitQkv(qkv, q, k, v);
  Tensor gq = PoisonedBf16(*gpu, {9, 8, 16}), gk = PoisonedBf16(*gpu, {9, 2, 16}), gv = PoisonedBf16(*gpu, {9, 2, 16});
  gpu->SplitQkv(UploadBf16(*gpu, qkv), gq, gk, gv);
  ExpectClose(DownloadF32(*gpu, gq), q, 0, 0);
  ExpectClose(DownloadF32(*gpu, gk), k, 0, 0);
  ExpectClose(DownloadF32(*gpu, gv), v, 0, 0);
  {  // more tokens than grid.y holds (65535): launched in pieces
    Tensor big = RandomBf16Exact({70001, 4 + 2 + 2}, rng);
    Tensor bq = Tensor::Empty({70001, 1, 4}, DType::kF32), bk = Tensor::Empty({70001, 1, 2}, DType::kF32),
           bv = Tensor::Empty({70001, 1, 2}, DType::kF32);
    cpu.SplitQkv(big, bq, bk, bv);
    Tensor dq = PoisonedBf16(*gpu, {70001, 1, 4}), dk = PoisonedBf16(*gpu, {70001, 1, 2}),
           dv = PoisonedBf16(*gpu, {70001, 1, 2});
    gpu->SplitQkv(UploadBf16(*gpu, big), dq, dk, dv);
    ExpectClose(DownloadF32(*gpu, dq), bq, 0, 0);
    ExpectClose(DownloadF32(*gpu, dk), bk, 0, 0);
    ExpectClose(DownloadF32(*gpu, dv), bv, 0, 0);
  }

  Tensor rows = IntTensor({8, 0, 3});
  Tensor gathered = Tensor::Empty({3, 8 * 16 + 64}, DType::kF32);
  cpu.GatherRows(qkv, rows, gathered);
  Tensor gg = PoisonedBf16(*gpu, {3, 8 * 16 + 64});
  gpu->GatherRows(UploadBf16(*gpu, qkv), gpu->Upload(rows), gg);
  ExpectClose(DownloadF32(*gpu, gg), gathered, 0, 0);

  // ScatterRows, the inverse: the rows land at their indices, the others stay untouched
  // (16-byte rows take the vector path, 6-byte rows the byte path).
  for (int64_t width : {8 * 16 + 64, 3}) {
    Tensor src = RandomBf16Exact({4, width}, rng), base = RandomBf16Exact({11, width}, rng);
    Tensor at = IntTensor({9, 2, 0, 10});
    Tensor expect = base.Clone();
    cpu.ScatterRows(src, at, expect);
    Tensor g = UploadBf16(*gpu, base);
    gpu->ScatterRows(UploadBf16(*gpu, src), gpu->Upload(at), g);
    ExpectClose(DownloadF32(*gpu, g), expect, 0, 0);
  }
}

// YaRN, factor 4 over 64 positions: attention scaling 1.1386 on cos and sin.
static RopeScaling YarnScaling() {
  RopeScaling s;
  s.type = RopeScalingType::kYarn;
  s.factor = 4.0;
  s.original_max_position_embeddings = 64;
  return s;
}

TEST_CASE("QkNormRope matches the CPU, with and without q/k norm, llama3 and yarn scaling", "[gpu][rope]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  for (int head_dim : {16, 24, 64, 128}) {
    for (const char* variant : {"llama3", "qk_norm", "qk_norm yarn"}) {
      const bool qk_norm = variant != std::string("llama3");
      ModelConfig c;
      c.head_dim = head_dim;
      c.rope_theta = qk_norm ? 1e6 : 500000;
      if (!qk_norm) c.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 64};
      if (variant == std::string("qk_norm yarn")) c.rope_scaling = YarnScaling();
      RopeParams rope = ComputeRopeParams(c);
      if (c.rope_scaling.type == RopeScalingType::kYarn) REQUIRE(rope.attention_scaling > 1.1f);
      const int64_t tokens = 37;
      Tensor q = RandomBf16Exact({tokens, 8, head_dim}, rng), k = RandomBf16Exact({tokens, 2, head_dim}, rng);
      Tensor qn = RandomBf16Exact({head_dim}, rng), kn = RandomBf16Exact({head_dim}, rng);
      std::vector<int32_t> pos(tokens);
      std::uniform_int_distribution<int32_t> pd(0, 40000);
      for (auto& p : pos) p = pd(rng);
      Tensor positions = IntTensor(pos);
      Tensor gq = UploadBf16(*gpu, q), gk = UploadBf16(*gpu, k);
      Tensor gqn = UploadBf16(*gpu, qn), gkn = UploadBf16(*gpu, kn);
      gpu->QkNormRope(gq, gk, qk_norm ? &gqn : nullptr, qk_norm ? &gkn : nullptr, 1e-6f, gpu->Upload(positions), rope);
      cpu.QkNormRope(q, k, qk_norm ? &qn : nullptr, qk_norm ? &kn : nullptr, 1e-6f, positions, rope);
      INFO("head_dim " << head_dim << " " << variant);
      ExpectRopeClose(DownloadF32(*gpu, gq), q, head_dim);
      ExpectRopeClose(DownloadF32(*gpu, gk), k, head_dim);
    }
  }
}

TEST_CASE("KvAppend and paged attention match the CPU over shuffled head-level tables", "[gpu][attention]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  for (int head_dim : {32, 128}) {
    const int hq = 8, hkv = 2;
    // (query tokens, context after the step): decode, multi-token verify, prefill chunks.
    const std::vector<std::pair<int, int>> seqs = {{1, 1}, {1, 300}, {4, 77}, {50, 50}, {16, 160}};
    int64_t total_q = 0, max_blocks = 0, slots = 0;
    for (auto [nq, nkv] : seqs) {
      total_q += nq;
      max_blocks = std::max<int64_t>(max_blocks, (nkv + 15) / 16);
      slots += (nkv + 15) / 16 * hkv;
    }
    slots += 5;
    std::vector<int32_t> free_slots(static_cast<size_t>(slots));
    std::iota(free_slots.begin(), free_slots.end(), 0);
    std::shuffle(free_slots.begin(), free_slots.end(), rng);
    // Cached context is written with KvAppend too (all positions), from random K/V.
    int64_t total_kv = 0;
    for (auto [nq, nkv] : seqs) total_kv += nkv;
    Tensor k_all = RandomBf16Exact({total_kv, hkv, head_dim}, rng), v_all = RandomBf16Exact({total_kv, hkv, head_dim}, rng);
    Tensor mapping = Tensor::Empty({total_kv, hkv}, DType::kI64);
    const int S = static_cast<int>(seqs.size());
    Tensor qstart = Tensor::Empty({S + 1}, DType::kI32), lens = Tensor::Empty({S, hkv}, DType::kI32);
    Tensor tables = Tensor::Zeros({S, hkv, max_blocks}, DType::kI32);
    size_t next = 0;
    int64_t kv_row = 0, q_row = 0;
    for (int s = 0; s < S; ++s) {
      auto [nq, nkv] = seqs[static_cast<size_t>(s)];
      qstart.data<int32_t>()[s] = static_cast<int32_t>(q_row);
      q_row += nq;
      for (int h = 0; h < hkv; ++h) {
        lens.data<int32_t>()[s * hkv + h] = nkv;
        for (int b = 0; b < (nkv + 15) / 16; ++b) tables.data<int32_t>()[(s * hkv + h) * max_blocks + b] = free_slots[next++];
        for (int p = 0; p < nkv; ++p) {
          const int32_t slot = tables.data<int32_t>()[(s * hkv + h) * max_blocks + p / 16];
          mapping.data<int64_t>()[(kv_row + p) * hkv + h] = int64_t{slot} * 16 + p % 16;
        }
      }
      kv_row += nkv;
    }
    qstart.data<int32_t>()[S] = static_cast<int32_t>(q_row);
    LayerKvPool cpu_pool{Tensor::Zeros({slots, 16, head_dim}, DType::kF32), Tensor::Zeros({slots, 16, head_dim}, DType::kF32)};
    cpu.KvAppend(k_all, v_all, mapping, cpu_pool);
    LayerKvPool gpu_pool{PoisonedBf16(*gpu, {slots, 16, head_dim}), PoisonedBf16(*gpu, {slots, 16, head_dim})};
    gpu->KvAppend(UploadBf16(*gpu, k_all), UploadBf16(*gpu, v_all), gpu->Upload(mapping), gpu_pool);

    Tensor q = RandomBf16Exact({total_q, hq, head_dim}, rng);
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    Tensor want = Tensor::Empty({total_q, hq, head_dim}, DType::kF32);
    cpu.Attention(q, cpu_pool, {qstart, lens, tables, 50}, scale, want);
    Tensor out = PoisonedBf16(*gpu, {total_q, hq, head_dim});
    AttentionMetadata meta{gpu->Upload(qstart), gpu->Upload(lens), gpu->Upload(tables), 50};
    gpu->Attention(UploadBf16(*gpu, q), gpu_pool, meta, scale, out);
    INFO("head_dim " << head_dim);
    ExpectClose(DownloadF32(*gpu, out), want, 1e-2, 2e-2);
  }
}

TEST_CASE("fused QkvRopeAppend and SiluMulLinear match the composed ops", "[gpu][fused]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  for (int64_t tokens : {1, 5, 40}) {
    const int hq = 8, hkv = 2, d = 128;
    ModelConfig c;
    c.head_dim = d;
    c.rope_theta = 1e6;
    if (tokens == 5) c.rope_scaling = YarnScaling();  // cos/sin times 1.1386
    RopeParams rope = ComputeRopeParams(c);
    Tensor qkv = RandomBf16Exact({tokens, (hq + 2 * hkv) * d}, rng);
    Tensor qn = RandomBf16Exact({d}, rng), kn = RandomBf16Exact({d}, rng);
    std::vector<int32_t> pos(static_cast<size_t>(tokens));
    for (int64_t i = 0; i < tokens; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(100 + 7 * i);
    Tensor positions = IntTensor(pos);
    const int64_t slots = (tokens + 15) / 16 * hkv + 3;
    Tensor mapping = Tensor::Empty({tokens, hkv}, DType::kI64);
    for (int64_t t = 0; t < tokens; ++t)
      for (int h = 0; h < hkv; ++h) mapping.data<int64_t>()[t * hkv + h] = (t / 16 * hkv + h + 3) * 16 + t % 16;
    mapping.data<int64_t>()[0] = -1;  // a row that is not stored
    LayerKvPool cpu_pool{Tensor::Zeros({slots, 16, d}, DType::kF32), Tensor::Zeros({slots, 16, d}, DType::kF32)};
    Tensor q_want = Tensor::Empty({tokens, hq, d}, DType::kF32);
    cpu.QkvRopeAppend(qkv, q_want, &qn, &kn, 1e-6f, positions, rope, mapping, cpu_pool);
    LayerKvPool gpu_pool{gpu->Upload(ToBf16Host(cpu_pool.k)), gpu->Upload(ToBf16Host(cpu_pool.v))};
    Tensor gq = PoisonedBf16(*gpu, {tokens, hq, d});
    Tensor gqn = UploadBf16(*gpu, qn), gkn = UploadBf16(*gpu, kn);
    gpu->QkvRopeAppend(UploadBf16(*gpu, qkv), gq, &gqn, &gkn, 1e-6f, gpu->Upload(positions), rope, gpu->Upload(mapping),
                       gpu_pool);
    ExpectRopeClose(DownloadF32(*gpu, gq), q_want, d);
    ExpectRopeClose(DownloadF32(*gpu, gpu_pool.k), cpu_pool.k, d);
    ExpectClose(DownloadF32(*gpu, gpu_pool.v), cpu_pool.v, 0, 0);

    const int64_t inter = 1536, outf = 520;
    Tensor gu = RandomBf16Exact({tokens, 2 * inter}, rng), w = RandomBf16Exact({outf, inter}, rng, 0.05f);
    Tensor want = Tensor::Empty({tokens, outf}, DType::kF32);
    cpu.SiluMulLinear(gu, w, want);
    Tensor out = PoisonedBf16(*gpu, {tokens, outf});
    gpu->SiluMulLinear(UploadBf16(*gpu, gu), UploadBf16(*gpu, w), out);
    ExpectClose(DownloadF32(*gpu, out), want, 3e-2, 2e-2);
  }
}

TEST_CASE("QkvRopeAppend at prefill sizes (the vectorised kernel) matches the CPU at every head_dim", "[gpu][rope]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  struct Case {
    int64_t tokens;
    int hq, hkv, d;
    bool qk_norm;
  };
  // More than kRopeVecMinTokens tokens: head_dim 32/64/128/256 take the vectorised kernel, 80 the
  // warp kernel; exactly kRopeVecMinTokens tokens the warp kernel too.
  for (const Case& k : {Case{9, 4, 2, 32, true}, Case{37, 8, 2, 64, false}, Case{300, 16, 4, 128, true},
                        Case{65, 4, 1, 256, true}, Case{40, 4, 2, 80, true}, Case{8, 8, 2, 128, true}}) {
    INFO("tokens " << k.tokens << " heads " << k.hq << "/" << k.hkv << " d " << k.d);
    ModelConfig c;
    c.head_dim = k.d;
    c.rope_theta = 1e6;
    if (k.d == 64) c.rope_scaling = YarnScaling();
    RopeParams rope = ComputeRopeParams(c);
    Tensor qkv = RandomBf16Exact({k.tokens, (k.hq + 2 * k.hkv) * k.d}, rng);
    Tensor qn = RandomBf16Exact({k.d}, rng), kn = RandomBf16Exact({k.d}, rng);
    std::vector<int32_t> pos(static_cast<size_t>(k.tokens));
    for (auto& v : pos) v = std::uniform_int_distribution<int32_t>(0, 40000)(rng);
    Tensor positions = IntTensor(pos);
    const int64_t slots = (k.tokens + 15) / 16 * k.hkv + 3;
    Tensor mapping = Tensor::Empty({k.tokens, k.hkv}, DType::kI64);
    for (int64_t t = 0; t < k.tokens; ++t)
      for (int h = 0; h < k.hkv; ++h)
        mapping.data<int64_t>()[t * k.hkv + h] = (t / 16 * k.hkv + h + 3) * 16 + t % 16;
    mapping.data<int64_t>()[1] = -1;  // rows that are not stored
    mapping.data<int64_t>()[k.tokens * k.hkv - 1] = -1;
    LayerKvPool cpu_pool{Tensor::Zeros({slots, 16, k.d}, DType::kF32), Tensor::Zeros({slots, 16, k.d}, DType::kF32)};
    Tensor q_want = Tensor::Empty({k.tokens, k.hq, k.d}, DType::kF32);
    const Tensor* cqn = k.qk_norm ? &qn : nullptr;
    const Tensor* ckn = k.qk_norm ? &kn : nullptr;
    cpu.QkvRopeAppend(qkv, q_want, cqn, ckn, 1e-6f, positions, rope, mapping, cpu_pool);
    LayerKvPool gpu_pool{gpu->Upload(ToBf16Host(cpu_pool.k)), gpu->Upload(ToBf16Host(cpu_pool.v))};
    Tensor gq = PoisonedBf16(*gpu, {k.tokens, k.hq, k.d});
    Tensor gqn = UploadBf16(*gpu, qn), gkn = UploadBf16(*gpu, kn);
    gpu->QkvRopeAppend(UploadBf16(*gpu, qkv), gq, k.qk_norm ? &gqn : nullptr, k.qk_norm ? &gkn : nullptr, 1e-6f,
                       gpu->Upload(positions), rope, gpu->Upload(mapping), gpu_pool);
    ExpectRopeClose(DownloadF32(*gpu, gq), q_want, k.d);
    ExpectRopeClose(DownloadF32(*gpu, gpu_pool.k), cpu_pool.k, k.d);  // unstored rows stay 0
    ExpectClose(DownloadF32(*gpu, gpu_pool.v), cpu_pool.v, 0, 0);
  }
}

TEST_CASE("decode fusions: QKV GEMV + norm/RoPE/append and gate/up GEMV + SiLU equal the composed ops", "[gpu][fused]") {
  // The fused QKV kernel is opt-in (OASIS_FUSE_QKV; slower on the H200, see common/tuning.h):
  // switch it on, so this test exercises it.
  Tuning tuning = GetTuning();
  tuning.fuse_qkv = true;
  SetTuningForTesting(tuning);
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  struct Shape {
    int64_t rows, hidden;
    int hq, hkv, d;
    bool qk_norm;
  };
  // 1..4 rows take the fused kernels (the QKV counters must come back to zero: every shape runs
  // three times); 6 rows fall back to the composed ops.
  for (const Shape& sh : {Shape{1, 4096, 32, 8, 128, true}, Shape{2, 1024, 8, 2, 128, false},
                          Shape{3, 512, 4, 4, 64, true}, Shape{4, 2048, 16, 4, 128, true},
                          Shape{6, 512, 8, 2, 128, true}}) {
    INFO("rows " << sh.rows << " hidden " << sh.hidden << " heads " << sh.hq << "/" << sh.hkv << " d " << sh.d);
    const int64_t rows = sh.rows, width = int64_t{sh.hq + 2 * sh.hkv} * sh.d;
    ModelConfig c;
    c.head_dim = sh.d;
    c.rope_theta = 1e6;
    if (sh.rows == 2) c.rope_scaling = YarnScaling();  // the epilogue's attention scaling
    const RopeParams rope = ComputeRopeParams(c);
    Tensor x = UploadBf16(*gpu, RandomBf16Exact({rows, sh.hidden}, rng));
    Tensor res = UploadBf16(*gpu, RandomBf16Exact({rows, sh.hidden}, rng));
    Tensor nw = UploadBf16(*gpu, RandomBf16Exact({sh.hidden}, rng, 0.5f));
    Tensor w = UploadBf16(*gpu, RandomBf16Exact({width, sh.hidden}, rng, 0.05f));
    Tensor qn = UploadBf16(*gpu, RandomBf16Exact({sh.d}, rng)), kn = UploadBf16(*gpu, RandomBf16Exact({sh.d}, rng));
    std::vector<int32_t> pos;
    for (int64_t r = 0; r < rows; ++r) pos.push_back(static_cast<int32_t>(std::uniform_int_distribution<int>(0, 30000)(rng)));
    Tensor positions = gpu->Upload(IntTensor(pos));
    const int64_t slots = rows * sh.hkv + 2;
    Tensor mapping_host = Tensor::Empty({rows, sh.hkv}, DType::kI64);
    for (int64_t r = 0; r < rows; ++r)
      for (int h = 0; h < sh.hkv; ++h) mapping_host.data<int64_t>()[r * sh.hkv + h] = (r * sh.hkv + h + 1) * 16 + (r * 5 + h) % 16;
    mapping_host.data<int64_t>()[rows * sh.hkv - 1] = -1;  // not stored
    Tensor mapping = gpu->Upload(mapping_host);
    const Tensor* q_norm = sh.qk_norm ? &qn : nullptr;
    const Tensor* k_norm = sh.qk_norm ? &kn : nullptr;
    auto pool = [&] { return LayerKvPool{PoisonedBf16(*gpu, {slots, 16, sh.d}), PoisonedBf16(*gpu, {slots, 16, sh.d})}; };
    // Reference on the GPU: the norm-fused GEMV, then the separate QkvRopeAppend kernel.
    LayerKvPool want_pool = pool();
    Tensor want_res = PoisonedBf16(*gpu, {rows, sh.hidden}), qkv = PoisonedBf16(*gpu, {rows, width});
    Tensor want_q = PoisonedBf16(*gpu, {rows, sh.hq, sh.d});
    gpu->AddRmsNormLinear(&x, res, &want_res, nw, 1e-6f, w, qkv);
    gpu->QkvRopeAppend(qkv, want_q, q_norm, k_norm, 1e-6f, positions, rope, mapping, want_pool);
    for (int rep = 0; rep < 3; ++rep) {
      LayerKvPool got_pool = pool();
      Tensor got_res = PoisonedBf16(*gpu, {rows, sh.hidden}), scratch = PoisonedBf16(*gpu, {rows, width});
      Tensor got_q = PoisonedBf16(*gpu, {rows, sh.hq, sh.d});
      gpu->AddRmsNormQkvRopeAppend(&x, res, &got_res, nw, 1e-6f, w, scratch, got_q, q_norm, k_norm, positions, rope,
                                   mapping, got_pool);
      ExpectIdentical(DownloadF32(*gpu, got_res), DownloadF32(*gpu, want_res));
      ExpectIdentical(DownloadF32(*gpu, got_q), DownloadF32(*gpu, want_q));
      // Unwritten slots stay NaN in both pools, so this also checks nothing else was written.
      ExpectIdentical(DownloadF32(*gpu, got_pool.k), DownloadF32(*gpu, want_pool.k));
      ExpectIdentical(DownloadF32(*gpu, got_pool.v), DownloadF32(*gpu, want_pool.v));
    }
    // The first layer's form (no x, no residual_out).
    LayerKvPool p0 = pool(), p1 = pool();
    Tensor q0 = PoisonedBf16(*gpu, {rows, sh.hq, sh.d}), q1 = PoisonedBf16(*gpu, {rows, sh.hq, sh.d});
    Tensor s0 = PoisonedBf16(*gpu, {rows, width}), s1 = PoisonedBf16(*gpu, {rows, width});
    gpu->AddRmsNormLinear(nullptr, res, nullptr, nw, 1e-6f, w, s0);
    gpu->QkvRopeAppend(s0, q0, q_norm, k_norm, 1e-6f, positions, rope, mapping, p0);
    gpu->AddRmsNormQkvRopeAppend(nullptr, res, nullptr, nw, 1e-6f, w, s1, q1, q_norm, k_norm, positions, rope, mapping, p1);
    ExpectIdentical(DownloadF32(*gpu, q1), DownloadF32(*gpu, q0));
    ExpectIdentical(DownloadF32(*gpu, p1.k), DownloadF32(*gpu, p0.k));

    // gate/up + SiLU·mul (odd widths too: the last group is partial).
    for (int64_t inter : {int64_t{1536}, int64_t{1001}}) {
      Tensor gu_w = UploadBf16(*gpu, RandomBf16Exact({2 * inter, sh.hidden}, rng, 0.05f));
      Tensor gu = PoisonedBf16(*gpu, {rows, 2 * inter}), want_act = PoisonedBf16(*gpu, {rows, inter});
      Tensor r1 = PoisonedBf16(*gpu, {rows, sh.hidden}), r2 = PoisonedBf16(*gpu, {rows, sh.hidden});
      gpu->AddRmsNormLinear(&x, res, &r1, nw, 1e-6f, gu_w, gu);
      gpu->SiluMul(gu, want_act);
      Tensor act = PoisonedBf16(*gpu, {rows, inter});
      gpu->AddRmsNormGateUpSilu(&x, res, &r2, nw, 1e-6f, gu_w, act);
      INFO("inter " << inter);
      ExpectIdentical(DownloadF32(*gpu, act), DownloadF32(*gpu, want_act));
      ExpectIdentical(DownloadF32(*gpu, r2), DownloadF32(*gpu, r1));
    }
  }
}

TEST_CASE("large uploads through pinned staging arrive intact", "[gpu][upload]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  // Not a multiple of the 32 MiB staging chunk, so the last chunk is partial.
  const int64_t n = (int64_t{3} << 24) + 12345;
  Tensor host = Tensor::Empty({n}, DType::kI32);
  std::uniform_int_distribution<int32_t> dist;
  for (int64_t i = 0; i < n; ++i) host.data<int32_t>()[i] = dist(rng);
  Tensor back = gpu->Download(gpu->Upload(host));
  REQUIRE(back.nbytes() == host.nbytes());
  CHECK(std::memcmp(back.raw(), host.raw(), host.nbytes()) == 0);
}

TEST_CASE("UploadAsync: many small uploads through the pinned ring arrive intact", "[gpu][upload]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  std::uniform_int_distribution<int32_t> dist;
  std::uniform_int_distribution<int64_t> len(1, 300000);  // up to 1.2 MB: a 2 MiB half holds one or a few
  std::vector<Tensor> hosts;
  for (int i = 0; i < 60; ++i) {
    Tensor h = Tensor::Empty({i % 7 == 0 ? 0 : len(rng)}, DType::kI32);
    for (int64_t j = 0; j < h.numel(); ++j) h.data<int32_t>()[j] = dist(rng);
    hosts.push_back(std::move(h));
  }
  // The stream is kept busy first (~tens of ms), so the uploads' DMAs run long after the host
  // has queued them: a ring half reused before its DMAs completed would be caught. Each host
  // tensor is overwritten right after its upload (the ring must have copied it), and every
  // device tensor is read back only at the end. The uploads go round both halves many times.
  Tensor busy = gpu->Empty({int64_t{1} << 28}, DType::kF32);
  for (int i = 0; i < 40; ++i) gpu->FillNormal(busy, static_cast<uint64_t>(i), 1.0f);
  std::vector<Tensor> devices;
  Tensor scratch = Tensor::Empty({300000}, DType::kI32);
  for (const Tensor& h : hosts) {
    Tensor src = scratch.Slice(0, h.numel());
    std::memcpy(src.raw(), h.raw(), h.nbytes());
    devices.push_back(gpu->UploadAsync(src));
    for (int64_t j = 0; j < src.numel(); ++j) src.data<int32_t>()[j] = -1;
  }
  for (size_t i = 0; i < hosts.size(); ++i) {
    INFO("upload " << i << " of " << hosts[i].numel() << " int32");
    Tensor back = gpu->Download(devices[i]);
    REQUIRE(back.nbytes() == hosts[i].nbytes());
    CHECK(std::memcmp(back.raw(), hosts[i].raw(), hosts[i].nbytes()) == 0);
  }
  // Larger than a half: the synchronous path.
  Tensor big = Tensor::Empty({int64_t{1} << 20}, DType::kI32);
  for (int64_t j = 0; j < big.numel(); ++j) big.data<int32_t>()[j] = dist(rng);
  Tensor back = gpu->Download(gpu->UploadAsync(big));
  CHECK(std::memcmp(back.raw(), big.raw(), big.nbytes()) == 0);
}
