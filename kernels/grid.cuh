// Launch geometry the .cu files share: threads per block, the grid for a number of items (at
// most kMaxGrid blocks: the kernels' grid-stride loops cover the rest), the stream handle and
// the last launch error. CUDA only: compiled by nvcc with the .cu files.
#ifndef LBCC_KERNELS_GRID_CUH_
#define LBCC_KERNELS_GRID_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/launch.h"

namespace lbcc::kernels {

inline constexpr int kThreads = 256;
inline constexpr int64_t kMaxGrid = 1 << 20;

inline cudaStream_t S(Stream stream) { return static_cast<cudaStream_t>(stream); }

inline unsigned Grid(int64_t items, int64_t per_block = kThreads) {
  int64_t blocks = (items + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxGrid) blocks = kMaxGrid;
  return static_cast<unsigned>(blocks);
}

inline int LastError() { return static_cast<int>(cudaGetLastError()); }

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_GRID_CUH_
