#include "loader/tensor_copy.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"

namespace oasis {

bool IsFloatDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 ||
         dtype == DType::kF64;
}

Status CheckConversion(const TensorInfo& info, DType dst, const std::string& source) {
  if (info.dtype == dst) return Status::Ok();
  if (IsFloatDType(info.dtype) &&
      (dst == DType::kF32 || dst == DType::kF16 || dst == DType::kBF16)) {
    return Status::Ok();
  }
  return InvalidArgument(source + ": tensor '" + info.name + "' of dtype " +
                         std::string(DTypeName(info.dtype)) + " cannot be loaded as " +
                         std::string(DTypeName(dst)));
}

Status CheckSlice(const TensorInfo& info, int dim, int64_t begin, int64_t end,
                  const std::string& source) {
  const int ndim = static_cast<int>(info.shape.size());
  if (dim < 0 || dim >= ndim) {
    return InvalidArgument(source + ": tensor '" + info.name + "' of shape " +
                           ShapeToString(info.shape) + " has no dimension " + std::to_string(dim));
  }
  const int64_t size = info.shape[static_cast<size_t>(dim)];
  if (begin < 0 || begin > end || end > size) {
    return OutOfRange(source + ": tensor '" + info.name + "': slice [" + std::to_string(begin) +
                      ", " + std::to_string(end) + ") of dimension " + std::to_string(dim) +
                      " outside [0, " + std::to_string(size) + ")");
  }
  return Status::Ok();
}

std::vector<int64_t> SliceShape(const std::vector<int64_t>& shape, int dim, int64_t begin,
                                int64_t end) {
  std::vector<int64_t> out = shape;
  out[static_cast<size_t>(dim)] = end - begin;
  return out;
}

void ForEachSliceRun(const std::vector<int64_t>& shape, int dim, int64_t begin, int64_t end,
                     const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  OASIS_CHECK(dim >= 0 && dim < static_cast<int>(shape.size())) << "bad slice dim " << dim;
  const int64_t size = shape[static_cast<size_t>(dim)];
  OASIS_CHECK(0 <= begin && begin <= end && end <= size) << "bad slice " << begin << ".." << end;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= shape[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(dim) + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t run = (end - begin) * inner;
  if (run == 0) return;
  for (int64_t o = 0; o < outer; ++o) fn((o * size + begin) * inner, o * run, run);
}

void ConvertElements(const uint8_t* src, DType src_dtype, void* dst, DType dst_dtype,
                     size_t count) {
  if (src_dtype == dst_dtype) {
    if (count) std::memcpy(dst, src, count * DTypeSize(src_dtype));
    return;
  }
  OASIS_CHECK(IsFloatDType(src_dtype)) << "ConvertElements from " << DTypeName(src_dtype);
  // Bounded scratch: source bytes are copied to an aligned buffer first because mapped
  // tensors need not be aligned to their element size.
  constexpr size_t kBlock = 4096;
  alignas(8) uint8_t raw[kBlock * 8];
  alignas(8) float floats[kBlock];
  const size_t src_size = DTypeSize(src_dtype);
  const size_t dst_size = DTypeSize(dst_dtype);
  auto* out = static_cast<uint8_t*>(dst);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(kBlock, count - done);
    std::memcpy(raw, src + done * src_size, n * src_size);
    ConvertToFloat(raw, src_dtype, floats, n);
    ConvertFromFloat(floats, out + done * dst_size, dst_dtype, n);
    done += n;
  }
}

}  // namespace oasis
