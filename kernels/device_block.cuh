// The CUDA side of kernels/block.h: a thread block running a block-level algorithm.
//
//   Phase(f)              f(threadIdx.x, this thread's Local), then __syncthreads()
//   ExclusiveSum(in, out) CUB block scans over one uint32 per thread, then __syncthreads()
//   InclusiveSuffixSum(in, out)
//   CountDigit(hist, digit, active)  warp-aggregated shared-memory histogram update
//
// kThreads must equal blockDim.x. Shared memory comes from the kernel (Storage, declared as raw
// bytes because __shared__ variables cannot have constructors).
#ifndef LBCC_KERNELS_DEVICE_BLOCK_CUH_
#define LBCC_KERNELS_DEVICE_BLOCK_CUH_

#include <cstdint>

#include <cub/block/block_scan.cuh>

namespace lbcc::kernels {

template <typename Shared, typename Local, int kThreads>
class DeviceBlock {
 public:
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  struct Storage {
    Shared shared;
    typename Scan::TempStorage scan;
  };

  __device__ explicit DeviceBlock(Storage& storage) : storage_(storage) {}

  __device__ int threads() const { return kThreads; }
  __device__ Shared& shared() { return storage_.shared; }

  template <typename F>
  __device__ __forceinline__ void Phase(F&& f) {
    f(static_cast<int>(threadIdx.x), local_);
    __syncthreads();
  }

  // ++hist[digit] for the active threads: lanes of a warp with the same digit add once, so
  // the skewed histograms of a radix select (most keys share a digit) do not serialize on one
  // shared-memory address. Every lane of the warp must call it.
  __device__ __forceinline__ void CountDigit(uint32_t* hist, uint32_t digit, bool active) {
    if (!__any_sync(0xffffffffu, active)) return;
    const unsigned key = active ? digit : 0xffffffffu;
    const unsigned peers = __match_any_sync(0xffffffffu, key);
    if (active && (threadIdx.x & 31) == static_cast<unsigned>(__ffs(peers) - 1)) {
      atomicAdd(&hist[digit], static_cast<uint32_t>(__popc(peers)));
    }
  }

  __device__ __forceinline__ void ExclusiveSum(const uint32_t* in, uint32_t* out) {
    const int t = static_cast<int>(threadIdx.x);
    const uint32_t v = in[t];
    uint32_t r;
    Scan(storage_.scan).ExclusiveSum(v, r);
    out[t] = r;
    __syncthreads();
  }

  __device__ __forceinline__ void InclusiveSuffixSum(const uint32_t* in, uint32_t* out) {
    const int t = static_cast<int>(threadIdx.x);
    const uint32_t v = in[kThreads - 1 - t];
    uint32_t r;
    Scan(storage_.scan).InclusiveSum(v, r);
    out[kThreads - 1 - t] = r;
    __syncthreads();
  }

 private:
  Storage& storage_;
  Local local_;
};

// Declares `name`, a DeviceBlock over shared storage of the kernel.
#define LBCC_DEVICE_BLOCK(Type, name)                                            \
  __shared__ alignas(16) unsigned char name##_raw[sizeof(typename Type::Storage)]; \
  Type name(*reinterpret_cast<typename Type::Storage*>(name##_raw))

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_DEVICE_BLOCK_CUH_
