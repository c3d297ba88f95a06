#include "base/aligned.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace lbcc {
namespace {

TEST(AlignedVectorTest, StorageIs64ByteAligned) {
  for (size_t n : {size_t{1}, size_t{3}, size_t{1000}, size_t{1} << 22}) {
    AlignedVector<float> v(n, 1.5f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kTensorAlignment, 0u) << n;
    EXPECT_EQ(v[n - 1], 1.5f);
    v.resize(n * 2 + 1);  // reallocation keeps the alignment
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kTensorAlignment, 0u) << n;
  }
}

}  // namespace
}  // namespace lbcc
