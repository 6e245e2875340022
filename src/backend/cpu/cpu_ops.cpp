// CpuBackend: elementwise, normalisation, embedding, linear and RoPE ops.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/check.h"

namespace oasis {
namespace {

void CheckF32(const Tensor& t, const char* what) {
  OASIS_CHECK(t.dtype() == DType::kF32 && t.device() == Device::kCpu)
      << what << " must be a host F32 tensor, got " << t.ToString();
}

void CheckI32(const Tensor& t, const char* what) {
  OASIS_CHECK(t.dtype() == DType::kI32) << what << " must be int32, got " << t.ToString();
}

// out[i] = x[i] * inv_rms * w[i], with inv_rms of the row computed in float like PyTorch.
void NormRow(const float* x, const float* w, float eps, int64_t n, float* out) {
  double sum = 0;  // accumulated in double; rounding to float matches torch's mean closely
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  float mean = static_cast<float>(sum / static_cast<double>(n));
  float inv = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

// sum over i of x[i] * w[i]: eight float lanes, then their pairwise sum and the tail. The f32
// and the e4m3 Linear both use it, so an e4m3 weight computes exactly as its dequantized copy.
inline float Dot(const float* x, const float* w, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j] * w[i + j];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += x[i] * w[i];
  return s;
}

// Runs work(begin, end) over [0, n) split across up to `threads` threads (inline when 1).
template <typename Work>
void ParallelFor(int64_t n, int threads, const Work& work) {
  if (threads <= 1 || n <= 1) {
    work(int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    const int64_t b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back(work, b, e);
  }
  for (auto& th : pool) th.join();
}

// All 256 e4m3fn codes as floats (exact).
const float* E4M3Table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (int b = 0; b < 256; ++b)
      t[static_cast<size_t>(b)] = Fp8E4M3ToFloat(static_cast<uint8_t>(b));
    return t;
  }();
  return table.data();
}

}  // namespace

CpuBackend::CpuBackend(int num_threads, CpuFp8Weights fp8_weights) : fp8_weights_(fp8_weights) {
  if (num_threads <= 0) {
    num_threads = static_cast<int>(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  }
  num_threads_ = num_threads;
}

Tensor CpuBackend::Empty(std::vector<int64_t> shape, DType dtype) {
  return Tensor::Empty(std::move(shape), dtype);
}

void CpuBackend::UploadBytes(Tensor& dst, size_t offset, const void* src, size_t bytes) {
  OASIS_CHECK_LE(offset + bytes, dst.nbytes()) << "UploadBytes past the end of " << dst.ToString();
  std::memcpy(static_cast<char*>(dst.raw()) + offset, src, bytes);
}

void CpuBackend::FillNormal(Tensor& t, uint64_t seed, float stddev) {
  if (t.dtype() == DType::kF8E4M3) {  // dummy FP8 weights: the same values, quantized
    OASIS_CHECK(t.device() == Device::kCpu) << "FillNormal of " << t.ToString();
    auto* q = t.data<uint8_t>();
    for (int64_t i = 0; i < t.numel(); ++i)
      q[i] = FloatToFp8E4M3(stddev * HashNormal(seed, static_cast<uint64_t>(i)));
    return;
  }
  CheckF32(t, "FillNormal");
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = stddev * HashNormal(seed, static_cast<uint64_t>(i));
}

void CpuBackend::Fill(Tensor& t, float value) {
  CheckF32(t, "Fill");
  std::fill(t.data<float>(), t.data<float>() + t.numel(), value);
}

void CpuBackend::Embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  CheckI32(ids, "Embedding ids");
  CheckF32(table, "Embedding table");
  CheckF32(out, "Embedding out");
  const int64_t n = ids.numel(), hidden = table.dim(1), vocab = table.dim(0);
  OASIS_CHECK(out.dim(0) == n && out.dim(1) == hidden) << "Embedding out " << out.ToString();
  for (int64_t t = 0; t < n; ++t) {
    int32_t id = ids.data<int32_t>()[t];
    OASIS_CHECK(id >= 0 && id < vocab) << "token id " << id << " outside vocabulary " << vocab;
    std::memcpy(out.data<float>() + t * hidden, table.data<float>() + id * hidden,
                static_cast<size_t>(hidden) * sizeof(float));
  }
}

