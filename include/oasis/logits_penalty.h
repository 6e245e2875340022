// The per-token rule of logits processing, shared by the CPU sampler
// (runner/logits_processing.h) and the CUDA kernel (kernels/logits_processing.h), so that
// both backends compute bit-identical processed logits: every product and difference is
// rounded on its own (no fused multiply-add), in this order. Header-only; host and device.
#pragma once

#include <cstdint>

#include "oasis/sampling_noise.h"  // OASIS_HOST_DEVICE

namespace oasis {

// One token's logit after the token masks and the bias:
//   masked → -inf; else logit + bias (a zero bias leaves the logit's bits alone);
// then vLLM's penalties (vllm/model_executor/layers/utils.py apply_penalties):
//   repetition (token in the prompt or the output): v > 0 ? v / r : v * r;
//   frequency: v - f · count;  presence: v - p · (count > 0).
// `count`: occurrences of the token in the generated tokens; `in_prompt`: it is in the prompt.
OASIS_HOST_DEVICE float ProcessLogit(float logit, bool masked, float bias, int32_t count,
                                     bool in_prompt, float repetition, float frequency,
                                     float presence) {
#if defined(__CUDA_ARCH__)
  if (masked) return -__int_as_float(0x7f800000);
  float v = bias != 0.0f ? __fadd_rn(logit, bias) : logit;
  if (repetition != 1.0f && (in_prompt || count > 0))
    v = v > 0.0f ? __fdiv_rn(v, repetition) : __fmul_rn(v, repetition);
  v = __fsub_rn(v, __fmul_rn(frequency, static_cast<float>(count)));
  v = __fsub_rn(v, count > 0 ? presence : 0.0f);
  return v;
#else
  // (The file that calls this on the host is compiled with -ffp-contract=off.)
  if (masked) return -__builtin_inff();
  float v = bias != 0.0f ? logit + bias : logit;
  if (repetition != 1.0f && (in_prompt || count > 0))
    v = v > 0.0f ? v / repetition : v * repetition;
  const float freq = frequency * static_cast<float>(count);
  v = v - freq;
  v = v - (count > 0 ? presence : 0.0f);
  return v;
#endif
}

}  // namespace oasis
