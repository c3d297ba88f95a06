// CUDA kernels of the dense quantizer (encode) and the subspace codec's elementwise steps. The
// arithmetic lives in dense_encode.h and subspace_kernels.h (shared with the host emulation).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dense_encode.h"
#include "kernels/device_block.cuh"
#include "kernels/grid.cuh"
#include "kernels/launch.h"
#include "kernels/subspace_kernels.h"

namespace lbcc::kernels {
namespace {

#define LBCC_GRID_STRIDE(i, n)                                                      \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n);         \
       i += int64_t{gridDim.x} * blockDim.x)

__global__ void __launch_bounds__(kDenseThreads) DenseIntKernel(DenseEncodeArgs a) {
  using Block = DeviceBlock<DenseBlockShared, DenseBlockLocal, kDenseThreads>;
  LBCC_DEVICE_BLOCK(Block, block);
  const int64_t blocks = (a.n + a.block - 1) / a.block;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) DenseEncodeIntBlock(block, a, b);
}

__global__ void DenseHalfKernel(DenseEncodeArgs a) {
  LBCC_GRID_STRIDE(i, a.n) DenseEncodeHalfElement(a, i);
}

__global__ void SubtractTableKernel(SubspaceForwardArgs a) {
  LBCC_GRID_STRIDE(e, a.tokens * a.components * a.k) SubtractProjectedTable(a, e);
}

__global__ void ChooseKernel(SubspaceForwardArgs a) {
  const int64_t blocks = (a.tokens + a.mixture_block - 1) / a.mixture_block;
  LBCC_GRID_STRIDE(blk, blocks) a.selectors[blk] = ChooseComponent(a, blk);
}

__global__ void GatherComponentKernel(SubspaceForwardArgs a) {
  LBCC_GRID_STRIDE(e, a.tokens * a.k) GatherComponent(a, e);
}

__global__ void QuantizeKernel(SubspaceQuantizeArgs a) {
  LBCC_GRID_STRIDE(e, a.tokens * a.k) QuantizeCoefficient(a, e);
}

__global__ void QuantizeInt8Kernel(SubspaceQuantizeArgs a) {
  const int64_t runs = a.tokens * ((a.k + a.int8_block - 1) / a.int8_block);
  LBCC_GRID_STRIDE(r, runs) QuantizeInt8Run(a, r);
}

__global__ void DequantizeKernel(SubspaceDequantizeArgs a) {
  LBCC_GRID_STRIDE(e, a.tokens * a.k) DequantizeCoefficient(a, e);
}

__global__ void GatherTableKernel(SubspaceGatherArgs a) {
  LBCC_GRID_STRIDE(e, a.tokens * a.d) GatherTableElement(a, e);
}

}  // namespace

namespace launch {

int DenseEncode(const DenseEncodeArgs& args, Stream stream) {
  if (args.n == 0) return 0;
  if (args.format == kDenseInt8 || args.format == kDenseInt4) {
    DenseIntKernel<<<Grid((args.n + args.block - 1) / args.block, 1), kDenseThreads, 0,
                     S(stream)>>>(args);
  } else {
    DenseHalfKernel<<<Grid(args.n), kThreads, 0, S(stream)>>>(args);
  }
  return LastError();
}

int SubspaceForwardPrep(const SubspaceForwardArgs& args, Stream stream) {
  if (args.tokens == 0) return 0;
  if (args.ids != nullptr) {
    SubtractTableKernel<<<Grid(args.tokens * args.components * args.k), kThreads, 0, S(stream)>>>(
        args);
  }
  if (args.components > 1) {
    const int64_t blocks = (args.tokens + args.mixture_block - 1) / args.mixture_block;
    ChooseKernel<<<Grid(blocks, 64), 64, 0, S(stream)>>>(args);
    GatherComponentKernel<<<Grid(args.tokens * args.k), kThreads, 0, S(stream)>>>(args);
  }
  return LastError();
}

int SubspaceQuantize(const SubspaceQuantizeArgs& args, Stream stream) {
  if (args.tokens == 0) return 0;
  if (args.dtype == kCoefI8) {
    const int64_t runs = args.tokens * ((args.k + args.int8_block - 1) / args.int8_block);
    QuantizeInt8Kernel<<<Grid(runs), kThreads, 0, S(stream)>>>(args);
  } else {
    QuantizeKernel<<<Grid(args.tokens * args.k), kThreads, 0, S(stream)>>>(args);
  }
  return LastError();
}

int SubspaceDequantize(const SubspaceDequantizeArgs& args, Stream stream) {
  if (args.tokens == 0) return 0;
  DequantizeKernel<<<Grid(args.tokens * args.k), kThreads, 0, S(stream)>>>(args);
  return LastError();
}

int SubspaceGatherTable(const SubspaceGatherArgs& args, Stream stream) {
  if (args.tokens == 0) return 0;
  GatherTableKernel<<<Grid(args.tokens * args.d), kThreads, 0, S(stream)>>>(args);
  return LastError();
}

}  // namespace launch
}  // namespace lbcc::kernels
