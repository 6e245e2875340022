// The CPU reference's FP8 KV pools (backend.h, LayerKvPool): appends quantize value / scale[h]
// (round to nearest even, saturating) and track |max|; attention equals attention over an F32
// pool holding the dequantized values; summaries are in stored units; copies move bytes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_backend.h"

using namespace oasis;

namespace {

std::vector<float> Random(size_t n, std::mt19937& rng, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

LayerKvPool Fp8Pool(int64_t slots, int64_t d, const std::vector<float>& ks,
                    const std::vector<float>& vs) {
  LayerKvPool p{Tensor::Zeros({slots, kBlockSize, d}, DType::kF8E4M3),
                Tensor::Zeros({slots, kBlockSize, d}, DType::kF8E4M3)};
  const int64_t h = static_cast<int64_t>(ks.size());
  p.k_scale = Tensor::FromFloats(ks, {h});
  p.v_scale = Tensor::FromFloats(vs, {h});
  p.k_amax = Tensor::Zeros({h}, DType::kF32);
  p.v_amax = Tensor::Zeros({h}, DType::kF32);
  return p;
}

}  // namespace

TEST_CASE("FP8 KV append quantizes per KV head; attention reads the dequantized values",
          "[backend][attention][fp8]") {
  std::mt19937 rng(std::random_device{}());
  CpuBackend backend;
  const int hq = 8, hkv = 2, d = 32, n = 45;  // three blocks per head, the last partial
  const int blocks = (n + kBlockSize - 1) / kBlockSize;
  const int64_t slots = blocks * hkv + 3;
  // Head 1's scale is so small that some of its values saturate.
  const std::vector<float> ks = {0.02f, 0.004f}, vs = {0.01f, 0.03f};
  LayerKvPool pool = Fp8Pool(slots, d, ks, vs);
  std::vector<int32_t> order(static_cast<size_t>(slots));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  Tensor tables = Tensor::Zeros({1, hkv, blocks}, DType::kI32);
  Tensor mapping = Tensor::Empty({n, hkv}, DType::kI64);
  for (int h = 0; h < hkv; ++h)
    for (int b = 0; b < blocks; ++b) tables.data<int32_t>()[h * blocks + b] = order[h * blocks + b];
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < hkv; ++h)
      mapping.data<int64_t>()[t * hkv + h] =
          int64_t{tables.data<int32_t>()[h * blocks + t / kBlockSize]} * kBlockSize +
          t % kBlockSize;
  Tensor k = Tensor::FromFloats(Random(size_t{n} * hkv * d, rng, 2.0f), {n, hkv, d});
  Tensor v = Tensor::FromFloats(Random(size_t{n} * hkv * d, rng, 1.0f), {n, hkv, d});
  k.data<float>()[5] = std::nanf("");  // NaN is stored as NaN and does not raise the maximum
  backend.KvAppend(k, v, mapping, pool);

