// DecoderLM's FP8 checkpoint weights kept in e4m3 (docs/fp8.md "FP8 weights"): loading a
// weight's parts as stored and dummy FP8 block scales. Internal to models/.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "loader/weights.h"
#include "models/tp_sharding.h"
#include "oasis/model_config.h"
#include "oasis/status.h"
#include "oasis/tensor.h"

namespace oasis {

// This rank's parts of an FP8 checkpoint's linear weight as stored (parts that passed
// DecoderLM::ChooseFp8): the e4m3 codes stacked along dimension 0 on the backend's device,
// with the stacked scale grids of the parts attached.
StatusOr<Tensor> LoadFp8Parts(const WeightSource& checkpoint, const std::vector<WeightPart>& parts,
                              const QuantizationConfig& q, Backend& backend);

// Stored e4m3 values of dummy FP8 weights: FillNormal(F8E4M3) of N(0, 64), saturating at
// 448 (7 sigma), so that most values are normal e4m3 numbers.
inline constexpr float kDummyFp8Stddev = 64.0f;

// Block scales of a dummy FP8 weight [out, in]: 0.02 / 64 times a factor in [0.75, 1.25] per
// block (deterministic in `seed`), so the real weights are about normal(0, 0.02) and a scale
// read from the wrong block changes the result.
Tensor DummyFp8Scales(const std::vector<int64_t>& shape, const QuantizationConfig& q,
                      uint64_t seed);

}  // namespace oasis
