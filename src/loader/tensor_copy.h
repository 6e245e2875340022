// Helpers shared by the WeightSource implementations: request validation for Load /
// LoadSlice, slice iteration, and dtype-converting copies from unaligned bytes.
// Stateless free functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loader/weights.h"
#include "oasis/dtype.h"
#include "oasis/status.h"

namespace oasis {

// True for F32, F16, BF16, F64.
bool IsFloatDType(DType dtype);

// Whether a tensor stored as `src` may be loaded as `dst`: float tensors to F32/F16/BF16
// (or to their own dtype), integer/bool tensors only to their own dtype.
// InvalidArgument naming `source` and the tensor otherwise.
Status CheckConversion(const TensorInfo& info, DType dst, const std::string& source);

// Validates a LoadSlice request: InvalidArgument for a bad `dim` (must be in [0, ndim)),
// OutOfRange unless 0 <= begin <= end <= shape[dim].
Status CheckSlice(const TensorInfo& info, int dim, int64_t begin, int64_t end,
                  const std::string& source);

// Shape of the slice [begin, end) of `dim`.
std::vector<int64_t> SliceShape(const std::vector<int64_t>& shape, int dim, int64_t begin,
                                int64_t end);

// Calls fn(src_offset, dst_offset, count) (element offsets into the row-major full tensor
// and into the row-major slice) for each contiguous run of the slice [begin, end) of `dim`.
// Arguments must have passed CheckSlice.
void ForEachSliceRun(const std::vector<int64_t>& shape, int dim, int64_t begin, int64_t end,
                     const std::function<void(int64_t, int64_t, int64_t)>& fn);

// Converts `count` elements from `src` (any alignment) of `src_dtype` into `dst` (aligned
// for `dst_dtype`). The pair must pass CheckConversion.
void ConvertElements(const uint8_t* src, DType src_dtype, void* dst, DType dst_dtype, size_t count);

}  // namespace oasis