  // Stored bytes and maxima.
  std::vector<float> amax_k(hkv, 0.0f), amax_v(hkv, 0.0f);
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < hkv; ++h) {
      const int64_t row = mapping.data<int64_t>()[t * hkv + h];
      for (int x = 0; x < d; ++x) {
        const float kx = k.data<float>()[(t * hkv + h) * d + x];
        const float vx = v.data<float>()[(t * hkv + h) * d + x];
        REQUIRE(pool.k.data<uint8_t>()[row * d + x] == FloatToFp8E4M3(kx / ks[h]));
        REQUIRE(pool.v.data<uint8_t>()[row * d + x] == FloatToFp8E4M3(vx / vs[h]));
        if (!std::isnan(kx)) amax_k[h] = std::max(amax_k[h], std::fabs(kx));
        amax_v[h] = std::max(amax_v[h], std::fabs(vx));
      }
    }
  }
  for (int h = 0; h < hkv; ++h) {
    CHECK(pool.k_amax.data<float>()[h] == amax_k[h]);
    CHECK(pool.v_amax.data<float>()[h] == amax_v[h]);
  }
  CHECK(amax_k[1] / ks[1] > kFp8E4M3Max);  // head 1 did saturate
  REQUIRE((pool.k.data<uint8_t>()[mapping.data<int64_t>()[0] * d + 5] & 0x7f) == 0x7f);
  pool.k.data<uint8_t>()[mapping.data<int64_t>()[0] * d + 5] = 0;  // the NaN out of the way

  // Attention over the FP8 pool == attention over an F32 pool of the dequantized values.
  LayerKvPool ref{Tensor::Zeros({slots, kBlockSize, d}, DType::kF32),
                  Tensor::Zeros({slots, kBlockSize, d}, DType::kF32)};
  for (int64_t s = 0; s < slots; ++s) {
    const bool head1 = std::find(order.begin() + blocks, order.begin() + 2 * blocks,
                                 static_cast<int32_t>(s)) != order.begin() + 2 * blocks;
    for (int64_t i = 0; i < kBlockSize * d; ++i) {
      const int64_t at = s * kBlockSize * d + i;
      ref.k.data<float>()[at] = Fp8E4M3ToFloat(pool.k.data<uint8_t>()[at]) * ks[head1 ? 1 : 0];
      ref.v.data<float>()[at] = Fp8E4M3ToFloat(pool.v.data<uint8_t>()[at]) * vs[head1 ? 1 : 0];
    }
  }
  const int nq = 3;
  Tensor q = Tensor::FromFloats(Random(size_t{nq} * hq * d, rng, 1.0f), {nq, hq, d});
  Tensor qstart = Tensor::FromInts({0, nq});
  Tensor lens = Tensor::FromInts({n, n - 7}).Reshape({1, hkv});  // heads of different lengths
  AttentionMetadata meta{qstart, lens, tables, nq};
  Tensor got = Tensor::Empty({nq, hq, d}, DType::kF32),
         want = Tensor::Empty({nq, hq, d}, DType::kF32);
  backend.Attention(q, pool, meta, 0.17f, got);
  backend.Attention(q, ref, meta, 0.17f, want);
  for (int64_t i = 0; i < got.numel(); ++i) REQUIRE(got.data<float>()[i] == want.data<float>()[i]);

  // Summaries in stored units (unscaled e4m3 values), for a full and a partial block.
  Tensor src = Tensor::FromInts({order[0], order[blocks - 1]});
  Tensor count = Tensor::FromInts({kBlockSize, n % kBlockSize});
  Tensor dst = Tensor::FromInts({1, 0});
  Tensor kmin = Tensor::Empty({2, d}, DType::kF32), kmax = Tensor::Empty({2, d}, DType::kF32);
  backend.BlockSummaries(pool, src, count, dst, kmin, kmax);
  for (int e = 0; e < 2; ++e) {
    const int32_t slot = src.data<int32_t>()[e], row = dst.data<int32_t>()[e];
    for (int x = 0; x < d; ++x) {
      float lo = 1e30f, hi = -1e30f;
      for (int j = 0; j < count.data<int32_t>()[e]; ++j) {
        const float f = Fp8E4M3ToFloat(pool.k.data<uint8_t>()[(slot * kBlockSize + j) * d + x]);
        lo = std::min(lo, f);
        hi = std::max(hi, f);
      }
      REQUIRE(kmin.data<float>()[row * d + x] == lo);
      REQUIRE(kmax.data<float>()[row * d + x] == hi);
    }
  }

  // Copies move bytes: blocks into a host-store-like pool (no scales), then tokens back.
  LayerKvPool host{Tensor::Zeros({4, kBlockSize, d}, DType::kF8E4M3),
                   Tensor::Zeros({4, kBlockSize, d}, DType::kF8E4M3)};
  backend.CopyBlocks(pool, Tensor::FromInts({order[1], order[2]}), host, Tensor::FromInts({3, 0}));
  CHECK(std::equal(host.k.data<uint8_t>() + 3 * kBlockSize * d,
                   host.k.data<uint8_t>() + 4 * kBlockSize * d,
                   pool.k.data<uint8_t>() + order[1] * kBlockSize * d));
  CHECK(std::equal(host.v.data<uint8_t>(), host.v.data<uint8_t>() + kBlockSize * d,
                   pool.v.data<uint8_t>() + order[2] * kBlockSize * d));
  Tensor from = Tensor::Empty({1}, DType::kI64), to = Tensor::Empty({1}, DType::kI64);
  from.data<int64_t>()[0] = 3 * kBlockSize + 2;
  to.data<int64_t>()[0] = int64_t{order.back()} * kBlockSize + 9;
  backend.CopyTokens(host, from, pool, to);
  CHECK(std::equal(pool.k.data<uint8_t>() + to.data<int64_t>()[0] * d,
                   pool.k.data<uint8_t>() + (to.data<int64_t>()[0] + 1) * d,
                   host.k.data<uint8_t>() + from.data<int64_t>()[0] * d));
}

