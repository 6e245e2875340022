// Block-scaled FP8 weights (DequantizeFp8Weights): exact dequantized values against a float
// reference, blocks that do not divide the shape, tensor-parallel slices, and every refusal;
// and read as stored (LoadFp8Slice): whole-block slices of the codes with their scales.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <tuple>

#include "loader/fp8_weights.h"
#include "loader/weights.h"
#include "safetensors_builder.h"
#include "test_support.h"

using namespace oasis;
using namespace oasis::testing;
using Catch::Matchers::Contains;

namespace {

// One FP8 weight [rows, cols] with blocks [b0, b1]: random finite e4m3 codes and random
// positive scales, and the real values code * scale (float32 products).
struct Fp8Case {
  int64_t rows, cols, b0, b1;
  std::vector<uint8_t> codes;
  std::vector<float> scales;  // [ceil(rows / b0), ceil(cols / b1)]
  std::vector<float> real;    // [rows, cols]

  int64_t scale_rows() const { return (rows + b0 - 1) / b0; }
  int64_t scale_cols() const { return (cols + b1 - 1) / b1; }
};

Fp8Case MakeCase(int64_t rows, int64_t cols, int64_t b0, int64_t b1, uint32_t seed,
                 bool bf16_scales = false) {
  Fp8Case c{rows, cols, b0, b1, {}, {}, {}};
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < rows * cols; ++i) {
    uint8_t code;
    do code = static_cast<uint8_t>(rng() & 0xff);
    while ((code & 0x7f) == 0x7f);  // e4m3fn NaN
    c.codes.push_back(code);
  }
  std::uniform_real_distribution<float> scale(1e-4f, 3e-2f);
  for (int64_t i = 0; i < c.scale_rows() * c.scale_cols(); ++i) {
    float s = scale(rng);
    if (bf16_scales) s = Bf16BitsToFloat(FloatToBf16Bits(s));
    c.scales.push_back(s);
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      const float s = c.scales[static_cast<size_t>((r / b0) * c.scale_cols() + col / b1)];
      c.real.push_back(Fp8E4M3ToFloat(c.codes[static_cast<size_t>(r * cols + col)]) * s);
    }
  }
  return c;
}

RawTensor WeightOf(const std::string& name, const Fp8Case& c) {
  return {name, "F8_E4M3", {c.rows, c.cols}, BytesOf(c.codes)};
}
RawTensor ScaleOf(const std::string& name, const Fp8Case& c, bool bf16 = false) {
  return {Fp8ScaleName(name),
          bf16 ? "BF16" : "F32",
          {c.scale_rows(), c.scale_cols()},
          bf16 ? Bf16BytesOf(c.scales) : BytesOf(c.scales)};
}

QuantizationConfig Fp8Blocks(int64_t b0, int64_t b1) {
  QuantizationConfig q;
  q.method = WeightQuantization::kFp8Block;
  q.block_out = b0;
  q.block_in = b1;
  return q;
}

// A checkpoint of `tensors` in a fresh directory.
std::unique_ptr<WeightSource> Checkpoint(const std::string& tag,
                                         const std::vector<RawTensor>& tensors) {
  const auto dir = MakeTempDir(tag);
  WriteBinaryFile(dir / "model.safetensors", BuildSafetensors(tensors));
  auto w = OpenSafetensorsWeights(dir);
  INFO(w.status().ToString());
  REQUIRE(w.ok());
  return std::move(*w);
}

std::vector<float> Floats(const Tensor& t) {
  REQUIRE(t.dtype() == DType::kF32);
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

// Rows [r0, r1) x columns [c0, c1) of a row-major [*, cols] matrix.
std::vector<float> Block(const std::vector<float>& m, int64_t cols, int64_t r0, int64_t r1,
                         int64_t c0, int64_t c1) {
  std::vector<float> out;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) out.push_back(m[static_cast<size_t>(r * cols + c)]);
  return out;
}

Status OpenError(const WeightSource& base, const QuantizationConfig& q) {
  auto view = DequantizeFp8Weights(base, q);
  REQUIRE_FALSE(view.ok());
  return view.status();
}

}  // namespace

