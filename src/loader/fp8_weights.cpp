// DequantizeFp8Weights: block-scaled F8_E4M3 weights read as float tensors.
#include "loader/fp8_weights.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <unordered_map>
#include <vector>

#include "common/check.h"
#include "loader/tensor_copy.h"

namespace oasis {
namespace {

bool IsFp8(DType dtype) { return dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2; }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One quantized weight: its [out, in] shape and its scales, row-major
// [ceil(out / block_out), ceil(in / block_in)] in float32.
struct Fp8Weight {
  std::vector<int64_t> shape;
  std::vector<float> scales;
  int64_t scale_cols = 0;
};

// All 256 e4m3fn codes as floats (exact).
const std::array<float, 256>& E4M3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b)
      t[static_cast<size_t>(b)] = Fp8E4M3ToFloat(static_cast<uint8_t>(b));
    return t;
  }();
  return table;
}

// FP8 view: owns the scales of every F8 tensor of the base; reads weights through the base.
// Immutable after construction; thread-safe as the base is.
class Fp8Weights final : public WeightSource {
 public:
  Fp8Weights(const WeightSource& base, const QuantizationConfig& quant,
             std::unordered_map<std::string, Fp8Weight> fp8)
      : base_(base), block_out_(quant.block_out), block_in_(quant.block_in), fp8_(std::move(fp8)) {}

  std::string Describe() const override {
    return base_.Describe() + " (FP8 weights dequantized, blocks " + std::to_string(block_out_) +
           "x" + std::to_string(block_in_) + ")";
  }
  std::vector<std::string> Names() const override { return base_.Names(); }
  bool Has(const std::string& name) const override { return base_.Has(name); }

  StatusOr<TensorInfo> Info(const std::string& name) const override {
    OASIS_ASSIGN_OR_RETURN(TensorInfo info, base_.Info(name));
    if (fp8_.count(name) != 0) info.dtype = DType::kF32;
    return info;
  }

  StatusOr<Tensor> Load(const std::string& name, DType dtype) const override {
    auto it = fp8_.find(name);
    if (it == fp8_.end()) return base_.Load(name, dtype);
    return Dequantize(name, it->second, 0, 0, it->second.shape[0], dtype);
  }

  StatusOr<Tensor> LoadSlice(const std::string& name, int dim, int64_t begin, int64_t end,
                             DType dtype) const override {
    auto it = fp8_.find(name);
    if (it == fp8_.end()) return base_.LoadSlice(name, dim, begin, end, dtype);
    OASIS_RETURN_IF_ERROR(
        CheckSlice(TensorInfo{name, DType::kF32, it->second.shape}, dim, begin, end, Describe()));
    return Dequantize(name, it->second, dim, begin, end, dtype);
  }

  StatusOr<std::span<const uint8_t>> RawBytes(const std::string& name) const override {
    if (fp8_.count(name) != 0) {
      return Unimplemented(Describe() + ": '" + name + "' is dequantized when loaded");
    }
    return base_.RawBytes(name);
  }

 private:
  // Rows or columns [begin, end) of dimension `dim` of the real weight, as `dtype`.
  StatusOr<Tensor> Dequantize(const std::string& name, const Fp8Weight& w, int dim, int64_t begin,
                              int64_t end, DType dtype) const {
    if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
      return InvalidArgument(Describe() + ": FP8 weight '" + name + "' cannot be loaded as " +
                             std::string(DTypeName(dtype)) + " (only F32, F16 or BF16)");
    }
    OASIS_ASSIGN_OR_RETURN(Tensor codes, base_.LoadSlice(name, dim, begin, end, DType::kF8E4M3));
    const int64_t r0 = dim == 0 ? begin : 0, r1 = dim == 0 ? end : w.shape[0];
    const int64_t c0 = dim == 1 ? begin : 0, c1 = dim == 1 ? end : w.shape[1];
    const int64_t cols = c1 - c0;
    Tensor out = Tensor::Empty({r1 - r0, cols}, dtype);
    const auto& table = E4M3Table();
    const auto* src = static_cast<const uint8_t*>(codes.raw());
    auto* dst = static_cast<uint8_t*>(out.raw());
    const size_t dst_row_bytes = static_cast<size_t>(cols) * DTypeSize(dtype);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = r0; r < r1; ++r) {
      const float* scale_row = w.scales.data() + (r / block_out_) * w.scale_cols;
      const uint8_t* code_row = src + (r - r0) * cols;
      float* values =
          dtype == DType::kF32
              ? reinterpret_cast<float*>(dst + static_cast<size_t>(r - r0) * dst_row_bytes)
              : row.data();
      for (int64_t c = c0; c < c1; ++c) {
        values[c - c0] = table[code_row[c - c0]] * scale_row[c / block_in_];
      }
      if (dtype != DType::kF32) {
        ConvertFromFloat(row.data(), dst + static_cast<size_t>(r - r0) * dst_row_bytes, dtype,
                         static_cast<size_t>(cols));
      }
    }
    return out;
  }

  const WeightSource& base_;
  const int64_t block_out_, block_in_;
  std::unordered_map<std::string, Fp8Weight> fp8_;
};

