// Sampling parameters of one request (OpenAI / vLLM semantics). Value type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "oasis/status.h"

namespace oasis {

struct SamplingParams {
  float temperature = 1.0f;      // 0 = greedy
  float top_p = 1.0f;            // (0, 1]
  int32_t top_k = -1;            // -1 or 0 = disabled
  float min_p = 0.0f;            // [0, 1]
  std::optional<uint64_t> seed;  // per-request RNG seed; unseeded requests draw from the engine

  bool greedy() const { return temperature == 0.0f || top_k == 1; }
  // InvalidArgument naming the parameter when a value is out of range.
  Status Validate() const;
};

}  // namespace oasis
