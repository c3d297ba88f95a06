// TensorView: a non-owning view of a dense, row-major tensor in host or CUDA memory.
//
// A view names memory the caller owns; it must outlive every call that receives the view (and,
// for non-blocking calls, the completion of the request). Create() validates its arguments;
// the accessors never fail.
//
// Thread-safety: a TensorView is a value; concurrent reads are safe, and what the memory holds is
// the caller's business.
#ifndef LBCC_BASE_TENSOR_VIEW_H_
#define LBCC_BASE_TENSOR_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/dtype.h"

namespace lbcc {

enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };

using Shape = absl::InlinedVector<int64_t, 4>;

// Largest rank a view (and a payload header) may have.
inline constexpr int kMaxRank = 8;

// Number of elements of `shape`; InvalidArgument for negative dims, rank > kMaxRank or a
// product that overflows int64.
absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape);
// "[4096, 4096]".
std::string ShapeToString(absl::Span<const int64_t> shape);

class TensorView {
 public:
  // An empty f32 host view of shape [0].
  TensorView() : shape_({0}) {}

  // Checks: shape valid (see NumElements), data non-null unless the tensor is empty, data
  // aligned to the element size, device >= 0 for CUDA memory. InvalidArgument otherwise.
  static absl::StatusOr<TensorView> Create(void* data, DType dtype, Shape shape,
                                           MemoryKind memory = MemoryKind::kHost,
                                           int device = 0);

  // Convenience for host float tensors in tests and tools (checks as Create).
  static absl::StatusOr<TensorView> Host(float* data, Shape shape) {
    return Create(data, DType::kF32, std::move(shape));
  }

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t num_elements() const { return num_elements_; }
  size_t num_bytes() const { return static_cast<size_t>(num_elements_) * DTypeSize(dtype_); }
  MemoryKind memory() const { return memory_; }
  int device() const { return device_; }
  bool is_host() const { return memory_ == MemoryKind::kHost; }

  // "f32[4096, 4096]@host".
  std::string DebugString() const;

 private:
  TensorView(void* data, DType dtype, Shape shape, int64_t num_elements, MemoryKind memory,
             int device)
      : data_(data),
        dtype_(dtype),
        shape_(std::move(shape)),
        num_elements_(num_elements),
        memory_(memory),
        device_(device) {}

  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  int64_t num_elements_ = 0;
  MemoryKind memory_ = MemoryKind::kHost;
  int device_ = 0;
};

}  // namespace lbcc

#endif  // LBCC_BASE_TENSOR_VIEW_H_
