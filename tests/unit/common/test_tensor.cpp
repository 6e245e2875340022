#include <catch2/catch.hpp>

#include <new>

#include "oasis/tensor.h"

using namespace oasis;

TEST_CASE("Tensor shapes, views and ownership", "[tensor]") {
  Tensor t = Tensor::Zeros({3, 4}, DType::kF32);
  CHECK(t.numel() == 12);
  CHECK(t.nbytes() == 48);
  CHECK(t.dim(-1) == 4);
  CHECK(reinterpret_cast<uintptr_t>(t.raw()) % 64 == 0);
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = static_cast<float>(i);

  Tensor rows = t.Slice(1, 3);
  CHECK(rows.shape() == std::vector<int64_t>{2, 4});
  CHECK(rows.data<float>()[0] == 4.0f);
  Tensor flat = t.Reshape({12});
  CHECK(flat.data<float>()[11] == 11.0f);
  CHECK(t.ToString() == "[3, 4] F32");

  Tensor view;
  {
    Tensor owner = Tensor::FromFloats({1, 2, 3, 4}, {2, 2});
    view = owner.Slice(1, 2);
  }
  // The slice keeps the storage alive after the owner is gone.
  CHECK(view.data<float>()[1] == 4.0f);

  Tensor c = t.Clone();
  c.data<float>()[0] = 100;
  CHECK(t.data<float>()[0] == 0.0f);
}

TEST_CASE("Tensor ToFloat converts bf16", "[tensor]") {
  Tensor b = Tensor::Empty({2}, DType::kBF16);
  b.data<uint16_t>()[0] = FloatToBf16Bits(1.5f);
  b.data<uint16_t>()[1] = FloatToBf16Bits(-0.25f);
  Tensor f = b.ToFloat();
  CHECK(f.dtype() == DType::kF32);
  CHECK(f.data<float>()[0] == 1.5f);
  CHECK(f.data<float>()[1] == -0.25f);
}

// A host allocation that cannot succeed throws std::bad_alloc (programs catch it around model
// loading and exit with an error) instead of aborting on a CHECK.
TEST_CASE("Tensor::Empty: an impossible host allocation throws bad_alloc", "[tensor]") {
  CHECK_THROWS_AS(Tensor::Empty({int64_t{1} << 62}, DType::kF32), std::bad_alloc);  // > size_t
  CHECK_THROWS_AS(Tensor::Empty({int64_t{1} << 40, int64_t{1} << 40}, DType::kBF16),
                  std::bad_alloc);  // the element count overflows
  CHECK_THROWS_AS(Tensor::Empty({int64_t{1} << 56}, DType::kU8), std::bad_alloc);  // 64 PiB
}
