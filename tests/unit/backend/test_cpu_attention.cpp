// CPU attention over head-level block tables against a plain dense attention computed
// from contiguous K/V, on random data with shuffled slots, GQA and several query tokens.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_backend.h"

using namespace oasis;

namespace {

// Dense causal attention for one sequence: q [n_q, Hq, D], k/v [n_kv, Hkv, D]; the
// queries are the last n_q positions.
std::vector<float> DenseAttention(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, int n_q, int n_kv, int hq, int hkv, int d,
                                  float scale) {
  std::vector<float> out(static_cast<size_t>(n_q * hq * d));
  for (int i = 0; i < n_q; ++i) {
    for (int j = 0; j < hq; ++j) {
      int h = j / (hq / hkv);
      int visible = n_kv - n_q + i + 1;
      std::vector<double> s(static_cast<size_t>(visible));
      double mx = -1e300;
      for (int p = 0; p < visible; ++p) {
        double dot = 0;
        for (int x = 0; x < d; ++x) dot += double(q[(i * hq + j) * d + x]) * k[(p * hkv + h) * d + x];
        s[p] = dot * scale;
        mx = std::max(mx, s[p]);
      }
      double z = 0;
      for (double& e : s) z += e = std::exp(e - mx);
      for (int x = 0; x < d; ++x) {
        double acc = 0;
        for (int p = 0; p < visible; ++p) acc += s[p] * v[(p * hkv + h) * d + x];
        out[(i * hq + j) * d + x] = static_cast<float>(acc / z);
      }
    }
  }
  return out;
}

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace

TEST_CASE("paged attention equals dense attention", "[backend][attention]") {
  std::mt19937 rng(std::random_device{}());
  CpuBackend backend;
  const int hq = 8, hkv = 2, d = 32;
  const std::vector<std::pair<int, int>> seqs = {{1, 1}, {1, 37}, {3, 50}, {16, 16}, {5, 129}};  // (n_q, n_kv)
  int64_t num_slots = 0;
  for (auto [nq, nkv] : seqs) num_slots += (nkv + kBlockSize - 1) / kBlockSize * hkv;
  num_slots += 7;  // unused slots
  LayerKvPool pool{Tensor::Zeros({num_slots, kBlockSize, d}, DType::kF32),
                   Tensor::Zeros({num_slots, kBlockSize, d}, DType::kF32)};
  std::vector<int32_t> free_slots(static_cast<size_t>(num_slots));
  std::iota(free_slots.begin(), free_slots.end(), 0);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);

  const int S = static_cast<int>(seqs.size());
  int total_q = 0, max_blocks = 0;
  for (auto [nq, nkv] : seqs) {
    total_q += nq;
    max_blocks = std::max(max_blocks, (nkv + kBlockSize - 1) / kBlockSize);
  }
  Tensor qstart = Tensor::Empty({S + 1}, DType::kI32);
  Tensor kv_lens = Tensor::Empty({S, hkv}, DType::kI32);
  Tensor tables = Tensor::Zeros({S, hkv, max_blocks}, DType::kI32);
  Tensor q = Tensor::Empty({total_q, hq, d}, DType::kF32);
  std::vector<std::vector<float>> expected;
  size_t next_slot = 0;
  int row = 0;
  for (int s = 0; s < S; ++s) {
    auto [nq, nkv] = seqs[s];
    auto qs = Random(static_cast<size_t>(nq * hq * d), rng);
    auto ks = Random(static_cast<size_t>(nkv * hkv * d), rng);
    auto vs = Random(static_cast<size_t>(nkv * hkv * d), rng);
    std::copy(qs.begin(), qs.end(), q.data<float>() + row * hq * d);
    qstart.data<int32_t>()[s] = row;
    row += nq;
    for (int h = 0; h < hkv; ++h) {
      kv_lens.data<int32_t>()[s * hkv + h] = nkv;
      for (int b = 0; b * kBlockSize < nkv; ++b) {
        int32_t slot = free_slots[next_slot++];
        tables.data<int32_t>()[(s * hkv + h) * max_blocks + b] = slot;
        for (int i = 0; i < kBlockSize && b * kBlockSize + i < nkv; ++i) {
          int p = b * kBlockSize + i;
          std::copy_n(ks.begin() + (p * hkv + h) * d, d, pool.k.data<float>() + (slot * kBlockSize + i) * d);
          std::copy_n(vs.begin() + (p * hkv + h) * d, d, pool.v.data<float>() + (slot * kBlockSize + i) * d);
        }
      }
    }
    expected.push_back(DenseAttention(qs, ks, vs, nq, nkv, hq, hkv, d, 0.125f));
  }
  qstart.data<int32_t>()[S] = row;
  AttentionMetadata meta{qstart, kv_lens, tables, 16};
  Tensor out = Tensor::Empty({total_q, hq, d}, DType::kF32);
  backend.Attention(q, pool, meta, 0.125f, out);
  row = 0;
  for (int s = 0; s < S; ++s) {
    for (size_t i = 0; i < expected[s].size(); ++i) {
      REQUIRE(out.data<float>()[row * hq * d + static_cast<int64_t>(i)] == Approx(expected[s][i]).margin(1e-5));
    }
    row += seqs[s].first;
  }
}

TEST_CASE("heads may see different KV lengths and tables", "[backend][attention]") {
  // Head 0 sees 20 tokens; head 1 sees only its 5-token table. A sparse request looks so.
  std::mt19937 rng(99);
  CpuBackend backend;
  const int d = 8;
  LayerKvPool pool{Tensor::Empty({4, kBlockSize, d}, DType::kF32), Tensor::Empty({4, kBlockSize, d}, DType::kF32)};
  auto kv = Random(static_cast<size_t>(4 * kBlockSize * d), rng);
  std::copy(kv.begin(), kv.end(), pool.k.data<float>());
  std::copy(kv.begin(), kv.end(), pool.v.data<float>());
  Tensor qstart = Tensor::Empty({2}, DType::kI32);
  qstart.data<int32_t>()[0] = 0;
  qstart.data<int32_t>()[1] = 1;
  Tensor lens = Tensor::Empty({1, 2}, DType::kI32);
  lens.data<int32_t>()[0] = 20;
  lens.data<int32_t>()[1] = 5;
  Tensor tables = Tensor::Empty({1, 2, 2}, DType::kI32);
  int32_t t[] = {2, 0, 3, 1};
  std::copy(t, t + 4, tables.data<int32_t>());
  Tensor q = Tensor::FromFloats(Random(2 * d, rng), {1, 2, d});
  Tensor out = Tensor::Empty({1, 2, d}, DType::kF32);
  backend.Attention(q, pool, {qstart, lens, tables, 1}, 0.5f, out);
  // Head 1 attends to slot 3, tokens 0..4 only.
  std::vector<float> qh(q.data<float>() + d, q.data<float>() + 2 * d);
  std::vector<float> k1(pool.k.data<float>() + 3 * kBlockSize * d, pool.k.data<float>() + (3 * kBlockSize + 5) * d);
  auto ref = DenseAttention(qh, k1, k1, 1, 5, 1, 1, d, 0.5f);
  for (int x = 0; x < d; ++x) CHECK(out.data<float>()[d + x] == Approx(ref[x]).margin(1e-5));
}