TEST_CASE("FP8 weights: Load dequantizes exactly, blocks not dividing the shape", "[loader][fp8]") {
  const Fp8Case c = MakeCase(10, 19, 4, 8, 1);  // scales [3, 3]; last blocks partial
  const std::vector<float> norm = {0.5f, 1.25f, -2.0f};
  auto base = Checkpoint("fp8-load", {WeightOf("layer.weight", c),
                                      ScaleOf("layer.weight", c),
                                      {"norm.weight", "BF16", {3}, Bf16BytesOf(norm)}});
  auto view = DequantizeFp8Weights(*base, Fp8Blocks(4, 8));
  INFO(view.status().ToString());
  REQUIRE(view.ok());
  const WeightSource& w = **view;

  auto info = w.Info("layer.weight");
  REQUIRE(info.ok());
  CHECK(info->dtype == DType::kF32);
  CHECK(info->shape == std::vector<int64_t>{10, 19});
  CHECK(w.Has("layer.weight_scale_inv"));
  CHECK_FALSE(w.RawBytes("layer.weight").ok());
  CHECK(w.RawBytes("norm.weight").ok());  // unquantized tensors keep the zero-copy path

  auto f32 = w.Load("layer.weight", DType::kF32);
  REQUIRE(f32.ok());
  CHECK(f32->shape() == std::vector<int64_t>{10, 19});
  CHECK(Floats(*f32) == c.real);  // bit-exact: one float32 product per element

  // bf16 / f16: the float32 product rounded once.
  auto bf16 = w.Load("layer.weight", DType::kBF16);
  auto f16 = w.Load("layer.weight", DType::kF16);
  REQUIRE(bf16.ok());
  REQUIRE(f16.ok());
  for (size_t i = 0; i < c.real.size(); ++i) {
    INFO("element " << i);
    REQUIRE(bf16->data<uint16_t>()[i] == FloatToBf16Bits(c.real[i]));
    REQUIRE(f16->data<uint16_t>()[i] == FloatToF16Bits(c.real[i]));
  }

  auto n = w.Load("norm.weight", DType::kF32);  // passes through
  REQUIRE(n.ok());
  CHECK(Floats(*n) == norm);
  auto bad = w.Load("layer.weight", DType::kI32);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("FP8 weights: every row and column slice equals that part of Load", "[loader][fp8]") {
  const Fp8Case c = MakeCase(10, 13, 4, 5, 2);
  auto base = Checkpoint("fp8-slices", {WeightOf("w.weight", c), ScaleOf("w.weight", c)});
  auto view = DequantizeFp8Weights(*base, Fp8Blocks(4, 5));
  REQUIRE(view.ok());
  const WeightSource& w = **view;
  for (int dim : {0, 1}) {
    const int64_t size = dim == 0 ? c.rows : c.cols;
    for (int64_t begin = 0; begin <= size; ++begin) {
      for (int64_t end = begin; end <= size; ++end) {
        INFO("dim " << dim << " [" << begin << ", " << end << ")");
        auto s = w.LoadSlice("w.weight", dim, begin, end, DType::kF32);
        REQUIRE(s.ok());
        const auto want = dim == 0 ? Block(c.real, c.cols, begin, end, 0, c.cols)
                                   : Block(c.real, c.cols, 0, c.rows, begin, end);
        REQUIRE(s->shape() == (dim == 0 ? std::vector<int64_t>{end - begin, c.cols}
                                        : std::vector<int64_t>{c.rows, end - begin}));
        REQUIRE(Floats(*s) == want);
      }
    }
  }
  auto out = w.LoadSlice("w.weight", 0, 3, 11, DType::kF32);
  REQUIRE_FALSE(out.ok());
  CHECK(out.status().code() == StatusCode::kOutOfRange);
  auto bad_dim = w.LoadSlice("w.weight", 2, 0, 1, DType::kF32);
  REQUIRE_FALSE(bad_dim.ok());
  CHECK(bad_dim.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("FP8 weights: 128x128 blocks, BF16 scales, tensor-parallel halves", "[loader][fp8]") {
  // Qwen's block size over a shape it does not divide: scales [2, 3], partial last blocks.
  const Fp8Case c = MakeCase(130, 257, 128, 128, 3, /*bf16_scales=*/true);
  auto base = Checkpoint("fp8-128", {WeightOf("proj.weight", c), ScaleOf("proj.weight", c, true)});
  auto view = DequantizeFp8Weights(*base, Fp8Blocks(128, 128));
  INFO(view.status().ToString());
  REQUIRE(view.ok());
  const WeightSource& w = **view;
  auto whole = w.Load("proj.weight", DType::kF32);
  REQUIRE(whole.ok());
  CHECK(Floats(*whole) == c.real);
  // Column-parallel (rows) and row-parallel (columns) shards of TP 2 and 3; none block-aligned.
  for (int tp : {2, 3}) {
    for (int rank = 0; rank < tp; ++rank) {
      const int64_t r0 = c.rows * rank / tp, r1 = c.rows * (rank + 1) / tp;
      const int64_t c0 = c.cols * rank / tp, c1 = c.cols * (rank + 1) / tp;
      auto rows = w.LoadSlice("proj.weight", 0, r0, r1, DType::kBF16);
      auto cols = w.LoadSlice("proj.weight", 1, c0, c1, DType::kF32);
      REQUIRE(rows.ok());
      REQUIRE(cols.ok());
      CHECK(Floats(*cols) == Block(c.real, c.cols, 0, c.rows, c0, c1));
      const auto want = Block(c.real, c.cols, r0, r1, 0, c.cols);
      for (size_t i = 0; i < want.size(); ++i) {
        INFO("tp " << tp << " rank " << rank << " element " << i);
        REQUIRE(rows->data<uint16_t>()[i] == FloatToBf16Bits(want[i]));
      }
    }
  }
}

TEST_CASE("FP8 weights: missing, misshapen, non-float and non-finite scales are refused",
          "[loader][fp8]") {
  const Fp8Case c = MakeCase(10, 19, 4, 8, 4);
  const auto q = Fp8Blocks(4, 8);
  {
    auto base = Checkpoint("fp8-noscale", {WeightOf("a.weight", c)});
    Status s = OpenError(*base, q);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Contains("'a.weight'") && Contains("no 'a.weight_scale_inv'"));
  }
  {
    RawTensor scale = ScaleOf("a.weight", c);
    scale.shape = {3, 2};  // as if the blocks were [4, 10]
    scale.bytes.resize(6 * 4);
    auto base = Checkpoint("fp8-shape", {WeightOf("a.weight", c), scale});
    Status s = OpenError(*base, q);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Contains("has shape [3, 2], expected [3, 3]") &&
                                Contains("weight_block_size [4, 8]"));
    // The same checkpoint read with other blocks: [4, 10] fits.
    CHECK(DequantizeFp8Weights(*base, Fp8Blocks(4, 10)).ok());
  }
  {
    RawTensor scale{"a.weight_scale_inv", "I32", {3, 3}, std::string(36, '\1')};
    auto base = Checkpoint("fp8-intscale", {WeightOf("a.weight", c), scale});
    CHECK_THAT(OpenError(*base, q).message(), Contains("is I32, expected F32 or BF16"));
  }
  for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    Fp8Case broken = c;
    broken.scales[4] = bad;  // block [1, 1]
    auto base = Checkpoint("fp8-inf", {WeightOf("a.weight", broken), ScaleOf("a.weight", broken)});
    Status s = OpenError(*base, q);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Contains("block [1, 1]") && Contains("scales must be finite"));
  }
}

