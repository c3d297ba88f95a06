// The CUDA side of kernels/block.h: a thread block running a block-level algorithm.
//
//   Phase(f)              f(threadIdx.x, this thread's Local), then __syncthreads()
//   ExclusiveSum(in, out) CUB block scans over one uint32 per thread, then __syncthreads()
//   InclusiveSuffixSum(in, out)
//   ExclusiveSumOf(f, out), InclusiveSuffixSumOf(f, out)  the same of f(threadIdx.x, Local)
//   CountDigit(hist, digit, active)  shared-memory histogram update, warp-aggregated when skewed
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

  // More lanes than this on the first active lane's digit: combine a warp's equal digits.
  static constexpr int kSkewedLanes = 4;

  __device__ explicit DeviceBlock(Storage& storage) : storage_(storage) {}

  __device__ int threads() const { return kThreads; }
  __device__ Shared& shared() { return storage_.shared; }

  template <typename F>
  __device__ __forceinline__ void Phase(F&& f) {
    f(static_cast<int>(threadIdx.x), local_);
    __syncthreads();
  }

  // ++hist[digit] for the active threads. Spread digits (a wide histogram of Gaussian-like
  // keys) go straight to shared-memory atomics. When several lanes share the first active
  // lane's digit (constant regions, a narrow prefix in a later radix pass), the warp combines
  // equal digits first, so a skewed histogram does not serialize on one address. Every lane of
  // the warp must call it.
  __device__ __forceinline__ void CountDigit(uint32_t* hist, uint32_t digit, bool active) {
    const unsigned act = __ballot_sync(0xffffffffu, active);
    if (act == 0) return;
    const int lane = static_cast<int>(threadIdx.x & 31);
    const int lead = __ffs(act) - 1;
    const unsigned lead_digit = __shfl_sync(0xffffffffu, digit, lead);
    const unsigned same = __ballot_sync(0xffffffffu, active && digit == lead_digit);
    if (same == act) {
      if (lane == lead) atomicAdd(&hist[digit], static_cast<uint32_t>(__popc(act)));
    } else if (__popc(same) > kSkewedLanes) {
      const unsigned key = active ? digit : 0xffffffffu;
      const unsigned peers = __match_any_sync(0xffffffffu, key);
      if (active && lane == __ffs(peers) - 1) {
        atomicAdd(&hist[digit], static_cast<uint32_t>(__popc(peers)));
      }
    } else if (active) {
      atomicAdd(&hist[digit], 1u);
    }
  }

  template <typename F>
  __device__ __forceinline__ void ExclusiveSumOf(F&& f, uint32_t* out) {
    const uint32_t v = f(static_cast<int>(threadIdx.x), local_);
    uint32_t r;
    Scan(storage_.scan).ExclusiveSum(v, r);
    out[threadIdx.x] = r;
    __syncthreads();
  }

  // The suffix sum is the total less the exclusive prefix sum (unsigned wrap-around is exact).
  template <typename F>
  __device__ __forceinline__ void InclusiveSuffixSumOf(F&& f, uint32_t* out) {
    const uint32_t v = f(static_cast<int>(threadIdx.x), local_);
    uint32_t r, total;
    Scan(storage_.scan).ExclusiveSum(v, r, total);
    out[threadIdx.x] = total - r;
    __syncthreads();
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
