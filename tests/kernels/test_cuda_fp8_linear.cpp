// FP8 (e4m3, 128×128 block-scaled) linear weights on the CUDA backend against CPU computations, on
// fresh random inputs (the seed is printed on failure):
//  - the activation quantization kernel equals its CPU statement bit for bit;
//  - Linear with an F8E4M3 weight, GEMV path (decode rows) against the f64 product of bf16 x and
//  the
//    dequantized weight (f32 accumulation tolerance), GEMM path (cuBLASLt block scales) against the
//    f64 product of the *same* quantized activations and the dequantized weight (Hopper FP8 MMA
//    accumulation tolerance), and both against the plain dequantized product with the bound that
//    e4m3 rounding of the activations allows; BF16 and F32 outputs; Qwen3-8B's shapes and small
//    ones;
//  - the fused ops (AddRmsNormLinear, AddRmsNormGateUpSilu, SiluMulLinear) with an F8 weight equal
//    their composition from the unfused ops;
//  - Fp8WeightSupported refuses shapes the kernels do not take;
//  - FillNormal of an F8E4M3 tensor is the e4m3 conversion of the F32 fill, bit for bit;
//  - a CUDA graph of Linear with an F8 weight (GEMV and GEMM) replays the eager result exactly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "kernels/fp8_linear.h"

using namespace oasis;
using namespace oasis::testing;