TEST_CASE("FP8 weights: E5M2 and non-2-D FP8 tensors are refused", "[loader][fp8]") {
  const Fp8Case c = MakeCase(10, 19, 4, 8, 5);
  {
    RawTensor w = WeightOf("a.weight", c);
    w.dtype = "F8_E5M2";
    auto base = Checkpoint("fp8-e5m2", {w, ScaleOf("a.weight", c)});
    Status s = OpenError(*base, Fp8Blocks(4, 8));
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Contains("'a.weight' is F8_E5M2") && Contains("only F8_E4M3"));
  }
  {
    RawTensor w = WeightOf("a.weight", c);
    w.shape = {2, 5, 19};
    auto base = Checkpoint("fp8-3d", {w, ScaleOf("a.weight", c)});
    CHECK_THAT(OpenError(*base, Fp8Blocks(4, 8)).message(), Contains("must be 2-D"));
  }
}

TEST_CASE("FP8 weights in a checkpoint without an fp8 quantization_config are refused",
          "[loader][fp8]") {
  const Fp8Case c = MakeCase(4, 8, 4, 8, 6);
  auto fp8 = Checkpoint("fp8-undeclared", {WeightOf("a.weight", c),
                                           ScaleOf("a.weight", c),
                                           {"b.weight", "BF16", {2}, Bf16BytesOf({1, 2})}});
  Status s = CheckNoFp8Weights(*fp8);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(),
             Contains("'a.weight' is F8_E4M3") && Contains("declares no FP8 quantization"));
  // Read directly, the F8 tensor cannot become floats.
  CHECK_FALSE(fp8->Load("a.weight", DType::kF32).ok());
  auto plain = Checkpoint("fp8-none", {{"b.weight", "BF16", {2}, Bf16BytesOf({1, 2})}});
  CHECK(CheckNoFp8Weights(*plain).ok());
}

