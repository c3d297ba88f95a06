// 64-byte aligned std::vector storage, the alignment deep-learning frameworks give tensors (so
// host buffers in LBCC's benchmarks and tools behave like a trainer's): AlignedVector<float>.
//
// Thread-safety: as std::vector.
#ifndef LBCC_BASE_ALIGNED_H_
#define LBCC_BASE_ALIGNED_H_

#include <cstddef>
#include <new>
#include <vector>

namespace lbcc {

inline constexpr std::size_t kTensorAlignment = 64;

template <typename T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) {}  // NOLINT: allocator conversion
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{kTensorAlignment}));
  }
  void deallocate(T* p, std::size_t) {
    ::operator delete(p, std::align_val_t{kTensorAlignment});
  }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const AlignedAllocator<U>&) const { return false; }
};

template <typename T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace lbcc

#endif  // LBCC_BASE_ALIGNED_H_