namespace {

std::unique_ptr<CudaBackend> MakeBackend() {
  auto b = CudaBackend::Create();
  REQUIRE(b.ok());
  return std::move(*b);
}

uint32_t FreshSeed() { return std::random_device{}(); }

// A host FP8 weight [out, in] (e4m3 bytes of N(0, 120) values: the range a checkpoint's blocks
// use) and its scales [out / 128, in / 128] (positive, spread over 2^-16..2^-10).
struct HostFp8Weight {
  int64_t out, in;
  std::vector<uint8_t> w;
  std::vector<float> scales;
  float Scale(int64_t o, int64_t i) const {
    return scales[(o / 128) * ((in + 127) / 128) + i / 128];
  }
  double Deq(int64_t o, int64_t i) const {
    return static_cast<double>(Fp8E4M3ToFloat(w[o * in + i])) * Scale(o, i);
  }
};

HostFp8Weight RandomWeight(int64_t out, int64_t in, std::mt19937& rng) {
  HostFp8Weight h{out, in, std::vector<uint8_t>(out * in), {}};
  std::normal_distribution<float> nd(0.0f, 120.0f);
  for (auto& b : h.w) b = FloatToFp8E4M3(nd(rng));
  std::uniform_real_distribution<float> ud(-16.0f, -10.0f);
  h.scales.resize(((out + 127) / 128) * ((in + 127) / 128));
  for (auto& s : h.scales) s = std::exp2(ud(rng));
  return h;
}

Tensor UploadWeight(CudaBackend& b, const HostFp8Weight& h) {
  Tensor w = Tensor::Empty({h.out, h.in}, DType::kF8E4M3);
  std::memcpy(w.raw(), h.w.data(), h.w.size());
  Tensor s = Tensor::FromFloats(h.scales, {(h.out + 127) / 128, (h.in + 127) / 128});
  return b.Upload(w).WithBlockScales(b.Upload(s), 128, 128);
}

// bf16-exact activations [rows, in]: N(0, 1), every 5th row ×40 (a larger amax), and the second
// group of row 0 all zeros (the zero-group guard).
Tensor RandomActivations(int64_t rows, int64_t in, std::mt19937& rng) {
  Tensor x = RandomBf16Exact({rows, in}, rng);
  float* p = x.data<float>();
  for (int64_t r = 0; r < rows; r += 5)
    for (int64_t i = 0; i < in; ++i)
      p[r * in + i] = Bf16BitsToFloat(FloatToBf16Bits(p[r * in + i] * 40.0f));
  if (in >= 256)
    for (int64_t i = 128; i < 256; ++i) p[i] = 0.0f;
  return x;
}

// The CPU statement of kernels::LaunchQuantizeFp8Groups.
void QuantizeRef(const float* x, int64_t rows, int64_t in, std::vector<uint8_t>& q,
                 std::vector<float>& scales /* [rows][in / 128] */) {
  q.assign(rows * in, 0);
  scales.assign(rows * (in / 128), 1.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < in / 128; ++g) {
      float amax = 0.0f;
      for (int64_t i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(x[r * in + g * 128 + i]));
      float s = amax / 448.0f;
      if (!(s > 0.0f)) s = 1.0f;
      scales[r * (in / 128) + g] = s;
      for (int64_t i = 0; i < 128; ++i)
        q[r * in + g * 128 + i] = FloatToFp8E4M3(x[r * in + g * 128 + i] / s);
    }
}

// Reference products of row r: with bf16 x (plain) and with the quantized activations (quant),
// each with the sum of |terms| (the scale of accumulation error).
struct RefRow {
  std::vector<double> plain, plain_abs, quant, quant_abs;
};

RefRow Reference(const HostFp8Weight& h, const float* x, const std::vector<uint8_t>& q,
                 const std::vector<float>& xs, int64_t r) {
  RefRow ref;
  const int64_t in = h.in, groups = in / 128;
  ref.plain.assign(h.out, 0);
  ref.plain_abs.assign(h.out, 0);
  ref.quant.assign(h.out, 0);
  ref.quant_abs.assign(h.out, 0);
  std::vector<double> xq(in);
  for (int64_t i = 0; i < in; ++i)
    xq[i] = static_cast<double>(Fp8E4M3ToFloat(q[r * in + i])) * xs[r * groups + i / 128];
  for (int64_t o = 0; o < h.out; ++o) {
    double p = 0, pa = 0, qs = 0, qa = 0;
    for (int64_t i = 0; i < in; ++i) {
      const double w = h.Deq(o, i);
      const double a = w * x[r * in + i], b = w * xq[i];
      p += a;
      pa += std::fabs(a);
      qs += b;
      qa += std::fabs(b);
    }
    ref.plain[o] = p;
    ref.plain_abs[o] = pa;
    ref.quant[o] = qs;
    ref.quant_abs[o] = qa;
  }
  return ref;
}

// The worst (|got - want| - tol) over a row; tol = rel_abs · abs_sum + rel_out · |want| + atol.
struct Worst {
  double excess = -1;
  int64_t row = -1, col = -1;
  double got = 0, want = 0, tol = 0;
};
void Compare(const float* got, const std::vector<double>& want, const std::vector<double>& abs_sum,
             double rel_abs, double rel_out, int64_t row, Worst& worst) {
  for (size_t o = 0; o < want.size(); ++o) {
    const double tol = rel_abs * abs_sum[o] + rel_out * std::fabs(want[o]) + 1e-30;
    const double e = std::isfinite(got[o]) ? std::fabs(got[o] - want[o]) - tol : INFINITY;
    if (e > worst.excess) worst = {e, row, static_cast<int64_t>(o), got[o], want[o], tol};
  }
}

// Rows whose CPU reference is computed: all when cheap, else first, last and a random sample.
std::vector<int64_t> CheckedRows(int64_t rows, int64_t out, int64_t in, std::mt19937& rng) {
  const int64_t budget = std::max<int64_t>(1, 150'000'000 / (out * in));
  std::vector<int64_t> r;
  if (rows <= budget) {
    for (int64_t i = 0; i < rows; ++i) r.push_back(i);
    return r;
  }
  r = {0, rows - 1};
  std::uniform_int_distribution<int64_t> d(1, rows - 2);
  while (static_cast<int64_t>(r.size()) < budget) r.push_back(d(rng));
  return r;
}

constexpr double kBf16Rel = 1.0 / 256;  // bf16 output rounding (half an ulp, with margin)

void CheckLinear(CudaBackend& b, const HostFp8Weight& h, const Tensor& wd, int64_t rows,
                 DType out_dtype, CudaFp8Linear::Path path, std::mt19937& rng) {
  const int64_t in = h.in, out = h.out;
  Tensor x = RandomActivations(rows, in, rng);
  Tensor xd = UploadBf16(b, x);
  Tensor od = b.Empty({rows, out}, out_dtype);
  b.fp8_linear().Linear(xd, wd, od, b.stream(), path);
  Tensor got = DownloadF32(b, od);
  std::vector<uint8_t> q;
  std::vector<float> xs;
  QuantizeRef(x.data<float>(), rows, in, q, xs);
  // GEMM rows: all but the last rows % 4 (those run in the GEMV) when the GEMM is chosen.
  const bool gemm_path =
      path == CudaFp8Linear::Path::kGemm ||
      (path == CudaFp8Linear::Path::kAuto && rows > CudaFp8Linear::kAutoGemvRows);
  const int64_t gemm_rows = gemm_path ? rows - rows % 4 : 0;
  const double out_rel = out_dtype == DType::kBF16 ? kBf16Rel : 0.0;
  Worst tight, loose;
  for (int64_t r : CheckedRows(rows, out, in, rng)) {
    const RefRow ref = Reference(h, x.data<float>(), q, xs, r);
    const float* g = got.data<float>() + r * out;
    const bool gemm = r < gemm_rows;
    if (gemm) {
      // The same quantized activations: only accumulation differs (FP8 MMA partial sums per
      // 128-column block are promoted to f32; within a block Hopper keeps ~14 mantissa bits).
      Compare(g, ref.quant, ref.quant_abs, 1e-3, out_rel, r, tight);
    } else {
      Compare(g, ref.plain, ref.plain_abs, 1e-5, out_rel, r, tight);  // f32 accumulation
    }
    // Against the plain dequantized product: e4m3 rounding of each activation is within 2^-4
    // relative (its groups' scales keep values normal but for ~2^-10 of amax).
    Compare(g, ref.plain, ref.plain_abs, gemm ? 0.0625 + 1e-3 : 1e-5, out_rel, r, loose);
  }
  INFO("out " << out << " in " << in << " rows " << rows << " " << DTypeName(out_dtype)
              << " GEMM rows " << gemm_rows << ": worst tight excess " << tight.excess << " at row "
              << tight.row << " col " << tight.col << " got " << tight.got << " want " << tight.want
              << " tol " << tight.tol << "; loose excess " << loose.excess << " at row "
              << loose.row << " col " << loose.col);
  CHECK(tight.excess <= 0);
  CHECK(loose.excess <= 0);
}

}  // namespace

