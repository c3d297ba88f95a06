#include "base/tensor_view.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lbcc {

absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape) {
  if (shape.size() > static_cast<size_t>(kMaxRank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", shape.size(), " exceeds the maximum of ", kMaxRank));
  }
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeToString(shape), " has a negative dimension"));
    }
    if (dim != 0 && count > INT64_MAX / dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeToString(shape), " has too many elements"));
    }
    count *= dim;
  }
  return count;
}

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<TensorView> TensorView::Create(void* data, DType dtype, Shape shape,
                                              MemoryKind memory, int device) {
  if (!IsValidDType(static_cast<uint8_t>(dtype))) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid dtype value ", static_cast<int>(dtype)));
  }
  absl::StatusOr<int64_t> count = NumElements(shape);
  if (!count.ok()) return count.status();
  const size_t element = DTypeSize(dtype);
  if (*count > 0 && static_cast<uint64_t>(*count) > SIZE_MAX / element) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeToString(shape), " is too large in bytes"));
  }
  if (*count > 0 && data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("null data for a tensor of shape ", ShapeToString(shape)));
  }
  if (reinterpret_cast<uintptr_t>(data) % element != 0) {
    return absl::InvalidArgumentError(absl::StrCat("data pointer is not aligned to the ",
                                                   element, "-byte ", DTypeName(dtype),
                                                   " element"));
  }
  if (memory != MemoryKind::kHost && memory != MemoryKind::kCuda) {
    return absl::InvalidArgumentError("unknown memory kind");
  }
  if (memory == MemoryKind::kCuda && device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("invalid CUDA device ", device));
  }
  return TensorView(data, dtype, std::move(shape), *count, memory,
                    memory == MemoryKind::kHost ? 0 : device);
}

std::string TensorView::DebugString() const {
  return absl::StrCat(DTypeName(dtype_), ShapeToString(shape_), "@",
                      memory_ == MemoryKind::kHost ? "host" : absl::StrCat("cuda:", device_));
}

}  // namespace lbcc