TEST_CASE("FP8 summaries: e4m3 rows hold the stored min/max exactly and score like F32 rows",
          "[backend][sparse][fp8]") {
  std::mt19937 rng(std::random_device{}());
  CpuBackend backend;
  const int hq = 4, hkv = 2, d = 16, slots = 12;
  LayerKvPool pool = Fp8Pool(slots, d, {0.01f, 0.02f}, {1.0f, 1.0f});
  for (int64_t i = 0; i < pool.k.numel(); ++i) {
    pool.k.data<uint8_t>()[i] = FloatToFp8E4M3(std::normal_distribution<float>(0, 3)(rng));
  }
  std::vector<int32_t> src(slots), len(slots), dst(slots);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(dst.begin(), dst.end(), rng);
  for (int32_t& n : len) n = std::uniform_int_distribution<int>(1, kBlockSize)(rng);
  Tensor lo8 = Tensor::Empty({slots, d}, DType::kF8E4M3),
         hi8 = Tensor::Empty({slots, d}, DType::kF8E4M3);
  Tensor lo = Tensor::Empty({slots, d}, DType::kF32), hi = Tensor::Empty({slots, d}, DType::kF32);
  backend.BlockSummaries(pool, Tensor::FromInts(src), Tensor::FromInts(len), Tensor::FromInts(dst),
                         lo8, hi8);
  backend.BlockSummaries(pool, Tensor::FromInts(src), Tensor::FromInts(len), Tensor::FromInts(dst),
                         lo, hi);
  for (int64_t i = 0; i < lo.numel(); ++i) {
    REQUIRE(Fp8E4M3ToFloat(lo8.data<uint8_t>()[i]) == lo.data<float>()[i]);
    REQUIRE(Fp8E4M3ToFloat(hi8.data<uint8_t>()[i]) == hi.data<float>()[i]);
  }
  // Two rows of 6 blocks each over the summary rows in a shuffled order.
  const int R = 2, mb = 6;
  Tensor q = Tensor::FromFloats(Random(size_t{3} * hq * d, rng, 1.0f), {3, hq, d});
  Tensor tables = Tensor::Empty({R, hkv, mb}, DType::kI32);
  for (int64_t i = 0; i < tables.numel(); ++i)
    tables.data<int32_t>()[i] = dst[static_cast<size_t>(i % slots)];
  for (GroupReduce reduce : {GroupReduce::kSum, GroupReduce::kMax}) {
    Tensor s8 = Tensor::Zeros({R, hkv, mb}, DType::kF32),
           s32 = Tensor::Zeros({R, hkv, mb}, DType::kF32);
    const Tensor rows = Tensor::FromInts({2, 0}), nb = Tensor::FromInts({mb, mb - 2});
    backend.ScoreBlocks(q, rows, nb, tables, lo8, hi8, reduce, s8);
    backend.ScoreBlocks(q, rows, nb, tables, lo, hi, reduce, s32);
    for (int64_t i = 0; i < s8.numel(); ++i) REQUIRE(s8.data<float>()[i] == s32.data<float>()[i]);
  }
}