namespace {

std::vector<uint8_t> Codes(const Tensor& t) {
  REQUIRE(t.dtype() == DType::kF8E4M3);
  const auto* p = t.data<uint8_t>();
  return std::vector<uint8_t>(p, p + t.numel());
}

// Rows [r0, r1) x columns [c0, c1) of a row-major [*, cols] matrix of codes.
std::vector<uint8_t> CodeBlock(const std::vector<uint8_t>& m, int64_t cols, int64_t r0, int64_t r1,
                               int64_t c0, int64_t c1) {
  std::vector<uint8_t> out;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) out.push_back(m[static_cast<size_t>(r * cols + c)]);
  return out;
}

// The slice's codes and scales against the case; and its real values (code * scale of its
// block within the slice) against the dequantized weight's same part.
void CheckSlice(const Fp8Slice& s, const Fp8Case& c, int dim, int64_t begin, int64_t end) {
  const int64_t r0 = dim == 0 ? begin : 0, r1 = dim == 0 ? end : c.rows;
  const int64_t c0 = dim == 1 ? begin : 0, c1 = dim == 1 ? end : c.cols;
  REQUIRE(s.codes.shape() == std::vector<int64_t>{r1 - r0, c1 - c0});
  CHECK(Codes(s.codes) == CodeBlock(c.codes, c.cols, r0, r1, c0, c1));
  const int64_t sr0 = r0 / c.b0, sr1 = (r1 + c.b0 - 1) / c.b0;
  const int64_t sc0 = c0 / c.b1, sc1 = (c1 + c.b1 - 1) / c.b1;
  REQUIRE(s.scales.dtype() == DType::kF32);
  REQUIRE(s.scales.shape() == std::vector<int64_t>{sr1 - sr0, sc1 - sc0});
  CHECK(Floats(s.scales) == Block(c.scales, c.scale_cols(), sr0, sr1, sc0, sc1));
  std::vector<float> real;
  const int64_t cols = c1 - c0, scale_cols = sc1 - sc0;
  for (int64_t r = 0; r < r1 - r0; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      const float scale = s.scales.data<float>()[(r / c.b0) * scale_cols + col / c.b1];
      real.push_back(Fp8E4M3ToFloat(s.codes.data<uint8_t>()[r * cols + col]) * scale);
    }
  }
  CHECK(real == Block(c.real, c.cols, r0, r1, c0, c1));
}

}  // namespace