void CpuBackend::RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  CheckF32(x, "RmsNorm x");
  const int64_t n = x.dim(-1), rows = x.numel() / n;
  OASIS_CHECK_EQ(weight.numel(), n) << "RmsNorm weight";
  OASIS_CHECK_EQ(out.numel(), x.numel()) << "RmsNorm out";
  for (int64_t r = 0; r < rows; ++r) {
    NormRow(x.data<float>() + r * n, weight.data<float>(), eps, n, out.data<float>() + r * n);
  }
}

void CpuBackend::AddRmsNorm(const Tensor& x, Tensor& residual, const Tensor& weight, float eps,
                            Tensor& out) {
  CheckF32(x, "AddRmsNorm x");
  CheckF32(residual, "AddRmsNorm residual");
  OASIS_CHECK_EQ(x.numel(), residual.numel()) << "AddRmsNorm shapes";
  float* r = residual.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) r[i] += x.data<float>()[i];
  RmsNorm(residual, weight, eps, out);
}

void CpuBackend::Add(const Tensor& a, const Tensor& b, Tensor& out) {
  CheckF32(a, "Add a");
  CheckF32(b, "Add b");
  OASIS_CHECK(a.numel() == b.numel() && a.numel() == out.numel()) << "Add shapes";
  for (int64_t i = 0; i < a.numel(); ++i)
    out.data<float>()[i] = a.data<float>()[i] + b.data<float>()[i];
}

bool CpuBackend::Fp8WeightSupported(int64_t out, int64_t in, int block_out, int block_in) const {
  return fp8_weights_ == CpuFp8Weights::kCompute && out >= 0 && in >= 0 && block_out > 0 &&
         block_in > 0;  // any shape, any blocks
}

void CpuBackend::Linear(const Tensor& x, const Tensor& weight, Tensor& out) {
  if (weight.dtype() == DType::kF8E4M3) {
    LinearFp8(x, weight, out);
    return;
  }
  CheckF32(x, "Linear x");
  CheckF32(weight, "Linear weight");
  CheckF32(out, "Linear out");
  const int64_t in = weight.dim(1), outf = weight.dim(0), rows = x.numel() / in;
  OASIS_CHECK_EQ(x.dim(-1), in) << "Linear: x " << x.ToString() << " weight " << weight.ToString();
  OASIS_CHECK_EQ(out.numel(), rows * outf) << "Linear out " << out.ToString();
  const float* xp = x.data<float>();
  const float* wp = weight.data<float>();
  float* op = out.data<float>();
  // Each worker owns a range of output features; every weight row is read once per 4 rows.
  auto work = [&](int64_t f_begin, int64_t f_end) {
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      const int64_t rn = std::min<int64_t>(4, rows - r0);
      for (int64_t f = f_begin; f < f_end; ++f) {
        const float* w = wp + f * in;
        for (int64_t r = 0; r < rn; ++r) op[(r0 + r) * outf + f] = Dot(xp + (r0 + r) * in, w, in);
      }
    }
  };
  ParallelFor(outf, rows * outf * in < (1 << 20) ? 1 : num_threads_, work);
}