TEST_CASE("FP8 activation quantization equals the CPU's bit for bit", "[gpu][fp8]") {
  auto b = MakeBackend();
  const uint32_t seed = FreshSeed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& [rows, in] : {std::pair<int64_t, int64_t>{7, 512}, {64, 4096}, {3, 12288}}) {
    Tensor x = RandomActivations(rows, in, rng);
    Tensor xd = UploadBf16(*b, x);
    const int64_t padded = rows + 1, ld = padded + 3;
    Tensor qd = b->Empty({padded, in}, DType::kU8);
    Tensor sd = b->Empty({in / 128, ld}, DType::kF32);
    b->Fill(sd, -5.0f);
    REQUIRE(kernels::LaunchQuantizeFp8Groups(
                static_cast<const __nv_bfloat16*>(xd.raw()), static_cast<uint8_t*>(qd.raw()),
                static_cast<float*>(sd.raw()), rows, padded, in, ld, b->stream()) == cudaSuccess);
    Tensor q = b->Download(qd), s = b->Download(sd);
    std::vector<uint8_t> qr;
    std::vector<float> sr;
    QuantizeRef(x.data<float>(), rows, in, qr, sr);
    int64_t bad_q = 0, bad_s = 0;
    for (int64_t r = 0; r < padded; ++r) {
      for (int64_t i = 0; i < in; ++i)
        bad_q += q.data<uint8_t>()[r * in + i] != (r < rows ? qr[r * in + i] : 0);
      for (int64_t g = 0; g < in / 128; ++g) {
        const float want = r < rows ? sr[r * (in / 128) + g] : 1.0f;
        bad_s += std::memcmp(&s.data<float>()[g * ld + r], &want, 4) != 0;
      }
    }
    INFO("rows " << rows << " in " << in);
    CHECK(bad_q == 0);
    CHECK(bad_s == 0);
    CHECK(s.data<float>()[ld - 1] == -5.0f);  // past padded_rows: untouched
  }
}