TEST_CASE("FP8 weights as stored: whole-block row and column slices with their scales",
          "[loader][fp8]") {
  // 300 x 520 in 128 x 128 blocks: scales [3, 5], the last row and column blocks partial.
  for (bool bf16 : {false, true}) {
    INFO("BF16 scales " << bf16);
    const Fp8Case c = MakeCase(300, 520, 128, 128, 7, bf16);
    auto base = Checkpoint("fp8-raw", {WeightOf("p.weight", c), ScaleOf("p.weight", c, bf16)});
    const auto q = Fp8Blocks(128, 128);
    auto whole = LoadFp8Slice(*base, "p.weight", -1, 0, 0, q);
    INFO(whole.status().ToString());
    REQUIRE(whole.ok());
    CheckSlice(*whole, c, 0, 0, c.rows);
    // Rows: [0, 128), [128, 300) (to the end, partial), [128, 256), [0, 256); empty [256, 256).
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 128},
                        {128, 300},
                        {128, 256},
                        {0, 256},
                        {256, 256},
                        {0, 300}}) {
      INFO("rows [" << b << ", " << e << ")");
      auto s = LoadFp8Slice(*base, "p.weight", 0, b, e, q);
      REQUIRE(s.ok());
      CheckSlice(*s, c, 0, b, e);
    }
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 256}, {256, 520}, {384, 512}, {512, 520}}) {
      INFO("columns [" << b << ", " << e << ")");
      auto s = LoadFp8Slice(*base, "p.weight", 1, b, e, q);
      REQUIRE(s.ok());
      CheckSlice(*s, c, 1, b, e);
    }
  }
}

TEST_CASE("FP8 weights as stored: slices off the blocks and non-FP8 tensors are refused",
          "[loader][fp8]") {
  const Fp8Case c = MakeCase(300, 520, 128, 128, 8);
  const std::vector<float> norm = {1.0f, 2.0f};
  auto base = Checkpoint("fp8-raw-bad", {WeightOf("p.weight", c),
                                         ScaleOf("p.weight", c),
                                         {"n.weight", "BF16", {2}, Bf16BytesOf(norm)}});
  const auto q = Fp8Blocks(128, 128);
  // Starts or ends inside a block (not at the end of the dimension): TP 2 of 300 rows is 150.
  for (auto [dim, b, e] : {std::tuple<int, int64_t, int64_t>{0, 0, 150},
                           {0, 150, 300},
                           {0, 64, 128},
                           {1, 0, 260},
                           {1, 260, 520},
                           {1, 128, 200}}) {
    INFO("dim " << dim << " [" << b << ", " << e << ")");
    CHECK_FALSE(Fp8SliceOnBlocks({300, 520}, dim, b, e, q));
    auto s = LoadFp8Slice(*base, "p.weight", dim, b, e, q);
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.status().message(),
               Contains("'p.weight'") &&
                   Contains("not whole blocks of weight_block_size [128, 128]") &&
                   Contains("can only be dequantized"));
  }
  CHECK(Fp8SliceOnBlocks({300, 520}, 0, 256, 300, q));
  CHECK(Fp8SliceOnBlocks({300, 520}, 1, 512, 520, q));
  CHECK(Fp8SliceOnBlocks({300, 520}, -1, 0, 0, q));
  CHECK_FALSE(Fp8SliceOnBlocks({300, 520}, 0, 256, 299, q));
  auto out = LoadFp8Slice(*base, "p.weight", 0, 256, 384, q);
  REQUIRE_FALSE(out.ok());
  CHECK(out.status().code() == StatusCode::kOutOfRange);
  auto plain = LoadFp8Slice(*base, "n.weight", -1, 0, 0, q);
  REQUIRE_FALSE(plain.ok());
  CHECK_THAT(plain.status().message(), Contains("'n.weight' is BF16, not an FP8 weight"));
  auto missing = LoadFp8Slice(*base, "x.weight", -1, 0, 0, q);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  // Scales are checked as DequantizeFp8Weights checks them.
  auto noscale = Checkpoint("fp8-raw-noscale", {WeightOf("p.weight", c)});
  auto s = LoadFp8Slice(*noscale, "p.weight", -1, 0, 0, q);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.status().message(), Contains("no 'p.weight_scale_inv'"));
}
