// RoPE frequencies from a ModelConfig, shared by all backends: inv_freq[i] for each rotated
// pair (i, i + head_dim/2) and the factor cos/sin are multiplied by. The formulas follow
// transformers' modeling_rope_utils in float32 (default, llama3, linear, yarn), and vLLM for
// dynamic:
//   default  inv_freq[i] = 1 / theta^(2i/d)
//   llama3   low/high-frequency bands divided by factor or kept, the band between smoothed
//   linear   inv_freq / factor
//   dynamic  default with theta' = theta · (factor² − factor + 1)^(d/(d−2)): vLLM's
//            DynamicNTKScalingRotaryEmbedding, the NTK base at the longest context
//            (max_position_embeddings × factor), fixed for every position so that cached keys
//            stay valid. transformers instead recomputes the base from the current sequence
//            length L (theta · (factor·L/M − factor + 1)^(d/(d−2)), the original theta while
//            L ≤ M), which changes the rotation of keys already cached; see docs/loader.md.
//   yarn     per pair, a ramp between extrapolation (1/theta^(2i/d)) and interpolation
//            (that / factor) over the dimensions whose wavelength falls between beta_fast and
//            beta_slow rotations in original_max_position_embeddings (floor/ceil unless
//            truncate is false); attention_scaling = attention_factor, else
//            mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set, else
//            0.1·ln(factor) + 1 (1 when factor ≤ 1).
#pragma once

#include "backend/backend.h"
#include "oasis/model_config.h"

namespace oasis {

RopeParams ComputeRopeParams(const ModelConfig& config);

}  // namespace oasis
