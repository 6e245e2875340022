// DecoderLM's FP8 checkpoint weights kept in e4m3 (docs/fp8.md "FP8 weights"): which weights
// stay e4m3, loading them as stored, dummy FP8 weights' scales, the counts and their log line.
#include <algorithm>
#include <string>

#include "common/logging.h"
#include "loader/fp8_weights.h"
#include "models/decoder_lm.h"
#include "models/decoder_lm_fp8.h"

namespace oasis {

StatusOr<Tensor> LoadFp8Parts(const WeightSource& checkpoint, const std::vector<WeightPart>& parts,
                              const QuantizationConfig& q, Backend& backend) {
  std::vector<int64_t> fused = parts[0].LocalShape();
  for (size_t i = 1; i < parts.size(); ++i) fused[0] += parts[i].LocalShape()[0];
  Tensor codes;
  if (parts.size() > 1) codes = backend.Empty(fused, DType::kF8E4M3);
  std::vector<Tensor> grids;
  size_t offset = 0;
  for (const WeightPart& part : parts) {
    OASIS_ASSIGN_OR_RETURN(Fp8Slice slice,
                           LoadFp8Slice(checkpoint, part.name, part.dim, part.begin, part.end, q));
    if (parts.size() == 1) {
      codes = backend.Upload(slice.codes);
    } else {
      backend.UploadBytes(codes, offset, slice.codes.raw(), slice.codes.nbytes());
      offset += slice.codes.nbytes();
    }
    grids.push_back(std::move(slice.scales));
  }
  Tensor scales = backend.Upload(grids.size() == 1 ? grids[0] : Tensor::ConcatRows(grids));
  return codes.WithBlockScales(std::move(scales), static_cast<int>(q.block_out),
                               static_cast<int>(q.block_in));
}

Tensor DummyFp8Scales(const std::vector<int64_t>& shape, const QuantizationConfig& q,
                      uint64_t seed) {
  Tensor s = Tensor::Empty(
      {(shape[0] + q.block_out - 1) / q.block_out, (shape[1] + q.block_in - 1) / q.block_in},
      DType::kF32);
  for (int64_t i = 0; i < s.numel(); ++i) {
    const float z = std::clamp(HashNormal(seed, static_cast<uint64_t>(i)), -2.0f, 2.0f);
    s.data<float>()[i] = (0.02f / kDummyFp8Stddev) * (1.0f + 0.125f * z);
  }
  return s;
}

DecoderLM::Fp8Choice DecoderLM::ChooseFp8(const std::vector<WeightPart>& parts,
                                          const WeightSource* checkpoint) const {
  const QuantizationConfig& q = full_config_.quantization;
  if (checkpoint != nullptr) {
    for (const WeightPart& part : parts) {
      // Missing or misshapen parts take the float path, which reports them.
      auto info = checkpoint->Info(part.name);
      if (!info.ok() || info->dtype != DType::kF8E4M3 || info->shape != part.shape) {
        return Fp8Choice::kNotFp8;
      }
    }
  }
  if (!PartsOnFp8Blocks(parts, q.block_out, q.block_in)) return Fp8Choice::kOffBlocks;
  int64_t out = 0;
  for (const WeightPart& part : parts) out += part.LocalShape()[0];
  const int64_t in = parts[0].LocalShape()[1];
  if (!backend_.Fp8WeightSupported(out, in, static_cast<int>(q.block_out),
                                   static_cast<int>(q.block_in))) {
    return Fp8Choice::kUnsupported;
  }
  return Fp8Choice::kKeep;
}

void DecoderLM::CountFp8(Fp8Choice choice, double bytes) {
  switch (choice) {
    case Fp8Choice::kKeep:
      ++fp8_counts_.kept;
      fp8_counts_.kept_bytes += bytes;
      break;
    case Fp8Choice::kOffBlocks:
      ++fp8_counts_.off_blocks;
      break;
    case Fp8Choice::kUnsupported:
      ++fp8_counts_.unsupported;
      break;
    case Fp8Choice::kNotFp8:
      ++fp8_counts_.not_fp8;
      break;
  }
}

void DecoderLM::LogFp8Weights() const {
  if (tp_.rank != 0) return;
  const Fp8WeightCounts& n = fp8_counts_;
  const QuantizationConfig& q = full_config_.quantization;
  const int64_t total = n.kept + n.dequantized() + n.not_fp8;
  spdlog::info(
      "FP8 weights{}: {} of {} linear weights kept in e4m3 ({:.3g} GB with their scales); {} "
      "dequantized at load to {} (off the {}x{} blocks in their parts or rank slice: {}, shape "
      "not supported by the backend: {}); {} not F8 in the checkpoint{}",
      tp_.size > 1 ? fmt::format(" (rank 0 of {})", tp_.size) : std::string(), n.kept, total,
      n.kept_bytes / 1e9, n.dequantized(), DTypeName(backend_.activation_dtype()), q.block_out,
      q.block_in, n.off_blocks, n.unsupported, n.not_fp8,
      n.expert_tensors > 0
          ? fmt::format("; {} F8 MoE expert tensors dequantized at load", n.expert_tensors)
          : std::string());
}

}  // namespace oasis
