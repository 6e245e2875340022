// Helpers for GPU tests: random bf16-exact inputs, host<->device bf16 copies, and a
// comparison with abs + rel tolerance that reports the worst element.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "oasis/tensor.h"

namespace oasis::testing {

// Host F32 tensor with N(0, stddev) values rounded to bf16 (so both backends see the same).
inline Tensor RandomBf16Exact(std::vector<int64_t> shape, std::mt19937& rng, float stddev = 1.0f) {
  Tensor t = Tensor::Empty(std::move(shape), DType::kF32);
  std::normal_distribution<float> dist(0.0f, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = Bf16BitsToFloat(FloatToBf16Bits(dist(rng)));
  return t;
}

inline Tensor ToBf16Host(const Tensor& f32) {
  Tensor b = Tensor::Empty(f32.shape(), DType::kBF16);
  ConvertFromFloat(f32.data<float>(), b.raw(), DType::kBF16, static_cast<size_t>(f32.numel()));
  return b;
}

inline Tensor UploadBf16(CudaBackend& backend, const Tensor& f32) { return backend.Upload(ToBf16Host(f32)); }

inline Tensor DownloadF32(CudaBackend& backend, const Tensor& device) {
  Tensor host = backend.Download(device);
  return host.dtype() == DType::kF32 ? host : host.ToFloat();
}

// A device tensor filled with NaN (bf16 0x7fc0) so unwritten outputs are caught.
inline Tensor PoisonedBf16(CudaBackend& backend, std::vector<int64_t> shape) {
  Tensor host = Tensor::Empty(std::move(shape), DType::kBF16);
  for (int64_t i = 0; i < host.numel(); ++i) host.data<uint16_t>()[i] = 0x7fc0;
  return backend.Upload(host);
}

// Every |got - want| <= atol + rtol * |want|; fails naming the worst index.
inline void ExpectClose(const Tensor& got, const Tensor& want, double atol, double rtol) {
  REQUIRE(got.numel() == want.numel());
  double worst = 0;
  int64_t worst_i = -1;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.data<float>()[i], w = want.data<float>()[i];
    const double excess = std::isfinite(g) ? std::fabs(g - w) - (atol + rtol * std::fabs(w)) : INFINITY;
    if (excess > worst) {
      worst = excess;
      worst_i = i;
    }
  }
  INFO("worst element " << worst_i << ": got " << (worst_i >= 0 ? got.data<float>()[worst_i] : 0.f) << " want "
                        << (worst_i >= 0 ? want.data<float>()[worst_i] : 0.f));
  CHECK(worst_i == -1);
}

}  // namespace oasis::testing
