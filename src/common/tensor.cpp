#include "oasis/tensor.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

#include "common/check.h"

namespace oasis {

Tensor::Tensor(void* data, DType dtype, std::vector<int64_t> shape, Device device,
               std::shared_ptr<void> owner)
    : data_(data),
      dtype_(dtype),
      device_(device),
      shape_(std::move(shape)),
      owner_(std::move(owner)) {
  for (int64_t d : shape_)
    OASIS_CHECK_GE(d, 0) << "negative dimension in " << ShapeToString(shape_);
}

Tensor Tensor::Empty(std::vector<int64_t> shape, DType dtype) {
  // Out of host memory (or a size past size_t) throws std::bad_alloc, as `new` does: programs
  // catch it around model loading and exit with an error instead of aborting.
  size_t n = 1;
  for (int64_t d : shape) {
    OASIS_CHECK_GE(d, 0) << "negative dimension in " << ShapeToString(shape);
    if (__builtin_mul_overflow(n, static_cast<size_t>(d), &n)) throw std::bad_alloc();
  }
  size_t bytes = 0;
  if (__builtin_mul_overflow(n, DTypeSize(dtype), &bytes) || bytes > SIZE_MAX - 63)
    throw std::bad_alloc();
  size_t alloc = ((bytes + 63) / 64) * 64;
  if (alloc == 0) alloc = 64;
  void* p = std::aligned_alloc(64, alloc);
  if (p == nullptr) throw std::bad_alloc();
  std::shared_ptr<void> owner(p, [](void* q) { std::free(q); });
  return Tensor(p, dtype, std::move(shape), Device::kCpu, std::move(owner));
}

Tensor Tensor::Zeros(std::vector<int64_t> shape, DType dtype) {
  Tensor t = Empty(std::move(shape), dtype);
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

Tensor Tensor::FromFloats(const std::vector<float>& values, std::vector<int64_t> shape) {
  Tensor t = Empty(std::move(shape), DType::kF32);
  OASIS_CHECK_EQ(static_cast<size_t>(t.numel()), values.size())
      << "FromFloats: shape/values mismatch";
  std::memcpy(t.raw(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::FromInts(const std::vector<int32_t>& values) {
  Tensor t = Empty({static_cast<int64_t>(values.size())}, DType::kI32);
  std::memcpy(t.raw(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  if (i < 0) i += n;
  OASIS_CHECK(i >= 0 && i < n) << "dim " << i << " of tensor " << ToString();
  return shape_[static_cast<size_t>(i)];
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

Tensor Tensor::Reshape(std::vector<int64_t> shape) const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  OASIS_CHECK_EQ(n, numel()) << "Reshape " << ToString() << " to " << ShapeToString(shape);
  return Tensor(data_, dtype_, std::move(shape), device_, owner_);
}

Tensor Tensor::ConcatRows(const std::vector<Tensor>& parts) {
  OASIS_CHECK(!parts.empty()) << "ConcatRows of nothing";
  int64_t rows = 0;
  for (const Tensor& p : parts) {
    OASIS_CHECK(p.device() == Device::kCpu && p.dtype() == parts[0].dtype())
        << "ConcatRows: host tensors of one dtype";
    rows += p.dim(0);
  }
  std::vector<int64_t> shape = parts[0].shape();
  shape[0] = rows;
  Tensor out = Empty(shape, parts[0].dtype());
  char* dst = static_cast<char*>(out.raw());
  for (const Tensor& p : parts) {
    std::memcpy(dst, p.raw(), p.nbytes());
    dst += p.nbytes();
  }
  return out;
}

Tensor Tensor::Slice(int64_t begin, int64_t end) const {
  OASIS_CHECK(ndim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0])
      << "Slice [" << begin << ", " << end << ") of " << ToString();
  std::vector<int64_t> s = shape_;
  s[0] = end - begin;
  int64_t row = numel() / (shape_[0] == 0 ? 1 : shape_[0]);
  char* p = static_cast<char*>(data_) + static_cast<size_t>(begin * row) * DTypeSize(dtype_);
  return Tensor(p, dtype_, std::move(s), device_, owner_);
}

Tensor Tensor::WithBlockScales(Tensor scales, int block_rows, int block_cols) const {
  OASIS_CHECK(ndim() == 2 && block_rows > 0 && block_cols > 0 && scales.ndim() == 2 &&
              scales.dtype() == DType::kF32 && scales.device() == device_ &&
              scales.dim(0) == (shape_[0] + block_rows - 1) / block_rows &&
              scales.dim(1) == (shape_[1] + block_cols - 1) / block_cols)
      << "WithBlockScales: scales " << scales.ToString() << " for " << ToString() << " in "
      << block_rows << "x" << block_cols << " blocks";
  Tensor t = *this;
  t.block_scales_ = std::make_shared<const Tensor>(std::move(scales));
  t.scale_block_rows_ = block_rows;
  t.scale_block_cols_ = block_cols;
  return t;
}

Tensor Tensor::Clone() const {
  OASIS_CHECK(device_ == Device::kCpu) << "Clone of a device tensor";
  Tensor t = Empty(shape_, dtype_);
  if (nbytes()) std::memcpy(t.raw(), data_, nbytes());
  return t;
}

Tensor Tensor::ToFloat() const {
  OASIS_CHECK(device_ == Device::kCpu) << "ToFloat of a device tensor";
  Tensor t = Empty(shape_, DType::kF32);
  ConvertToFloat(data_, dtype_, t.data<float>(), static_cast<size_t>(numel()));
  return t;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

std::string Tensor::ToString() const {
  return ShapeToString(shape_) + " " + std::string(DTypeName(dtype_));
}

}  // namespace oasis
