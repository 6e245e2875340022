// Helpers for GPU tests: random bf16-exact inputs, host<->device bf16 copies, a comparison
// with abs + rel tolerance that reports the worst element, and the small sparse-KV setting and
// random prompts of the sparse decoding tests.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "kvcache/sparse_config.h"
#include "oasis/model_config.h"
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

// Every |got - want| <= atol[i] + rtol * |want|, atol[i] = atol_of(i); fails naming the worst
// index (non-finite got values fail).
template <typename Atol>
void ExpectCloseBy(const Tensor& got, const Tensor& want, Atol&& atol_of, double rtol) {
  REQUIRE(got.numel() == want.numel());
  double worst = 0;
  int64_t worst_i = -1;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.data<float>()[i], w = want.data<float>()[i];
    const double excess = std::isfinite(g) ? std::fabs(g - w) - (atol_of(i) + rtol * std::fabs(w)) : INFINITY;
    if (excess > worst) {
      worst = excess;
      worst_i = i;
    }
  }
  INFO("worst element " << worst_i << ": got " << (worst_i >= 0 ? got.data<float>()[worst_i] : 0.f) << " want "
                        << (worst_i >= 0 ? want.data<float>()[worst_i] : 0.f));
  CHECK(worst_i == -1);
}

// Every |got - want| <= atol + rtol * |want|; fails naming the worst index.
inline void ExpectClose(const Tensor& got, const Tensor& want, double atol, double rtol) {
  ExpectCloseBy(got, want, [atol](int64_t) { return atol; }, rtol);
}

// RoPE outputs against the float32 reference, head by head (rows of `head_dim` values): every
// |got - want| <= 2^-6 · max|want| over the head + 2e-2 · |want|. The device rounds the normed
// values and cos/sin to bf16 before the rotation (HF's bf16 path), so an output that cancels two
// large products (a·cos - b·sin) carries an error of a few bf16 ulps of the head's largest
// values, not of its own magnitude; a wrong angle or pairing errs by the head's scale.
inline void ExpectRopeClose(const Tensor& got, const Tensor& want, int64_t head_dim) {
  REQUIRE(want.numel() % head_dim == 0);
  std::vector<double> head_scale(static_cast<size_t>(want.numel() / head_dim), 0.0);
  for (int64_t i = 0; i < want.numel(); ++i) {
    double& m = head_scale[static_cast<size_t>(i / head_dim)];
    m = std::max(m, std::fabs(double(want.data<float>()[i])));
  }
  ExpectCloseBy(got, want, [&](int64_t i) { return head_scale[static_cast<size_t>(i / head_dim)] / 64.0; }, 2e-2);
}

// `n` random token ids (a fresh seed each run).
inline std::vector<int32_t> RandomPrompt(const ModelConfig& c, int64_t n) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(c.vocab_size) - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(n));
  for (int32_t& t : prompt) t = tok(rng);
  return prompt;
}

// The sparse settings of the sparse decoding tests: K blocks, a quarter of them fetched per
// step at most, switching past 64 tokens, 4 rows, contexts up to 512; agreement measured every
// `agreement` steps (those run eagerly).
inline SparseConfig SmallSparseConfig(int32_t k, SparsePredictor predictor, int32_t agreement) {
  SparseConfig cfg;
  cfg.topk_blocks = k;
  cfg.fetch_ratio = 0.25;
  cfg.sparse_threshold = 64;
  cfg.host_kv_gib = 0.004;
  cfg.predictor = predictor;
  cfg.max_sparse_seqs = 4;
  cfg.max_seq_len = 512;
  cfg.agreement_interval = agreement;
  return cfg;
}

}  // namespace oasis::testing
