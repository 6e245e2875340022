// Start-up calibration of an FP8 KV cache's per-KV-head scales (docs/fp8.md).
//
// Every layer's pools hold e4m3 with a scale per KV head (backend.h, LayerKvPool): a stored x
// of head h means x · scale[h]. The scale is chosen so that the largest |K| (|V|) the model
// produced for head h on a calibration text lands at kFp8E4M3Max / kKvScaleMargin: values up
// to kKvScaleMargin times larger still fit, and e4m3 keeps its 3 mantissa bits over the
// 15 binades below (values smaller than 2^-9 of the maximum lose relative precision).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "oasis/status.h"
#include "runner/model_runner.h"

namespace oasis {

inline constexpr float kKvScaleMargin = 2.0f;

// What calibration measured, over every rank's layers and KV heads.
struct KvCalibration {
  int64_t tokens = 0;
  double max_k_amax = 0, max_v_amax = 0;  // the largest |K| / |V| seen
  double min_k_scale = 0, max_k_scale = 0, min_v_scale = 0, max_v_scale = 0;
};

// Runs `tokens` through `runner`'s model as one dense prefill (chunks of at most
// `max_step_tokens`) into pool slots it borrows and returns, twice: first with unit scales,
// then with the first pass's scales (so later layers see what FP8 attention gives them); sets
// every rank's k_scale / v_scale from the second pass's maxima and clears the maxima. Must run
// before the runner serves (it uses slots [0, n) of the pools). A no-op for pools that are
// not FP8. InvalidArgument when the pools cannot hold `tokens`.
StatusOr<KvCalibration> CalibrateKvScales(ModelRunner& runner, const std::vector<int32_t>& tokens,
                                          int64_t max_step_tokens);

// The calibration text's token ids: `text_tokens` (the built-in text through the model's
// tokenizer) when there are at least 64, else deterministic pseudo-random ids below
// `vocab_size` (a model without a tokenizer), `length` of them.
std::vector<int32_t> KvCalibrationTokens(std::vector<int32_t> text_tokens, int64_t vocab_size,
                                         int64_t length);

// The built-in calibration text: prose, dialogue, source code, numbers and lists (~1,000
// tokens of a BPE tokenizer).
const std::string& KvCalibrationText();

}  // namespace oasis
