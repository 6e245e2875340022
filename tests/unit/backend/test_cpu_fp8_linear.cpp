// The CPU reference's e4m3 weights (an FP8 checkpoint's linear weights kept in e4m3 with block
// scales, docs/fp8.md "FP8 weights"): Linear, and the fused ops built on it, equal, bit for
// bit, the same ops on the F32 weight holding float(e4m3) * scale (what DequantizeFp8Weights
// loads), for shapes and blocks that divide nothing and for several threads; FillNormal of an
// F8E4M3 tensor quantizes FillNormal's values.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"

using namespace oasis;

namespace {

struct Fp8Weight {
  Tensor codes;        // [out, in] F8E4M3 with block scales
  Tensor dequantized;  // [out, in] F32: float(code) * scale
};

// Random finite codes and positive scales in blocks of br x bc.
Fp8Weight RandomFp8Weight(int64_t out, int64_t in, int br, int bc, std::mt19937& rng) {
  Tensor codes = Tensor::Empty({out, in}, DType::kF8E4M3);
  for (int64_t i = 0; i < codes.numel(); ++i) {
    uint8_t c;
    do c = static_cast<uint8_t>(rng() & 0xff);
    while ((c & 0x7f) == 0x7f);  // NaN
    codes.data<uint8_t>()[i] = c;
  }
  std::uniform_real_distribution<float> scale(1e-4f, 3e-2f);
  Tensor scales = Tensor::Empty({(out + br - 1) / br, (in + bc - 1) / bc}, DType::kF32);
  for (int64_t i = 0; i < scales.numel(); ++i) scales.data<float>()[i] = scale(rng);
  Tensor deq = Tensor::Empty({out, in}, DType::kF32);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      deq.data<float>()[o * in + i] = Fp8E4M3ToFloat(codes.data<uint8_t>()[o * in + i]) *
                                      scales.data<float>()[(o / br) * scales.dim(1) + i / bc];
    }
  }
  return {codes.WithBlockScales(scales, br, bc), deq};
}

Tensor RandomF32(std::vector<int64_t> shape, std::mt19937& rng) {
  Tensor t = Tensor::Empty(std::move(shape), DType::kF32);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

bool BitEqual(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("CPU Linear with e4m3 weights equals Linear with the dequantized weights",
          "[backend][fp8]") {
  std::mt19937 rng(std::random_device{}());
  struct Case {
    int64_t rows, out, in;
    int br, bc;
    int threads;
  };
  for (const Case& c : {Case{1, 37, 53, 16, 8, 1}, Case{5, 130, 257, 128, 128, 1},
                        Case{9, 64, 40, 48, 24, 3}, Case{33, 300, 520, 128, 128, 4},
                        Case{2, 7, 5, 128, 128, 2}, Case{4, 256, 384, 128, 128, 8}}) {
    INFO("rows " << c.rows << " out " << c.out << " in " << c.in << " blocks " << c.br << "x"
                 << c.bc << " threads " << c.threads);
    CpuBackend backend(c.threads);
    CHECK(backend.Fp8WeightSupported(c.out, c.in, c.br, c.bc));
    const Fp8Weight w = RandomFp8Weight(c.out, c.in, c.br, c.bc, rng);
    const Tensor x = RandomF32({c.rows, c.in}, rng);
    Tensor got = Tensor::Empty({c.rows, c.out}, DType::kF32);
    Tensor want = Tensor::Empty({c.rows, c.out}, DType::kF32);
    backend.Linear(x, w.codes, got);
    backend.Linear(x, w.dequantized, want);
    CHECK(BitEqual(got, want));
  }
}

TEST_CASE("CPU fused linear ops take e4m3 weights", "[backend][fp8]") {
  std::mt19937 rng(std::random_device{}());
  CpuBackend backend;
  const int64_t T = 3, hidden = 96, inter = 80;
  const Fp8Weight gate_up = RandomFp8Weight(2 * inter, hidden, 32, 32, rng);
  const Fp8Weight down = RandomFp8Weight(hidden, inter, 32, 32, rng);
  const Tensor x = RandomF32({T, hidden}, rng), residual = RandomF32({T, hidden}, rng);
  const Tensor norm = RandomF32({hidden}, rng);
  // AddRmsNormGateUpSilu, then SiluMulLinear on its input.
  Tensor r1 = Tensor::Empty({T, hidden}, DType::kF32), r2 = r1.Clone();
  Tensor a1 = Tensor::Empty({T, inter}, DType::kF32), a2 = a1.Clone();
  backend.AddRmsNormGateUpSilu(&x, residual, &r1, norm, 1e-6f, gate_up.codes, a1);
  backend.AddRmsNormGateUpSilu(&x, residual, &r2, norm, 1e-6f, gate_up.dequantized, a2);
  CHECK(BitEqual(r1, r2));
  CHECK(BitEqual(a1, a2));
  const Tensor gu = RandomF32({T, 2 * inter}, rng);
  Tensor o1 = Tensor::Empty({T, hidden}, DType::kF32), o2 = o1.Clone();
  backend.SiluMulLinear(gu, down.codes, o1);
  backend.SiluMulLinear(gu, down.dequantized, o2);
  CHECK(BitEqual(o1, o2));
}

TEST_CASE("CPU FillNormal of an F8E4M3 tensor quantizes the F32 fill", "[backend][fp8]") {
  CpuBackend backend;
  Tensor q = Tensor::Empty({7, 33}, DType::kF8E4M3), f = Tensor::Empty({7, 33}, DType::kF32);
  backend.FillNormal(q, 42, 64.0f);
  backend.FillNormal(f, 42, 64.0f);
  int saturated = 0;
  for (int64_t i = 0; i < q.numel(); ++i) {
    REQUIRE(q.data<uint8_t>()[i] == FloatToFp8E4M3(f.data<float>()[i]));
    saturated += (q.data<uint8_t>()[i] & 0x7f) == 0x7e;
  }
  CHECK(saturated < 3);  // 448 is 7 sigma
  CpuBackend refusing(0, CpuFp8Weights::kDequantizeAtLoad);
  CHECK_FALSE(refusing.Fp8WeightSupported(128, 128, 128, 128));
}