TEST_CASE("FP8 Linear on the GPU matches the CPU: GEMV and block-scaled GEMM", "[gpu][fp8]") {
  auto b = MakeBackend();
  const uint32_t seed = FreshSeed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  struct Shape {
    int64_t out, in;
    std::vector<int64_t> rows;
  };
  const std::vector<Shape> shapes = {
      {128, 512, {1, 2, 7, 16, 64, 300, 4096}}, {384, 1024, {1, 2, 7, 16, 64, 300}},
      {6144, 4096, {1, 2, 7, 64, 4096}},        {4096, 4096, {1, 4, 16, 300}},
      {24576, 4096, {1, 3, 64, 2048}},          {4096, 12288, {1, 2, 16, 300, 4096}},
  };
  for (const Shape& s : shapes) {
    REQUIRE(b->Fp8WeightSupported(s.out, s.in, 128, 128));
    const HostFp8Weight h = RandomWeight(s.out, s.in, rng);
    const Tensor wd = UploadWeight(*b, h);
    for (int64_t rows : s.rows) {
      const DType dt = (rows % 2 == 0) ? DType::kF32 : DType::kBF16;
      CheckLinear(*b, h, wd, rows, dt, CudaFp8Linear::Path::kAuto, rng);
      if (rows <= 16) CheckLinear(*b, h, wd, rows, DType::kBF16, CudaFp8Linear::Path::kGemv, rng);
      if (rows >= 2 && rows <= 16)
        CheckLinear(*b, h, wd, rows, dt, CudaFp8Linear::Path::kGemm, rng);
    }
  }
  // Through CudaBackend::Linear (kAuto), both output dtypes.
  REQUIRE(b->Fp8WeightSupported(256, 512, 128, 128));
  const HostFp8Weight h = RandomWeight(256, 512, rng);
  const Tensor wd = UploadWeight(*b, h);
  for (int64_t rows : {1, 33}) {
    Tensor x = RandomActivations(rows, 512, rng);
    Tensor xd = UploadBf16(*b, x);
    Tensor o1 = b->Empty({rows, 256}, DType::kF32), o2 = b->Empty({rows, 256}, DType::kF32);
    b->Linear(xd, wd, o1);
    b->fp8_linear().Linear(xd, wd, o2, b->stream());
    Tensor g1 = b->Download(o1), g2 = b->Download(o2);
    CHECK(std::memcmp(g1.raw(), g2.raw(), g1.nbytes()) == 0);
  }
}

TEST_CASE("Fused ops with an FP8 weight equal their unfused composition", "[gpu][fp8]") {
  auto b = MakeBackend();
  const uint32_t seed = FreshSeed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int64_t hidden = 512, inter = 384;
  REQUIRE(b->Fp8WeightSupported(2 * inter, hidden, 128, 128));
  REQUIRE(b->Fp8WeightSupported(hidden, 1024, 128, 128));
  const HostFp8Weight hw = RandomWeight(2 * inter, hidden, rng);  // a gate/up (and plain) weight
  const Tensor w = UploadWeight(*b, hw);
  const HostFp8Weight hd = RandomWeight(hidden, 1024, rng);  // a down weight over 2·512 inputs
  const Tensor wdown = UploadWeight(*b, hd);
  Tensor norm = UploadBf16(*b, RandomBf16Exact({hidden}, rng, 0.5f));
  const float eps = 1e-6f;
  for (int64_t rows : {1, 3, 64}) {
    INFO("rows " << rows);
    Tensor x = UploadBf16(*b, RandomBf16Exact({rows, hidden}, rng));
    Tensor res = UploadBf16(*b, RandomBf16Exact({rows, hidden}, rng));
    // Composition: residual_out = res + x; n = RmsNorm(residual_out); out = Linear(n).
    Tensor r_ref = b->Empty({rows, hidden}, DType::kBF16),
           n = b->Empty({rows, hidden}, DType::kBF16);
    b->Add(res, x, r_ref);
    b->RmsNorm(r_ref, norm, eps, n);
    Tensor want = b->Empty({rows, 2 * inter}, DType::kBF16);
    b->Linear(n, w, want);
    Tensor act_want = b->Empty({rows, inter}, DType::kBF16);
    b->SiluMul(want, act_want);

    Tensor r_out = b->Empty({rows, hidden}, DType::kBF16),
           got = b->Empty({rows, 2 * inter}, DType::kBF16);
    b->AddRmsNormLinear(&x, res, &r_out, norm, eps, w, got);
    ExpectClose(DownloadF32(*b, r_out), DownloadF32(*b, r_ref), 0, 0);
    ExpectClose(DownloadF32(*b, got), DownloadF32(*b, want), 1e-2, 1e-2);
    Tensor got_norm_only = b->Empty({rows, 2 * inter}, DType::kBF16);
    b->AddRmsNormLinear(nullptr, r_ref, nullptr, norm, eps, w, got_norm_only);
    ExpectClose(DownloadF32(*b, got_norm_only), DownloadF32(*b, want), 1e-2, 1e-2);

    Tensor r_out2 = b->Empty({rows, hidden}, DType::kBF16),
           act = b->Empty({rows, inter}, DType::kBF16);
    b->AddRmsNormGateUpSilu(&x, res, &r_out2, norm, eps, w, act);
    ExpectClose(DownloadF32(*b, r_out2), DownloadF32(*b, r_ref), 0, 0);
    ExpectClose(DownloadF32(*b, act), DownloadF32(*b, act_want), 1e-2, 1e-2);

    // SiluMulLinear: down(SiLU(gate)·up) over a [rows, 2·1024] gate/up.
    Tensor gu = UploadBf16(*b, RandomBf16Exact({rows, 2048}, rng));
    Tensor a = b->Empty({rows, 1024}, DType::kBF16);
    b->SiluMul(gu, a);
    Tensor down_want = b->Empty({rows, hidden}, DType::kBF16),
           down_got = b->Empty({rows, hidden}, DType::kBF16);
    b->Linear(a, wdown, down_want);
    b->SiluMulLinear(gu, wdown, down_got);
    ExpectClose(DownloadF32(*b, down_got), DownloadF32(*b, down_want), 0, 0);
  }
}