// Checks `name` (an F8 tensor of `base`) and its scales; reads the scales.
StatusOr<Fp8Weight> ReadScales(const WeightSource& base, const TensorInfo& info,
                               const QuantizationConfig& q) {
  const std::string where = base.Describe() + ": FP8 weight '" + info.name + "'";
  if (info.dtype != DType::kF8E4M3) {
    return InvalidArgument(where + " is " + std::string(DTypeName(info.dtype)) +
                           "; only F8_E4M3 (float8_e4m3fn) weights are supported");
  }
  if (info.shape.size() != 2) {
    return InvalidArgument(where + " has shape " + ShapeToString(info.shape) +
                           "; block-scaled FP8 weights must be 2-D [out, in]");
  }
  const std::string scale_name = Fp8ScaleName(info.name);
  if (!base.Has(scale_name)) {
    return InvalidArgument(where + " has no '" + scale_name +
                           "' (its per-block scales) in the checkpoint");
  }
  OASIS_ASSIGN_OR_RETURN(TensorInfo scale, base.Info(scale_name));
  const std::vector<int64_t> want = {CeilDiv(info.shape[0], q.block_out),
                                     CeilDiv(info.shape[1], q.block_in)};
  if (!IsFloatDType(scale.dtype)) {
    return InvalidArgument(where + ": scale '" + scale_name + "' is " +
                           std::string(DTypeName(scale.dtype)) + ", expected F32 or BF16");
  }
  if (scale.shape != want) {
    return InvalidArgument(where + " of shape " + ShapeToString(info.shape) + ": scale '" +
                           scale_name + "' has shape " + ShapeToString(scale.shape) +
                           ", expected " + ShapeToString(want) + " for weight_block_size [" +
                           std::to_string(q.block_out) + ", " + std::to_string(q.block_in) + "]");
  }
  OASIS_ASSIGN_OR_RETURN(Tensor scales, base.Load(scale_name, DType::kF32));
  Fp8Weight w{info.shape, {}, want[1]};
  const float* s = scales.data<float>();
  w.scales.assign(s, s + scales.numel());
  for (size_t i = 0; i < w.scales.size(); ++i) {
    if (!std::isfinite(w.scales[i])) {
      return InvalidArgument(
          where + ": scale '" + scale_name + "' holds " + std::to_string(w.scales[i]) +
          " at block [" + std::to_string(static_cast<int64_t>(i) / want[1]) + ", " +
          std::to_string(static_cast<int64_t>(i) % want[1]) + "]; scales must be finite");
    }
  }
  return w;
}

}  // namespace

std::string Fp8ScaleName(const std::string& weight_name) { return weight_name + "_scale_inv"; }

StatusOr<std::unique_ptr<WeightSource>> DequantizeFp8Weights(const WeightSource& base,
                                                             const QuantizationConfig& quant) {
  OASIS_CHECK(quant.fp8() && quant.block_out > 0 && quant.block_in > 0)
      << "DequantizeFp8Weights needs an fp8 quantization config";
  std::unordered_map<std::string, Fp8Weight> fp8;
  for (const std::string& name : base.Names()) {
    OASIS_ASSIGN_OR_RETURN(TensorInfo info, base.Info(name));
    if (!IsFp8(info.dtype)) continue;
    OASIS_ASSIGN_OR_RETURN(Fp8Weight w, ReadScales(base, info, quant));
    fp8.emplace(name, std::move(w));
  }
  return std::unique_ptr<WeightSource>(new Fp8Weights(base, quant, std::move(fp8)));
}

