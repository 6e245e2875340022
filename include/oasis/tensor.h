// Tensor: a contiguous, row-major n-d array view with a dtype and a device.
//
// A Tensor either views memory owned elsewhere (`owner` empty) or shares ownership of
// its storage through `owner` (a shared_ptr), so views taken from an owning tensor keep
// the storage alive. Copying a Tensor copies the view, never the data.
// Thread-compatible: concurrent reads are fine; writers need external synchronisation.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "oasis/dtype.h"

namespace oasis {

enum class Device : uint8_t { kCpu, kCuda };

class Tensor {
 public:
  Tensor() = default;
  Tensor(void* data, DType dtype, std::vector<int64_t> shape, Device device = Device::kCpu,
         std::shared_ptr<void> owner = nullptr);

  // New host tensor (64-byte aligned). Empty leaves the contents uninitialised.
  static Tensor Empty(std::vector<int64_t> shape, DType dtype);
  static Tensor Zeros(std::vector<int64_t> shape, DType dtype);
  // New host f32 tensor holding `values`, with the given shape (numel must match).
  static Tensor FromFloats(const std::vector<float>& values, std::vector<int64_t> shape);
  // New 1-D host i32 tensor holding `values`.
  static Tensor FromInts(const std::vector<int32_t>& values);
  // New host tensor stacking host tensors of equal dtype and trailing shape along dim 0.
  static Tensor ConcatRows(const std::vector<Tensor>& parts);

  bool defined() const { return data_ != nullptr || numel() == 0; }
  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  const std::shared_ptr<void>& owner() const { return owner_; }

  // Same data, new shape (numel must match).
  Tensor Reshape(std::vector<int64_t> shape) const;
  // Rows [begin, end) along dimension 0.
  Tensor Slice(int64_t begin, int64_t end) const;
  // Deep copy into a new host tensor (CPU tensors only).
  Tensor Clone() const;
  // Host copy converted to f32 (CPU tensors only).
  Tensor ToFloat() const;

  // "[2, 3, 4] BF16"
  std::string ToString() const;

  // Block scales of a block-quantized linear weight (an F8E4M3 weight [out, in] of an FP8
  // checkpoint kept in e4m3, docs/fp8.md "FP8 weights"): an F32 tensor
  // [ceil(out / block_rows), ceil(in / block_cols)] on the weight's device; the real weight is
  // w[o, i] * scales[o / block_rows, i / block_cols]. nullptr for every other tensor.
  // Copies of the Tensor keep them; views (Reshape, Slice) and Clone drop them.
  const Tensor* block_scales() const { return block_scales_.get(); }
  int scale_block_rows() const { return scale_block_rows_; }
  int scale_block_cols() const { return scale_block_cols_; }
  // This view with `scales` attached (a 2-D tensor with the shape above, checked).
  Tensor WithBlockScales(Tensor scales, int block_rows, int block_cols) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  std::vector<int64_t> shape_;
  std::shared_ptr<void> owner_;
  std::shared_ptr<const Tensor> block_scales_;
  int scale_block_rows_ = 0, scale_block_cols_ = 0;
};

std::string ShapeToString(const std::vector<int64_t>& shape);

}  // namespace oasis
