// The CPU reference's mixture-of-experts ops (Backend::MoeRoute, MoeExperts) against
// hand-computed values and a naive per-token implementation in double.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_backend.h"

using namespace oasis;

namespace {

std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = scale * dist(rng);
  return v;
}

// out[t] = Σ_j w[t, j] · down[e] (SiLU(gate[e] x) ⊙ up[e] x), in double.
std::vector<double> NaiveExperts(const std::vector<float>& x, const std::vector<int32_t>& ids,
                                 const std::vector<float>& w, const std::vector<float>& gate_up,
                                 const std::vector<float>& down, int64_t T, int64_t k, int64_t I,
                                 int64_t H) {
  std::vector<double> out(static_cast<size_t>(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[t * k + j];
      std::vector<double> act(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < H; ++c) {
          g += static_cast<double>(gate_up[(e * 2 * I + i) * H + c]) * x[t * H + c];
          u += static_cast<double>(gate_up[(e * 2 * I + I + i) * H + c]) * x[t * H + c];
        }
        act[i] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t r = 0; r < H; ++r) {
        double y = 0;
        for (int64_t i = 0; i < I; ++i)
          y += static_cast<double>(down[(e * H + r) * I + i]) * act[i];
        out[t * H + r] += w[t * k + j] * y;
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("MoeRoute: softmax top-k, ties to the lower index, optional renormalisation",
          "[backend][moe]") {
  CpuBackend b(1);
  // x = [1, 0]: the router logits are the routers' first column: 0.5, 2, 2, -1.
  Tensor x = Tensor::FromFloats({1, 0}, {1, 2});
  Tensor router = Tensor::FromFloats({0.5f, 9, 2, 9, 2, 9, -1, 9}, {4, 2});
  const double z = std::exp(0.5) + 2 * std::exp(2.0) + std::exp(-1.0);
  const double p_hi = std::exp(2.0) / z, p_mid = std::exp(0.5) / z;
  for (int64_t k : {1, 2, 3, 4}) {
    for (MoeTopKWeights mode : {MoeTopKWeights::kSoftmax, MoeTopKWeights::kRenormalized}) {
      INFO("k " << k << " renormalized " << (mode == MoeTopKWeights::kRenormalized));
      Tensor ids = Tensor::Empty({1, k}, DType::kI32), w = Tensor::Empty({1, k}, DType::kF32);
      b.MoeRoute(x, router, k, mode, ids, w);
      const int32_t want_ids[] = {1, 2, 0, 3};  // experts 1 and 2 tie: 1 first
      const double p[] = {p_hi, p_hi, p_mid, std::exp(-1.0) / z};
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += p[j];
      for (int64_t j = 0; j < k; ++j) {
        CHECK(ids.data<int32_t>()[j] == want_ids[j]);
        const double want = mode == MoeTopKWeights::kRenormalized ? p[j] / sum : p[j];
        CHECK(w.data<float>()[j] == Approx(want).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("MoeRoute matches a naive router on random tokens", "[backend][moe]") {
  CpuBackend b(2);
  std::mt19937 rng(std::random_device{}());
  const int64_t T = 9, H = 24, E = 8;
  const std::vector<float> xv = Random(T * H, rng), rv = Random(E * H, rng, 0.5f);
  Tensor x = Tensor::FromFloats(xv, {T, H}), router = Tensor::FromFloats(rv, {E, H});
  for (int64_t k : {1, 2, 5}) {
    Tensor ids = Tensor::Empty({T, k}, DType::kI32), w = Tensor::Empty({T, k}, DType::kF32);
    b.MoeRoute(x, router, k, MoeTopKWeights::kRenormalized, ids, w);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> p(E);
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t c = 0; c < H; ++c) p[e] += static_cast<double>(rv[e * H + c]) * xv[t * H + c];
      }
      std::vector<int64_t> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t c) { return p[a] > p[c]; });
      double chosen = 0;
      const double max = p[order[0]];
      for (int64_t j = 0; j < k; ++j) chosen += std::exp(p[order[j]] - max);
      for (int64_t j = 0; j < k; ++j) {
        INFO("token " << t << " k " << k << " slot " << j);
        CHECK(ids.data<int32_t>()[t * k + j] == order[j]);
        CHECK(w.data<float>()[t * k + j] ==
              Approx(std::exp(p[order[j]] - max) / chosen).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("AddRmsNormMoeRoute equals AddRmsNorm then MoeRoute bit for bit", "[backend][moe]") {
  CpuBackend b(2);
  std::mt19937 rng(std::random_device{}());
  const int64_t T = 5, H = 32, E = 8, k = 3;
  Tensor x = Tensor::FromFloats(Random(T * H, rng), {T, H});
  const std::vector<float> res = Random(T * H, rng);
  Tensor nw = Tensor::FromFloats(Random(H, rng, 0.5f), {H});
  Tensor router = Tensor::FromFloats(Random(E * H, rng, 0.5f), {E, H});
  for (MoeTopKWeights mode : {MoeTopKWeights::kSoftmax, MoeTopKWeights::kRenormalized}) {
    // The layer's previous form: the residual updated in place, then routing of the norm.
    Tensor in_place = Tensor::FromFloats(res, {T, H});
    Tensor want_normed = Tensor::Empty({T, H}, DType::kF32);
    b.AddRmsNorm(x, in_place, nw, 1e-6f, want_normed);
    Tensor want_ids = Tensor::Empty({T, k}, DType::kI32),
           want_w = Tensor::Empty({T, k}, DType::kF32);
    b.MoeRoute(want_normed, router, k, mode, want_ids, want_w);

    Tensor residual = Tensor::FromFloats(res, {T, H}),
           residual_out = Tensor::Empty({T, H}, DType::kF32);
    Tensor normed = Tensor::Empty({T, H}, DType::kF32);
    Tensor ids = Tensor::Empty({T, k}, DType::kI32), w = Tensor::Empty({T, k}, DType::kF32);
    b.AddRmsNormMoeRoute(x, residual, residual_out, nw, 1e-6f, router, k, mode, normed, ids, w);
    CHECK(std::memcmp(residual_out.raw(), in_place.raw(), in_place.nbytes()) == 0);
    CHECK(std::memcmp(residual.data<float>(), res.data(), res.size() * sizeof(float)) ==
          0);  // unchanged
    CHECK(std::memcmp(normed.raw(), want_normed.raw(), normed.nbytes()) == 0);
    CHECK(std::memcmp(ids.raw(), want_ids.raw(), ids.nbytes()) == 0);
    CHECK(std::memcmp(w.raw(), want_w.raw(), w.nbytes()) == 0);
  }
}

TEST_CASE("MoeExperts matches a naive per-token loop; tokens are independent", "[backend][moe]") {
  CpuBackend b(2);
  std::mt19937 rng(std::random_device{}());
  const int64_t T = 11, H = 20, E = 5, I = 6;
  const std::vector<float> xv = Random(T * H, rng), gu = Random(E * 2 * I * H, rng, 0.3f),
                           dn = Random(E * H * I, rng, 0.3f);
  Tensor x = Tensor::FromFloats(xv, {T, H});
  Tensor gate_up = Tensor::FromFloats(gu, {E, 2 * I, H}), down = Tensor::FromFloats(dn, {E, H, I});
  for (int64_t k : {1, 3}) {
    INFO("k " << k);
    // Random distinct experts per token (expert 4 never used when k == 1), random weights.
    std::vector<int32_t> ids;
    std::vector<float> w;
    std::uniform_real_distribution<float> unit(0.05f, 1.0f);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> all(static_cast<size_t>(k == 1 ? E - 1 : E));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t j = 0; j < k; ++j) {
        ids.push_back(all[j]);
        w.push_back(unit(rng));
      }
    }
    Tensor idt = Tensor::Empty({T, k}, DType::kI32);
    std::memcpy(idt.raw(), ids.data(), ids.size() * sizeof(int32_t));
    Tensor wt = Tensor::FromFloats(w, {T, k});
    Tensor out = Tensor::Empty({T, H}, DType::kF32);
    b.MoeExperts(x, idt, wt, gate_up, down, out);
    const std::vector<double> ref = NaiveExperts(xv, ids, w, gu, dn, T, k, I, H);
    double num = 0, den = 0;
    for (int64_t i = 0; i < T * H; ++i) {
      num += (out.data<float>()[i] - ref[i]) * (out.data<float>()[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    CHECK(std::sqrt(num / den) <= 1e-6);
    // Each token alone gives bit-identical rows (no dependence on the batch).
    for (int64_t t = 0; t < T; ++t) {
      Tensor one = Tensor::Empty({1, H}, DType::kF32);
      b.MoeExperts(x.Slice(t, t + 1), idt.Slice(t, t + 1), wt.Slice(t, t + 1), gate_up, down, one);
      CHECK(std::memcmp(one.raw(), out.data<float>() + t * H, H * sizeof(float)) == 0);
    }
    // Tensor parallelism: two halves of every expert's intermediate size sum to the whole.
    Tensor sum = Tensor::Zeros({T, H}, DType::kF32);
    for (int half = 0; half < 2; ++half) {
      const int64_t hi = I / 2;
      std::vector<float> gu_half, dn_half;
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t part = 0; part < 2; ++part) {  // gate rows, then up rows
          const float* rows = gu.data() + (e * 2 * I + part * I + half * hi) * H;
          gu_half.insert(gu_half.end(), rows, rows + hi * H);
        }
        for (int64_t r = 0; r < H; ++r) {
          const float* cols = dn.data() + (e * H + r) * I + half * hi;
          dn_half.insert(dn_half.end(), cols, cols + hi);
        }
      }
      Tensor partial = Tensor::Empty({T, H}, DType::kF32);
      b.MoeExperts(x, idt, wt, Tensor::FromFloats(gu_half, {E, 2 * hi, H}),
                   Tensor::FromFloats(dn_half, {E, H, hi}), partial);
      b.Add(sum, partial, sum);
    }
    for (int64_t i = 0; i < T * H; ++i)
      CHECK(sum.data<float>()[i] == Approx(out.data<float>()[i]).margin(1e-5));
  }
}
