#include "models/tp_sharding.h"

#include "common/check.h"

namespace oasis {

std::vector<int64_t> WeightPart::LocalShape() const {
  std::vector<int64_t> local = shape;
  if (dim >= 0) local[static_cast<size_t>(dim)] = end - begin;
  return local;
}

Status CheckTensorParallel(const ModelConfig& c, const TensorParallel& tp) {
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size) {
    return InvalidArgument("tensor-parallel rank " + std::to_string(tp.rank) + " of size " +
                           std::to_string(tp.size) + " (need 0 <= rank < size)");
  }
  if (tp.size > 1) {
    if (tp.comm == nullptr) return InvalidArgument("tensor-parallel size > 1 needs a communicator");
    if (tp.comm->size() != tp.size || tp.comm->rank() != tp.rank) {
      return InvalidArgument("communicator is rank " + std::to_string(tp.comm->rank()) + " of " +
                             std::to_string(tp.comm->size()) + ", model shard is rank " +
                             std::to_string(tp.rank) + " of " + std::to_string(tp.size));
    }
  }
  const auto divides = [&](int64_t n, const char* what) -> Status {
    if (n % tp.size == 0) return Status::Ok();
    return InvalidArgument(std::string(what) + " = " + std::to_string(n) +
                           " is not divisible by --tensor-parallel-size " +
                           std::to_string(tp.size));
  };
  OASIS_RETURN_IF_ERROR(divides(c.num_attention_heads, "num_attention_heads"));
  OASIS_RETURN_IF_ERROR(divides(c.num_key_value_heads, "num_key_value_heads"));
  if (c.HasDenseMlpLayers())
    OASIS_RETURN_IF_ERROR(divides(c.intermediate_size, "intermediate_size"));
  if (c.HasMoeLayers())
    OASIS_RETURN_IF_ERROR(divides(c.moe_intermediate_size, "moe_intermediate_size"));
  return Status::Ok();
}

ModelConfig LocalConfig(const ModelConfig& c, const TensorParallel& tp) {
  ModelConfig local = c;
  local.num_attention_heads /= tp.size;
  local.num_key_value_heads /= tp.size;
  local.intermediate_size /= tp.size;
  local.moe_intermediate_size /= tp.size;
  return local;
}

bool PartsOnFp8Blocks(const std::vector<WeightPart>& parts, int64_t block_out, int64_t block_in) {
  OASIS_CHECK(block_out > 0 && block_in > 0) << "FP8 blocks " << block_out << "x" << block_in;
  for (size_t i = 0; i < parts.size(); ++i) {
    const WeightPart& p = parts[i];
    if (p.shape.size() != 2) return false;
    const std::vector<int64_t> local = p.LocalShape();
    if (local[1] != parts[0].LocalShape()[1]) return false;
    if (p.dim >= 0) {
      const int64_t block = p.dim == 0 ? block_out : block_in;
      const int64_t full = p.shape[static_cast<size_t>(p.dim)];
      if (p.begin % block != 0 || (p.end % block != 0 && p.end != full)) return false;
    }
    if (i + 1 < parts.size() && local[0] % block_out != 0) return false;
  }
  return !parts.empty();
}

WeightPart Replicated(std::string name, std::vector<int64_t> shape) {
  return WeightPart{std::move(name), std::move(shape), -1, 0, 0};
}

WeightPart Shard(std::string name, std::vector<int64_t> shape, int dim, const TensorParallel& tp) {
  OASIS_CHECK(dim >= 0 && dim < static_cast<int>(shape.size()))
      << "shard dim " << dim << " of " << name;
  const int64_t n = shape[static_cast<size_t>(dim)];
  OASIS_CHECK(n % tp.size == 0) << name << " dim " << dim << " = " << n << " does not divide by "
                                << tp.size;
  const int64_t part = n / tp.size;
  if (tp.size == 1) return Replicated(std::move(name), std::move(shape));
  return WeightPart{std::move(name), std::move(shape), dim, tp.rank * part, (tp.rank + 1) * part};
}

}  // namespace oasis
