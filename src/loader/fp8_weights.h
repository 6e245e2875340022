// Block-scaled FP8 checkpoints (quant_method "fp8", Qwen3-8B-FP8 / DeepSeek-V3 layout): read as
// float weights (DequantizeFp8Weights: each F8_E4M3 weight dequantized when it is loaded), or
// as stored, e4m3 codes plus their block scales (LoadFp8Slice), for a backend that computes
// with e4m3 weights.
//
// A quantized linear layer stores
//   X.weight            F8_E4M3      [out, in]
//   X.weight_scale_inv  F32 or BF16  [ceil(out / block_out), ceil(in / block_in)]
// and its real weight is weight[o, i] * weight_scale_inv[o / block_out, i / block_in]
// (transformers' FineGrainedFP8 convention: the "inverse" scale multiplies).
#pragma once

#include <memory>
#include <string>

#include "loader/weights.h"
#include "oasis/model_config.h"
#include "oasis/status.h"

namespace oasis {

// A view of `base` (not owned; must outlive the view) in which every F8_E4M3 tensor reads as
// a float tensor: Info reports F32; Load / LoadSlice (as F32, F16 or BF16) compute
// float(weight) * scale in float32 and round once to the requested dtype; a slice of rows or
// columns takes the matching scale blocks (slices need not be block-aligned); RawBytes is
// Unimplemented for them. Other tensors (bf16 embeddings, norms, the scales themselves) pass
// through unchanged. Every F8 tensor is checked here, before anything is loaded, and its
// scales are read and kept (one float per block): InvalidArgument naming the tensor for an
// F8_E5M2 tensor, an F8 tensor that is not 2-D, a missing `<name>_scale_inv`, a scale of
// another shape or a non-float dtype, or a scale that is not finite.
// Needs quant.fp8(). The view owns the scales; immutable and thread-safe as the base is.
StatusOr<std::unique_ptr<WeightSource>> DequantizeFp8Weights(const WeightSource& base,
                                                             const QuantizationConfig& quant);

// An FP8 weight (or a slice of it) as stored: its e4m3 codes and the scales of their blocks,
// for backends that compute with e4m3 weights (Backend::Fp8WeightSupported, docs/fp8.md
// "FP8 weights"). The real weight is float(codes[o, i]) * scales[o / block_out, i / block_in].
struct Fp8Slice {
  Tensor codes;   // [rows, cols] F8E4M3, host
  Tensor scales;  // [ceil(rows / block_out), ceil(cols / block_in)] F32, host
};

// Whether rows (dim 0) or columns (dim 1) [begin, end) of an FP8 weight of `shape` [out, in]
// are whole blocks of `quant`: begin on a block boundary, end on one or at the end of the
// dimension (a last, partial block). dim < 0 (the whole tensor) is always whole blocks.
bool Fp8SliceOnBlocks(const std::vector<int64_t>& shape, int dim, int64_t begin, int64_t end,
                      const QuantizationConfig& quant);

// Reads rows (dim 0) or columns (dim 1) [begin, end) of the F8_E4M3 weight `name` of
// `checkpoint` (the stored tensors, not a DequantizeFp8Weights view), or the whole weight
// when dim < 0, without dequantizing: the e4m3 codes and the F32 rows or columns of its scale
// grid that cover them (BF16 scales converted exactly). The weight and its scales are checked
// as DequantizeFp8Weights checks them (same errors); InvalidArgument, naming the weight and
// the block size, unless the slice is on whole blocks (Fp8SliceOnBlocks); OutOfRange unless
// 0 <= begin <= end <= shape[dim]. Needs quant.fp8().
StatusOr<Fp8Slice> LoadFp8Slice(const WeightSource& checkpoint, const std::string& name, int dim,
                                int64_t begin, int64_t end, const QuantizationConfig& quant);

// InvalidArgument naming the first F8 tensor of `weights`, for checkpoints whose config.json
// declares no FP8 quantization (an F8 weight there has no defined scale). Ok when none.
Status CheckNoFp8Weights(const WeightSource& weights);

// The scale tensor of an FP8 weight: name + "_scale_inv" ("X.weight" -> "X.weight_scale_inv").
std::string Fp8ScaleName(const std::string& weight_name);

}  // namespace oasis