void CpuBackend::LinearFp8(const Tensor& x, const Tensor& weight, Tensor& out) {
  CheckF32(x, "Linear x");
  CheckF32(out, "Linear out");
  OASIS_CHECK(weight.device() == Device::kCpu && weight.ndim() == 2)
      << "Linear: e4m3 weight " << weight.ToString();
  const Tensor* scales = weight.block_scales();
  OASIS_CHECK(scales != nullptr) << "Linear: e4m3 weight " << weight.ToString()
                                 << " without block scales (Tensor::WithBlockScales)";
  const int64_t in = weight.dim(1), outf = weight.dim(0), rows = x.numel() / in;
  OASIS_CHECK_EQ(x.dim(-1), in) << "Linear: x " << x.ToString() << " weight " << weight.ToString();
  OASIS_CHECK_EQ(out.numel(), rows * outf) << "Linear out " << out.ToString();
  const int64_t br = weight.scale_block_rows(), bc = weight.scale_block_cols();
  const int64_t scale_cols = scales->dim(1);
  const float* table = E4M3Table();
  const auto* codes = weight.data<uint8_t>();
  const float* sp = scales->data<float>();
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  // Each worker owns a range of output features and walks it a tile of kTile weight rows at a
  // time: the tile is dequantized once (float(e4m3) * scale in f32, the value the loader's
  // DequantizeFp8Weights gives) into a buffer, then every row of x is multiplied with it by the
  // f32 Linear's Dot. Weight bytes are read once per call, a quarter of the f32 weight's.
  constexpr int64_t kTile = 8;
  auto work = [&](int64_t f_begin, int64_t f_end) {
    std::vector<float> tile(static_cast<size_t>(kTile * in));
    for (int64_t f0 = f_begin; f0 < f_end; f0 += kTile) {
      const int64_t fn = std::min(kTile, f_end - f0);
      for (int64_t f = 0; f < fn; ++f) {
        const uint8_t* c = codes + (f0 + f) * in;
        const float* s = sp + ((f0 + f) / br) * scale_cols;
        float* w = tile.data() + f * in;
        for (int64_t b = 0; b * bc < in; ++b) {
          const float scale = s[b];
          const int64_t end = std::min(in, (b + 1) * bc);
          for (int64_t i = b * bc; i < end; ++i) w[i] = table[c[i]] * scale;
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xp + r * in;
        for (int64_t f = 0; f < fn; ++f) op[r * outf + f0 + f] = Dot(xr, tile.data() + f * in, in);
      }
    }
  };
  ParallelFor(outf, rows * outf * in < (1 << 20) ? 1 : num_threads_, work);
}

void CpuBackend::QkNormRope(Tensor& q, Tensor& k, const Tensor* q_norm, const Tensor* k_norm,
                            float eps, const Tensor& positions, const RopeParams& rope) {
  CheckF32(q, "QkNormRope q");
  CheckF32(k, "QkNormRope k");
  CheckI32(positions, "QkNormRope positions");
  const int64_t tokens = q.dim(0), head_dim = q.dim(2);
  const int64_t half = static_cast<int64_t>(rope.inv_freq.size());
  OASIS_CHECK_EQ(half * 2, head_dim) << "rope inv_freq size vs head_dim";
  OASIS_CHECK_EQ(k.dim(0), tokens) << "q/k token counts";
  OASIS_CHECK_EQ(positions.numel(), tokens) << "positions";
  std::vector<float> cosv(static_cast<size_t>(half)), sinv(static_cast<size_t>(half));
  std::vector<float> tmp(static_cast<size_t>(head_dim));
  auto apply = [&](float* head, const Tensor* norm) {
    if (norm) {
      NormRow(head, norm->data<float>(), eps, head_dim, tmp.data());
      std::memcpy(head, tmp.data(), static_cast<size_t>(head_dim) * sizeof(float));
    }
    for (int64_t i = 0; i < half; ++i) {
      float a = head[i], b = head[i + half];
      head[i] = a * cosv[i] - b * sinv[i];
      head[i + half] = b * cosv[i] + a * sinv[i];
    }
  };
  for (int64_t t = 0; t < tokens; ++t) {
    const float pos = static_cast<float>(positions.data<int32_t>()[t]);
    for (int64_t i = 0; i < half; ++i) {
      float angle = pos * rope.inv_freq[static_cast<size_t>(i)];  // float32, as in HF
      cosv[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * rope.attention_scaling;
      sinv[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * rope.attention_scaling;
    }
    for (int64_t h = 0; h < q.dim(1); ++h)
      apply(q.data<float>() + (t * q.dim(1) + h) * head_dim, q_norm);
    for (int64_t h = 0; h < k.dim(1); ++h)
      apply(k.data<float>() + (t * k.dim(1) + h) * head_dim, k_norm);
  }
}

void CpuBackend::SiluMul(const Tensor& gate_up, Tensor& out) {
  CheckF32(gate_up, "SiluMul gate_up");
  const int64_t inter = out.dim(-1), rows = out.numel() / inter;
  OASIS_CHECK_EQ(gate_up.numel(), rows * inter * 2) << "SiluMul shapes";
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up.data<float>() + r * inter * 2;
    const float* u = g + inter;
    float* o = out.data<float>() + r * inter;
    for (int64_t i = 0; i < inter; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void CpuBackend::SplitQkv(const Tensor& qkv, Tensor& q, Tensor& k, Tensor& v) {
  CheckF32(qkv, "SplitQkv qkv");
  const int64_t tokens = qkv.dim(0);
  const int64_t nq = q.numel() / tokens, nk = k.numel() / tokens, nv = v.numel() / tokens;
  OASIS_CHECK_EQ(qkv.dim(1), nq + nk + nv) << "SplitQkv widths";
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = qkv.data<float>() + t * (nq + nk + nv);
    std::memcpy(q.data<float>() + t * nq, row, static_cast<size_t>(nq) * sizeof(float));
    std::memcpy(k.data<float>() + t * nk, row + nq, static_cast<size_t>(nk) * sizeof(float));
    std::memcpy(v.data<float>() + t * nv, row + nq + nk, static_cast<size_t>(nv) * sizeof(float));
  }
}

void CpuBackend::Copy(const Tensor& src, Tensor& dst) {
  OASIS_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel())
      << "Copy " << src.ToString() << " -> " << dst.ToString();
  std::memmove(dst.raw(), src.raw(), src.nbytes());
}

void CpuBackend::GatherRows(const Tensor& x, const Tensor& rows, Tensor& out) {
  CheckI32(rows, "GatherRows rows");
  const int64_t n = x.numel() / x.dim(0);
  const size_t row_bytes = static_cast<size_t>(n) * DTypeSize(x.dtype());
  for (int64_t i = 0; i < rows.numel(); ++i) {
    int32_t r = rows.data<int32_t>()[i];
    OASIS_CHECK(r >= 0 && r < x.dim(0)) << "GatherRows row " << r;
    std::memcpy(static_cast<char*>(out.raw()) + i * row_bytes,
                static_cast<const char*>(x.raw()) + r * row_bytes, row_bytes);
  }
}

void CpuBackend::ScatterRows(const Tensor& x, const Tensor& rows, Tensor& out) {
  CheckI32(rows, "ScatterRows rows");
  OASIS_CHECK_EQ(x.dim(0), rows.numel()) << "ScatterRows: one row index per row of x";
  const int64_t n = out.numel() / std::max<int64_t>(1, out.dim(0));
  OASIS_CHECK_EQ(x.numel(), rows.numel() * n) << "ScatterRows row width";
  const size_t row_bytes = static_cast<size_t>(n) * DTypeSize(out.dtype());
  for (int64_t i = 0; i < rows.numel(); ++i) {
    const int32_t r = rows.data<int32_t>()[i];
    OASIS_CHECK(r >= 0 && r < out.dim(0)) << "ScatterRows row " << r;
    std::memcpy(static_cast<char*>(out.raw()) + r * row_bytes,
                static_cast<const char*>(x.raw()) + i * row_bytes, row_bytes);
  }
}

}  // namespace oasis
