// Mixture-of-experts checkpoints in transformers 5's fused layout, seen per expert.
//
// The Qwen3-MoE releases on the Hub store one tensor per expert and projection:
//   model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight   [I, H], [I, H], [H, I]
// transformers 5 fuses them when it loads (conversion_mapping.py, "qwen2_moe" rules, which
// qwen3_moe shares) into two parameters per layer:
//   model.layers.{l}.mlp.experts.gate_up_proj   [E, 2 * I, H]  (gate rows, then up rows)
//   model.layers.{l}.mlp.experts.down_proj      [E, H, I]
// and writes that layout back when saved with save_original_format=False. Models read the
// per-expert names; SplitFusedExperts exposes a fused checkpoint under them.
#pragma once

#include <memory>

#include "loader/weights.h"
#include "oasis/status.h"

namespace oasis {

// Whether `weights` holds any tensor of the fused layout (names ending in
// "mlp.experts.gate_up_proj" or "mlp.experts.down_proj", optionally with ".weight").
bool HasFusedExperts(const WeightSource& weights);

// A view of `base` (not owned; must outlive the view) in which every fused expert tensor is
// also reachable as the per-expert tensors above (same bytes: RawBytes works when the base
// has them; Load/LoadSlice read one expert at a time). Other tensors pass through.
// InvalidArgument when a fused tensor is not 3-D, gate_up_proj's dim 1 is odd, a layer's
// gate_up_proj and down_proj disagree on the expert count or sizes, or a layer holds both
// layouts.
StatusOr<std::unique_ptr<WeightSource>> SplitFusedExperts(const WeightSource& base);

}  // namespace oasis
