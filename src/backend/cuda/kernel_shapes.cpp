#include "backend/cuda/kernel_shapes.h"

#include <string>

namespace oasis {
namespace {

std::string Who(const ModelConfig& c) {
  return c.architecture == Architecture::kEagle3Llama ? "the draft head's " : "";
}

Status Refuse(const ModelConfig& c, const std::string& what) {
  return Unimplemented(Who(c) + what + " is not supported by the CUDA kernels; use --backend cpu");
}

// The MoE kernels (kernels/moe.h MoeSupported): the experts' tables in shared memory, rows of
// 16-byte vectors along hidden and each rank's slice of the expert intermediate size.
Status CheckMoeShapes(const ModelConfig& c, int64_t tp) {
  if (c.num_experts > kCudaMoeMaxExperts) {
    return Refuse(c, "num_experts " + std::to_string(c.num_experts) + " (supported: at most " +
                         std::to_string(kCudaMoeMaxExperts) + ")");
  }
  if (c.hidden_size % kCudaMoeDimMultiple != 0) {
    return Refuse(c, "hidden_size " + std::to_string(c.hidden_size) +
                         " with mixture-of-experts layers (supported: a multiple of " +
                         std::to_string(kCudaMoeDimMultiple) + ")");
  }
  if (c.moe_intermediate_size % tp != 0 || (c.moe_intermediate_size / tp) % kCudaMoeDimMultiple) {
    return Refuse(c, "moe_intermediate_size " + std::to_string(c.moe_intermediate_size) +
                         (tp > 1 ? " over " + std::to_string(tp) + " tensor-parallel ranks" : "") +
                         " (supported: a multiple of " + std::to_string(kCudaMoeDimMultiple) +
                         " per rank)");
  }
  return Status::Ok();
}

}  // namespace

Status CheckCudaKernelShapes(const ModelConfig& c, int tp_size) {
  const std::string d = std::to_string(c.head_dim);
  // Attention: the decode kernel takes 64/128/256, the tensor-core prefill 64/128, every other
  // head_dim runs the reference kernel, whose lanes hold at most 8 values (head_dim <= 256).
  // Smaller than 16 no kernel path is verified, and head_dim 8 was measured wrong (issue 29).
  if (c.head_dim < kCudaMinHeadDim || c.head_dim > kCudaMaxHeadDim ||
      c.head_dim % kCudaHeadDimMultiple != 0) {
    return Refuse(c, "head_dim " + d + " (supported: a multiple of " +
                         std::to_string(kCudaHeadDimMultiple) + " from " +
                         std::to_string(kCudaMinHeadDim) + " to " +
                         std::to_string(kCudaMaxHeadDim) + "; fastest 64 and 128)");
  }
  if (c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 ||
      c.num_attention_heads % c.num_key_value_heads != 0) {
    return Refuse(c, std::to_string(c.num_attention_heads) + " query heads over " +
                         std::to_string(c.num_key_value_heads) +
                         " KV heads (supported: a whole number of query heads per KV head)");
  }
  const int64_t tp = tp_size < 1 ? 1 : tp_size;
  if (c.num_key_value_heads % tp != 0 || c.num_attention_heads % tp != 0) {
    return Refuse(c, std::to_string(c.num_attention_heads) + "/" +
                         std::to_string(c.num_key_value_heads) + " heads over " +
                         std::to_string(tp) +
                         " tensor-parallel ranks (supported: both divisible by the ranks)");
  }
  // GEMM dimensions go to cuBLAS as int; the sampler's vocabulary is an int.
  const struct {
    const char* name;
    int64_t value;
  } dims[] = {{"hidden_size", c.hidden_size},
              {"intermediate_size", c.intermediate_size},
              {"vocab_size", c.vocab_size},
              {"draft_vocab_size", c.draft_vocab_size},
              {"the QKV width", c.q_size() + 2 * c.kv_size()}};
  for (const auto& dim : dims) {
    if (dim.value > kCudaMaxGemmDim) {
      return Refuse(c, std::string(dim.name) + " " + std::to_string(dim.value) +
                           " (supported: at most " + std::to_string(kCudaMaxGemmDim) + ")");
    }
  }
  if (c.HasMoeLayers()) OASIS_RETURN_IF_ERROR(CheckMoeShapes(c, tp));
  return Status::Ok();
}

Status CheckCudaSparseShapes(const ModelConfig& c) {
  const int64_t d = c.head_dim;
  if (d != 32 && d != 64 && d != 128 && d != 256) {
    return Refuse(
        c, "sparse KV with head_dim " + std::to_string(d) + " (supported: 32, 64, 128, 256)");
  }
  const int64_t group =
      c.num_key_value_heads > 0 ? c.num_attention_heads / c.num_key_value_heads : 0;
  if (group < 1 || group > kCudaSparseMaxGroup) {
    return Refuse(c, "sparse KV with " + std::to_string(group) +
                         " query heads per KV head (supported: 1 to " +
                         std::to_string(kCudaSparseMaxGroup) + ")");
  }
  return Status::Ok();
}

}  // namespace oasis
