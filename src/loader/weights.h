// WeightSource: named tensors of a checkpoint, read into host memory on request.
//
// Implementations: safetensors checkpoints (single file or sharded through
// model.safetensors.index.json) and dummy random weights (`--load-format dummy`).
// A WeightSource is immutable after opening; all methods are thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "oasis/dtype.h"
#include "oasis/status.h"
#include "oasis/tensor.h"

namespace oasis {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  // Human-readable origin ("model.safetensors in /path", "dummy weights").
  virtual std::string Describe() const = 0;
  virtual std::vector<std::string> Names() const = 0;
  virtual bool Has(const std::string& name) const = 0;
  virtual StatusOr<TensorInfo> Info(const std::string& name) const = 0;

  // Reads the whole tensor converted to `dtype` (F32, F16 or BF16 for float tensors;
  // integer/bool tensors only to their own dtype) into a new host tensor.
  virtual StatusOr<Tensor> Load(const std::string& name, DType dtype) const = 0;

  // Reads the index range [begin, end) of dimension `dim` (0 = rows, 1 = columns of a
  // 2-D tensor; any dim in [0, ndim) works), converted to `dtype`. For tensor-parallel
  // sharding. The result equals the same part of Load(name, dtype).
  // Errors (Load too): NotFound for an unknown name, InvalidArgument for a dtype the tensor
  // cannot be converted to or a bad `dim`, OutOfRange unless 0 <= begin <= end <= shape[dim].
  // The stored bytes of a tensor, without a copy, when the source has them in memory (a
  // mapped checkpoint): valid while the WeightSource lives. Unimplemented otherwise.
  virtual StatusOr<std::span<const uint8_t>> RawBytes(const std::string& name) const {
    return Unimplemented(Describe() + " has no in-memory bytes for '" + name + "'");
  }

  virtual StatusOr<Tensor> LoadSlice(const std::string& name, int dim, int64_t begin, int64_t end,
                                     DType dtype) const = 0;
};

// Opens the safetensors checkpoint in `model_dir`: `model.safetensors.index.json` when
// present (all shards validated; only tensors named in its weight_map are exposed), else
// every `*.safetensors` file in the directory (a tensor name in two files is an error).
// `model_dir` may also be a single .safetensors file. Files are mmapped read-only and every
// header is fully validated here (see loader/safetensors.h for the error codes).
StatusOr<std::unique_ptr<WeightSource>> OpenSafetensorsWeights(
    const std::filesystem::path& model_dir);

// What a model expects a checkpoint to hold; also the recipe for dummy weights.
enum class DummyInit { kNormal, kOnes, kZeros };
struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kBF16;
  DummyInit init = DummyInit::kNormal;
  float stddev = 0.02f;  // for kNormal

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Random weights following `specs` (deterministic in `seed`), generated on Load. Element i
// of a kNormal tensor is a pure function of (seed, name, i), rounded to the spec's dtype, so
// LoadSlice generates only the requested part and agrees with Load. Specs must have unique
// names and non-negative dims; kNormal needs a float dtype (broken specs are CHECK failures).
std::unique_ptr<WeightSource> MakeDummyWeights(std::vector<WeightSpec> specs, uint64_t seed);

// Bytes the weights of `specs` take once loaded: each element at `bytes_per_element`, or at
// its spec's own dtype where that is smaller and `at_most_spec_dtype` (e4m3 weights kept as
// such on a GPU). A double: no overflow for any config the parser accepts.
double WeightBytes(const std::vector<WeightSpec>& specs, size_t bytes_per_element,
                   bool at_most_spec_dtype = false);

// Refuses, before anything is allocated, `bytes` of weights that must live in host memory when
// they exceed what this machine has available now (MemAvailable and the memory cgroup; no
// check where neither is known): ResourceExhausted naming `what` ("the model's weights"), both
// sizes in GiB and what to change. (Tensor::Empty would fail the allocation, or the kernel's
// OOM killer end the process, part-way through loading.)
Status CheckHostMemoryForWeights(double bytes, const std::string& what);

}  // namespace oasis
