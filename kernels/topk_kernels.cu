// CUDA kernels of the TopK-EF codec: encode (select, index coding, value codings, error
// feedback) and decode-accumulate. The arithmetic and the block algorithms live in the shared
// headers (topk_select.h, topk_encode.h, binmean_kernels.h, aggregate.h), which the host tests
// run through kernels/emulated_backend.cc; this file maps them onto grids and launches them.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include <cub/device/device_scan.cuh>
#include <cuda/std/functional>

#include "kernels/aggregate.h"
#include "kernels/binmean_kernels.h"
#include "kernels/binmean_stats.h"
#include "kernels/device_block.cuh"
#include "kernels/grid.cuh"
#include "kernels/launch.h"
#include "kernels/topk_encode.h"
#include "kernels/topk_select.h"

namespace lbcc::kernels {
namespace {

// ---------------------------------------------------------------------------------------------
// Selection: one block of 256 threads per chunk.

__global__ void __launch_bounds__(kSelectThreads, 4) SelectKernel(SelectArgs a) {
  using Block = DeviceBlock<SelectShared, SelectLocal, kSelectThreads>;
  LBCC_DEVICE_BLOCK(Block, block);
  for (int64_t c = blockIdx.x; c < a.g.num_chunks; c += gridDim.x) SelectChunk(block, a, c);
}

// ---------------------------------------------------------------------------------------------
// Index coding.

__global__ void PlanKernel(PlanArgs a) {
  uint64_t total6 = 0, total7 = 0;
  if (a.num_chunks > 0 && a.offsets6 != nullptr) {
    total6 = a.offsets6[a.num_chunks - 1] + a.bits6[a.num_chunks - 1];
    total7 = a.offsets7[a.num_chunks - 1] + a.bits7[a.num_chunks - 1];
  }
  PlanIndexCoding(a.plan, total6, total7, a.summary);
}

__global__ void Packed12Kernel(IndexWriteArgs a) {
  if (a.summary->index_coding != kIndexPacked12) return;
  const int64_t count = a.num_chunks * a.k;
  const int64_t pairs = (count + 1) / 2;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < pairs;
       i += int64_t{gridDim.x} * blockDim.x) {
    WritePacked12Pair(a.sel_local, count, i, a.out);
  }
}

// One block of kAdaptiveThreads per chunk (a sub-block per thread).
__global__ void __launch_bounds__(kAdaptiveThreads) AdaptiveKernel(IndexWriteArgs a) {
  const EncodeSummary& s = *a.summary;
  if (s.index_coding != kIndexAdaptive) return;  // the same for the whole grid
  using Block = DeviceBlock<AdaptiveShared, AdaptiveLocal, kAdaptiveThreads>;
  LBCC_DEVICE_BLOCK(Block, block);
  const int b = s.sub_block_log2, p = s.rice;
  const uint64_t* offsets = b == 7 ? a.offsets7 : a.offsets6;
  for (int64_t c = blockIdx.x; c < a.num_chunks; c += gridDim.x) {
    WriteAdaptiveChunk(block, a.sel_local + c * a.k, a.k, a.chunk_len, b, p, offsets[c],
                       reinterpret_cast<uint32_t*>(a.out));
  }
}

// ---------------------------------------------------------------------------------------------
// Bin-mean value coding: the block-model steps of binmean_kernels.h.

__global__ void __launch_bounds__(kBinMeanThreads) PartialStatsKernel(BinMeanArgs a, bool center) {
  using Block = DeviceBlock<StatsShared, StatsLocal, kBinMeanThreads>;
  LBCC_DEVICE_BLOCK(Block, block);
  PartialStatsBlock(block, a, center, static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
}

__global__ void __launch_bounds__(kBinMeanThreads) FinalizeStatsKernel(BinMeanArgs a, int parts,
                                                                       bool scale) {
  using Block = DeviceBlock<StatsShared, StatsLocal, kBinMeanThreads>;
  LBCC_DEVICE_BLOCK(Block, block);
  FinalizeStatsBlock(block, a, parts, scale);
}

__global__ void __launch_bounds__(kBinMeanThreads) CodesKernel(BinMeanArgs a) {
  using Block = DeviceBlock<CodesShared, CodesLocal, kBinMeanThreads>;
  LBCC_DEVICE_BLOCK(Block, block);
  CodesBlock(block, a, static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
}

// One block per bin.
__global__ void __launch_bounds__(kBinMeanThreads) LookupKernel(BinMeanArgs a, int parts) {
  using Block = DeviceBlock<LookupShared, LookupLocal, kBinMeanThreads>;
  LBCC_DEVICE_BLOCK(Block, block);
  LookupBlock(block, a, parts, static_cast<int>(blockIdx.x));
}

__global__ void __launch_bounds__(kBinMeanThreads) PackBinMeanKernel(BinMeanArgs a) {
  using Block = DeviceBlock<PackShared, PackLocal, kBinMeanThreads>;
  LBCC_DEVICE_BLOCK(Block, block);
  PackBlock(block, a, blockIdx.x, gridDim.x);
}

// ---------------------------------------------------------------------------------------------
// Other value codings.

__global__ void FloatValuesKernel(int coding, float* values, int64_t n, uint8_t* section) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    EncodeFloatValue(coding, i, section, values);
  }
}

// One block per run: the run's scale.
__global__ void __launch_bounds__(kThreads) AbsmaxScaleKernel(AbsmaxArgs a) {
  __shared__ uint32_t max_bits;
  const int64_t runs = (a.n + a.block - 1) / a.block;
  float* scales = reinterpret_cast<float*>(a.section);
  for (int64_t r = blockIdx.x; r < runs; r += gridDim.x) {
    if (threadIdx.x == 0) max_bits = 0;
    __syncthreads();
    const int64_t end = (r + 1) * a.block < a.n ? (r + 1) * a.block : a.n;
    uint32_t mine = 0;
    for (int64_t i = r * a.block + threadIdx.x; i < end; i += kThreads) {
      const uint32_t bits = hd::AbsBits(a.values[i]);
      mine = bits > mine ? bits : mine;
    }
    atomicMax(&max_bits, mine);
    __syncthreads();
    if (threadIdx.x == 0) scales[r] = AbsmaxScale(max_bits, a.coding);
    __syncthreads();
  }
}

__global__ void AbsmaxCodesKernel(AbsmaxArgs a) {
  const int64_t runs = (a.n + a.block - 1) / a.block;
  const int64_t bytes = a.coding == kValueAbsmax8 ? a.n : (a.n + 1) / 2;
  const float* scales = reinterpret_cast<const float*>(a.section);
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < bytes;
       j += int64_t{gridDim.x} * blockDim.x) {
    PackAbsmaxByte(a.coding, scales, a.block, a.n, j, a.section + 4 * runs, a.values);
  }
}