TEST_CASE("Fp8WeightSupported takes 128x128 blocks of whole-block shapes only", "[gpu][fp8]") {
  auto b = MakeBackend();
  CHECK(b->Fp8WeightSupported(6144, 4096, 128, 128));
  CHECK(b->Fp8WeightSupported(4096, 12288, 128, 128));
  CHECK(b->Fp8WeightSupported(128, 512, 128, 128));
  CHECK_FALSE(b->Fp8WeightSupported(6144, 4096, 64, 128));
  CHECK_FALSE(b->Fp8WeightSupported(6144, 4096, 128, 64));
  CHECK_FALSE(b->Fp8WeightSupported(6144, 4096, 1, 128));
  CHECK_FALSE(b->Fp8WeightSupported(100, 4096, 128, 128));   // out % 128
  CHECK_FALSE(b->Fp8WeightSupported(6144, 4000, 128, 128));  // in % 128
  CHECK_FALSE(b->Fp8WeightSupported(6144, 384, 128, 128));   // in % 512
  CHECK_FALSE(b->Fp8WeightSupported(0, 4096, 128, 128));
  CHECK_FALSE(b->Fp8WeightSupported(6144, 0, 128, 128));
}

TEST_CASE("FillNormal of an F8E4M3 tensor is the e4m3 conversion of the F32 fill", "[gpu][fp8]") {
  auto b = MakeBackend();
  const uint64_t seed = FreshSeed();
  INFO("seed " << seed);
  for (float stddev : {0.02f, 1.0f, 200.0f}) {  // 200: many values saturate at ±448
    const int64_t n = (1 << 20) + 7;
    Tensor f = b->Empty({n}, DType::kF32), q = b->Empty({n}, DType::kF8E4M3);
    b->FillNormal(f, seed, stddev);
    b->FillNormal(q, seed, stddev);
    Tensor fh = b->Download(f), qh = b->Download(q);
    int64_t bad = 0, saturated = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t want = FloatToFp8E4M3(fh.data<float>()[i]);
      bad += qh.data<uint8_t>()[i] != want;
      saturated += (want & 0x7f) == 0x7e;
    }
    INFO("stddev " << stddev << " saturated " << saturated);
    CHECK(bad == 0);
  }
}

TEST_CASE("A CUDA graph of Linear with an FP8 weight replays the eager result", "[gpu][fp8]") {
  auto b = MakeBackend();
  std::mt19937 rng(FreshSeed());
  REQUIRE(b->Fp8WeightSupported(4096, 4096, 128, 128));
  const HostFp8Weight h = RandomWeight(4096, 4096, rng);
  const Tensor w = UploadWeight(*b, h);
  for (int64_t rows : {1, 4, 64, 301}) {
    INFO("rows " << rows);
    Tensor x = UploadBf16(*b, RandomActivations(rows, 4096, rng));
    Tensor eager = b->Empty({rows, 4096}, DType::kBF16), graphed = PoisonedBf16(*b, {rows, 4096});
    b->Linear(x, w, eager);  // also builds the GEMM's plan outside the capture
    b->Synchronize();
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamBeginCapture(b->stream(), cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    b->Linear(x, w, graphed);
    REQUIRE(cudaStreamEndCapture(b->stream(), &graph) == cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    for (int i = 0; i < 2; ++i) REQUIRE(cudaGraphLaunch(exec, b->stream()) == cudaSuccess);
    Tensor e = b->Download(eager), g = b->Download(graphed);
    CHECK(std::memcmp(e.raw(), g.raw(), e.nbytes()) == 0);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}