bool Fp8SliceOnBlocks(const std::vector<int64_t>& shape, int dim, int64_t begin, int64_t end,
                      const QuantizationConfig& quant) {
  if (dim < 0) return true;
  OASIS_CHECK(dim < static_cast<int>(shape.size()) && quant.block_out > 0 && quant.block_in > 0)
      << "Fp8SliceOnBlocks: dim " << dim << " of " << ShapeToString(shape);
  const int64_t block = dim == 0 ? quant.block_out : quant.block_in;
  return begin % block == 0 && (end % block == 0 || end == shape[static_cast<size_t>(dim)]);
}

StatusOr<Fp8Slice> LoadFp8Slice(const WeightSource& checkpoint, const std::string& name, int dim,
                                int64_t begin, int64_t end, const QuantizationConfig& quant) {
  OASIS_CHECK(quant.fp8() && quant.block_out > 0 && quant.block_in > 0)
      << "LoadFp8Slice needs an fp8 quantization config";
  if (!checkpoint.Has(name)) {
    return NotFound("weight '" + name + "' missing from " + checkpoint.Describe());
  }
  OASIS_ASSIGN_OR_RETURN(TensorInfo info, checkpoint.Info(name));
  if (!IsFp8(info.dtype)) {
    return InvalidArgument(checkpoint.Describe() + ": '" + name + "' is " +
                           std::string(DTypeName(info.dtype)) + ", not an FP8 weight");
  }
  OASIS_ASSIGN_OR_RETURN(Fp8Weight w, ReadScales(checkpoint, info, quant));
  if (dim < 0) {
    dim = 0;
    begin = 0;
    end = info.shape[0];
  }
  OASIS_RETURN_IF_ERROR(CheckSlice(info, dim, begin, end, checkpoint.Describe()));
  if (!Fp8SliceOnBlocks(info.shape, dim, begin, end, quant)) {
    return InvalidArgument(checkpoint.Describe() + ": " + (dim == 0 ? "rows" : "columns") + " [" +
                           std::to_string(begin) + ", " + std::to_string(end) +
                           ") of FP8 weight '" + name + "' " + ShapeToString(info.shape) +
                           " are not whole blocks of weight_block_size [" +
                           std::to_string(quant.block_out) + ", " + std::to_string(quant.block_in) +
                           "]; such a slice can only be dequantized");
  }
  Fp8Slice slice;
  OASIS_ASSIGN_OR_RETURN(slice.codes, checkpoint.LoadSlice(name, dim, begin, end, DType::kF8E4M3));
  // The scale blocks covering the slice: rows [begin / bo, ceil(end / bo)) of the grid, or
  // those columns.
  const int64_t grid_rows = CeilDiv(info.shape[0], quant.block_out);
  const int64_t block = dim == 0 ? quant.block_out : quant.block_in;
  const int64_t b0 = begin / block, b1 = CeilDiv(end, block);
  const int64_t r0 = dim == 0 ? b0 : 0, r1 = dim == 0 ? b1 : grid_rows;
  const int64_t c0 = dim == 1 ? b0 : 0, c1 = dim == 1 ? b1 : w.scale_cols;
  slice.scales = Tensor::Empty({r1 - r0, c1 - c0}, DType::kF32);
  float* dst = slice.scales.data<float>();
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) *dst++ = w.scales[static_cast<size_t>(r * w.scale_cols + c)];
  }
  return slice;
}

Status CheckNoFp8Weights(const WeightSource& weights) {
  for (const std::string& name : weights.Names()) {
    OASIS_ASSIGN_OR_RETURN(TensorInfo info, weights.Info(name));
    if (IsFp8(info.dtype)) {
      return InvalidArgument(weights.Describe() + ": tensor '" + name + "' is " +
                             std::string(DTypeName(info.dtype)) +
                             " but config.json declares no FP8 quantization (a "
                             "quantization_config with quant_method 'fp8' and weight_block_size)");
    }
  }
  return Status::Ok();
}

}  // namespace oasis
