#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/rope.h"

using namespace oasis;

TEST_CASE("RmsNorm and AddRmsNorm", "[backend]") {
  CpuBackend b;
  Tensor x = Tensor::FromFloats({1, 2, 3, 4, -1, 0, 0, 1}, {2, 4});
  Tensor w = Tensor::FromFloats({1, 0.5f, 2, 1}, {4});
  Tensor out = Tensor::Empty({2, 4}, DType::kF32);
  b.RmsNorm(x, w, 0.0f, out);
  const float inv = 1.0f / std::sqrt(7.5f);
  CHECK(out.data<float>()[0] == Approx(1 * inv));
  CHECK(out.data<float>()[1] == Approx(0.5f * 2 * inv));
  CHECK(out.data<float>()[2] == Approx(2 * 3 * inv));
  Tensor residual = Tensor::FromFloats({1, 1, 1, 1, 1, 1, 1, 1}, {2, 4});
  b.AddRmsNorm(x, residual, w, 1e-6f, out);
  CHECK(residual.data<float>()[3] == 5.0f);  // residual updated in place
  CHECK(residual.data<float>()[4] == 0.0f);
}

TEST_CASE("Linear is x · Wᵀ for every shape", "[backend]") {
  CpuBackend b(2);
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> dist;
  for (auto [rows, in, outf] : {std::tuple{1, 3, 2}, std::tuple{5, 17, 9}, std::tuple{64, 256, 300}}) {
    std::vector<float> xv(rows * in), wv(outf * in);
    for (float& v : xv) v = dist(rng);
    for (float& v : wv) v = dist(rng);
    Tensor x = Tensor::FromFloats(xv, {rows, in}), w = Tensor::FromFloats(wv, {outf, in});
    Tensor out = Tensor::Empty({rows, outf}, DType::kF32);
    b.Linear(x, w, out);
    for (int r = 0; r < rows; ++r) {
      for (int f = 0; f < outf; ++f) {
        double ref = 0;
        for (int i = 0; i < in; ++i) ref += double(xv[r * in + i]) * wv[f * in + i];
        REQUIRE(out.data<float>()[r * outf + f] == Approx(ref).margin(1e-4));
      }
    }
  }
}

TEST_CASE("SiluMul and SplitQkv", "[backend]") {
  CpuBackend b;
  Tensor gu = Tensor::FromFloats({1, -2, 3, 4}, {1, 4});
  Tensor out = Tensor::Empty({1, 2}, DType::kF32);
  b.SiluMul(gu, out);
  CHECK(out.data<float>()[0] == Approx(1 / (1 + std::exp(-1.0)) * 3));
  CHECK(out.data<float>()[1] == Approx(-2 / (1 + std::exp(2.0)) * 4));
  Tensor qkv = Tensor::FromFloats({0, 1, 2, 3, 4, 5, 6, 7}, {1, 8});
  Tensor q = Tensor::Empty({1, 2, 2}, DType::kF32), k = Tensor::Empty({1, 1, 2}, DType::kF32),
         v = Tensor::Empty({1, 1, 2}, DType::kF32);
  b.SplitQkv(qkv, q, k, v);
  CHECK(q.data<float>()[3] == 3);
  CHECK(k.data<float>()[0] == 4);
  CHECK(v.data<float>()[1] == 7);
}

TEST_CASE("RoPE rotates pairs (i, i + d/2) by position × inv_freq", "[backend][rope]") {
  ModelConfig c;
  c.head_dim = 4;
  c.rope_theta = 10000;
  RopeParams rope = ComputeRopeParams(c);
  REQUIRE(rope.inv_freq.size() == 2);
  CHECK(rope.inv_freq[0] == 1.0f);
  CHECK(rope.inv_freq[1] == Approx(0.01f));
  CpuBackend b;
  Tensor q = Tensor::FromFloats({1, 0, 0, 0}, {1, 1, 4});
  Tensor k = Tensor::FromFloats({0, 0, 1, 0}, {1, 1, 4});
  Tensor pos = Tensor::Empty({1}, DType::kI32);
  pos.data<int32_t>()[0] = 3;
  b.QkNormRope(q, k, nullptr, nullptr, 1e-6f, pos, rope);
  CHECK(q.data<float>()[0] == Approx(std::cos(3.0)));
  CHECK(q.data<float>()[2] == Approx(std::sin(3.0)));
  CHECK(k.data<float>()[0] == Approx(-std::sin(3.0)));
  CHECK(k.data<float>()[2] == Approx(std::cos(3.0)));
}

TEST_CASE("llama3 rope scaling leaves high frequencies and divides low ones", "[rope]") {
  ModelConfig c;
  c.head_dim = 128;
  c.rope_theta = 500000;
  RopeParams plain = ComputeRopeParams(c);
  c.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 8192};
  RopeParams scaled = ComputeRopeParams(c);
  // wavelength < 8192/4: unchanged; > 8192: divided by the factor; between: interpolated.
  for (size_t i = 0; i < plain.inv_freq.size(); ++i) {
    double wavelen = 2 * M_PI / plain.inv_freq[i];
    if (wavelen < 2048) {
      CHECK(scaled.inv_freq[i] == plain.inv_freq[i]);
    } else if (wavelen > 8192) {
      CHECK(scaled.inv_freq[i] == Approx(plain.inv_freq[i] / 8.0));
    } else {
      CHECK(scaled.inv_freq[i] < plain.inv_freq[i]);
      CHECK(scaled.inv_freq[i] > plain.inv_freq[i] / 8.0);
    }
  }
}
