// Tensor-parallel sharding plan of DecoderLM (docs/parallel.md): which part of each
// checkpoint tensor a rank loads.
//
//  - q/k/v_proj: column-parallel, split by head (rank r owns query heads
//    [r·Hq/N, (r+1)·Hq/N) and KV heads [r·Hkv/N, (r+1)·Hkv/N): rows of the weight);
//  - gate/up_proj: column-parallel, split along intermediate (rows); each MoE expert's too;
//  - o_proj, down_proj: row-parallel, split along their input dimension (columns); the
//    partial outputs are summed by an all-reduce;
//  - embedding, lm_head, norms, q/k norms, MoE routers: replicated.
// Plain functions and value types; no state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "oasis/model_config.h"
#include "oasis/status.h"
#include "parallel/communicator.h"

namespace oasis {

// This rank's place in the tensor-parallel group. {0, 1, nullptr} = no tensor parallelism.
// `comm` (size > 1 only; not owned) performs the all-reduces of the forward pass; it must
// be this rank's communicator of a group of `size` ranks.
struct TensorParallel {
  int rank = 0;
  int size = 1;
  Communicator* comm = nullptr;
};

// The part of one checkpoint tensor a rank loads: [begin, end) along `dim`, or the whole
// tensor when dim < 0.
struct WeightPart {
  std::string name;
  std::vector<int64_t> shape;  // the full checkpoint shape
  int dim = -1;                // -1 = whole (replicated)
  int64_t begin = 0, end = 0;  // along dim

  // The shape this rank holds.
  std::vector<int64_t> LocalShape() const;
};

// InvalidArgument unless 0 <= rank < size, comm is set when size > 1 with matching rank
// and size, and num_attention_heads, num_key_value_heads, intermediate_size (when a layer
// keeps the dense MLP) and moe_intermediate_size (when a layer is MoE) divide by size.
Status CheckTensorParallel(const ModelConfig& config, const TensorParallel& tp);

// The config one rank computes with: local head counts and intermediate sizes (the rest,
// hidden size and vocab included, unchanged). Requires CheckTensorParallel to pass.
ModelConfig LocalConfig(const ModelConfig& config, const TensorParallel& tp);

// Whether the parts of one weight stacked along dimension 0 (q|k|v, gate|up, or one part),
// each this rank's slice, are whole blocks of an FP8 checkpoint's block_out x block_in scale
// grid, so that the stacked weight has a well-defined stacked grid (docs/fp8.md "FP8
// weights"): every slice begins on a block boundary of its dimension and ends on one or at
// the end of the dimension, every part but the last holds a whole number of block rows, and
// all parts have the same local column count.
bool PartsOnFp8Blocks(const std::vector<WeightPart>& parts, int64_t block_out, int64_t block_in);

// Whole tensor (replicated).
WeightPart Replicated(std::string name, std::vector<int64_t> shape);
// Rank tp.rank's 1/tp.size of dimension `dim` (which must divide by tp.size, CHECK).
WeightPart Shard(std::string name, std::vector<int64_t> shape, int dim, const TensorParallel& tp);

}  // namespace oasis