__global__ void SubtractKernel(SubtractArgs a) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < a.count;
       i += int64_t{gridDim.x} * blockDim.x) {
    SubtractReconstruction(a.g, a.k, a.sel_local, a.v_hat, i, a.next);
  }
}

// ---------------------------------------------------------------------------------------------
// Decode-accumulate.

__global__ void __launch_bounds__(kAggregateThreads) AggregateTopKKernel(AggregateArgs a) {
  using Block = DeviceBlock<AggregateShared, AggregateLocal, kAggregateThreads>;
  LBCC_DEVICE_BLOCK(Block, block);
  for (int64_t c = blockIdx.x; c < a.g.num_chunks; c += gridDim.x) AggregateChunk(block, a, c);
}

__global__ void AggregateDenseKernel(DenseAggregateArgs a) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < a.num_elements;
       i += int64_t{gridDim.x} * blockDim.x) {
    AggregateDenseElement(a, i);
  }
}

}  // namespace

namespace launch {

int Select(const SelectArgs& args, Stream stream) {
  if (args.g.num_chunks == 0) return 0;
  SelectKernel<<<Grid(args.g.num_chunks, 1), kSelectThreads, 0, S(stream)>>>(args);
  return LastError();
}

size_t ScanTempBytes(int64_t n) {
  size_t bytes = 0;
  cub::DeviceScan::ExclusiveScan(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                 static_cast<uint64_t*>(nullptr), ::cuda::std::plus<>{},
                                 uint64_t{0}, n > 0 ? n : 1);
  return bytes;
}

int ExclusiveScan(const uint32_t* in, uint64_t* out, int64_t n, void* temp, size_t temp_bytes,
                  Stream stream) {
  if (n == 0) return 0;
  return static_cast<int>(cub::DeviceScan::ExclusiveScan(temp, temp_bytes, in, out,
                                                         ::cuda::std::plus<>{}, uint64_t{0}, n,
                                                         S(stream)));
}

int PlanIndex(const PlanArgs& args, Stream stream) {
  PlanKernel<<<1, 1, 0, S(stream)>>>(args);
  return LastError();
}

int WriteIndices(const IndexWriteArgs& args, Stream stream) {
  const int64_t count = args.num_chunks * args.k;
  if (count == 0) return 0;
  Packed12Kernel<<<Grid((count + 1) / 2), kThreads, 0, S(stream)>>>(args);
  AdaptiveKernel<<<Grid(args.num_chunks, 1), kAdaptiveThreads, 0, S(stream)>>>(args);
  return LastError();
}

int EncodeBinMean(const BinMeanArgs& args, Stream stream) {
  const int parts = BinMeanParts(args.n);
  cudaStream_t s = S(stream);
  PartialStatsKernel<<<parts, kBinMeanThreads, 0, s>>>(args, false);
  FinalizeStatsKernel<<<1, kBinMeanThreads, 0, s>>>(args, parts, false);
  PartialStatsKernel<<<parts, kBinMeanThreads, 0, s>>>(args, true);
  FinalizeStatsKernel<<<1, kBinMeanThreads, 0, s>>>(args, parts, true);
  CodesKernel<<<parts, kBinMeanThreads, 0, s>>>(args);
  LookupKernel<<<1 << args.bits, kBinMeanThreads, 0, s>>>(args, parts);
  PackBinMeanKernel<<<Grid((args.n * args.bits + 7) / 8), kBinMeanThreads, 0, s>>>(args);
  return LastError();
}

int EncodeFloatValues(int coding, float* values, int64_t n, uint8_t* section, Stream stream) {
  if (n == 0) return 0;
  FloatValuesKernel<<<Grid(n), kThreads, 0, S(stream)>>>(coding, values, n, section);
  return LastError();
}

int EncodeAbsmax(const AbsmaxArgs& args, Stream stream) {
  if (args.n == 0) return 0;
  const int64_t runs = (args.n + args.block - 1) / args.block;
  AbsmaxScaleKernel<<<Grid(runs, 1), kThreads, 0, S(stream)>>>(args);
  const int64_t bytes = args.coding == kValueAbsmax8 ? args.n : (args.n + 1) / 2;
  AbsmaxCodesKernel<<<Grid(bytes), kThreads, 0, S(stream)>>>(args);
  return LastError();
}

int SubtractReconstruction(const SubtractArgs& args, Stream stream) {
  if (args.count == 0) return 0;
  SubtractKernel<<<Grid(args.count), kThreads, 0, S(stream)>>>(args);
  return LastError();
}

int AggregateTopK(const AggregateArgs& args, Stream stream) {
  if (args.g.num_chunks == 0) return 0;
  AggregateTopKKernel<<<Grid(args.g.num_chunks, 1), kAggregateThreads, 0, S(stream)>>>(args);
  return LastError();
}

int AggregateDense(const DenseAggregateArgs& args, Stream stream) {
  if (args.num_elements == 0) return 0;
  AggregateDenseKernel<<<Grid(args.num_elements), kThreads, 0, S(stream)>>>(args);
  return LastError();
}

}  // namespace launch
}  // namespace lbcc::kernels
