// CUDA kernels of the TopK-EF codec: encode (select, index coding, value codings, error
// feedback) and decode-accumulate. The arithmetic and the block algorithms live in the shared
// headers (topk_select.h, topk_encode.h, binmean_stats.h, aggregate.h), which the host tests
// run through kernels/emulated_backend.cc; this file maps them onto grids and launches them.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include <cub/device/device_scan.cuh>
#include <cuda/std/functional>

#include "kernels/aggregate.h"
#include "kernels/binmean_stats.h"
#include "kernels/device_block.cuh"
#include "kernels/launch.h"
#include "kernels/topk_encode.h"
#include "kernels/topk_select.h"

namespace lbcc::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 1 << 20;  // grid-stride loops cover the rest

cudaStream_t S(Stream stream) { return static_cast<cudaStream_t>(stream); }

unsigned Grid(int64_t items, int64_t per_block = kThreads) {
  int64_t blocks = (items + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxGrid) blocks = kMaxGrid;
  return static_cast<unsigned>(blocks);
}

int LastError() { return static_cast<int>(cudaGetLastError()); }

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

__global__ void AdaptiveKernel(IndexWriteArgs a) {
  const EncodeSummary& s = *a.summary;
  if (s.index_coding != kIndexAdaptive) return;
  const uint64_t* offsets = s.sub_block_log2 == 7 ? a.offsets7 : a.offsets6;
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < a.num_chunks;
       c += int64_t{gridDim.x} * blockDim.x) {
    WriteAdaptiveChunk(a.sel_local + c * a.k, a.k, a.chunk_len, s.sub_block_log2, s.rice,
                       offsets[c], reinterpret_cast<uint32_t*>(a.out));
  }
}

// ---------------------------------------------------------------------------------------------
// Bin-mean statistics (binmean_stats.h): per-block partials, then one block decides.

// Combines the block's per-thread statistics in shared memory; thread 0 returns the total.
__device__ SumStats BlockCombine(const SumStats& mine, SumStats* shared) {
  shared[threadIdx.x] = mine;
  __syncthreads();
  SumStats total;
  if (threadIdx.x == 0) {
    total = shared[0];
    for (int t = 1; t < kThreads; ++t) total = Combine(total, shared[t]);
  }
  __syncthreads();
  return total;
}

// Partial statistics of values[0, n) (centered: of values - shift, written to `centered`).
__global__ void __launch_bounds__(kThreads) PartialStatsKernel(BinMeanArgs a, bool center) {
  __shared__ SumStats shared[kThreads];
  SumStats mine;
  const float shift = center ? a.summary->shift : 0.0f;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < a.n;
       i += int64_t{gridDim.x} * kThreads) {
    float x = a.values[i];
    if (center) {
      x = hd::Sub(x, shift);
      a.centered[i] = x;
    }
    AddTerm(mine, x);
  }
  const SumStats total = BlockCombine(mine, shared);
  if (threadIdx.x == 0) a.partials[blockIdx.x] = total;
}

// One block: the shift (step 1) or the scale (step 2) from `parts` partials.
__global__ void __launch_bounds__(kThreads) FinalizeKernel(BinMeanArgs a, int parts, bool scale,
                                                           int64_t depth) {
  __shared__ SumStats shared[kThreads];
  __shared__ double lanes[4];
  __shared__ int fallback;
  SumStats mine;
  for (int p = threadIdx.x; p < parts; p += kThreads) mine = Combine(mine, a.partials[p]);
  const SumStats total = BlockCombine(mine, shared);
  EncodeSummary& s = *a.summary;
  const bool bad = s.bad_chunk != INT_MAX;
  float norm = 0;
  if (threadIdx.x == 0) {
    if (!scale) {
      fallback = !SumsAreExact(total) && !bad;
      if (!fallback) s.shift = ShiftFromSum(total.sum, a.n);
    } else {
      fallback = !NormFromSquares(total.sq_sum, a.n, depth, &norm) && !bad;
    }
  }
  __syncthreads();
  if (fallback) {
    // The CPU's own order: four sequential lanes.
    if (threadIdx.x < 4) {
      lanes[threadIdx.x] = LaneFold(scale ? a.centered : a.values, a.n, threadIdx.x, scale);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (!scale) {
        s.shift = ShiftFromSum(CombineLanes(lanes[0], lanes[1], lanes[2], lanes[3]), a.n);
        s.fallbacks |= kFallbackShift;
      } else {
        norm = NormFromLanes(lanes[0], lanes[1], lanes[2], lanes[3]);
        s.fallbacks |= kFallbackNorm;
      }
    }
  }
  if (scale && threadIdx.x == 0) s.scale = BinMeanScale(norm, a.n, a.range_sigmas, 1 << a.bits);
}

// Codes and per-block bin statistics. 4 bins: each thread keeps its bins in registers and
// warps combine them (the bins are few and hot); 16 and 256 bins: shared-memory atomics. The
// order of the additions does not matter (binmean_stats.h).
template <int kBins>
__global__ void __launch_bounds__(kThreads) CodesKernel(BinMeanArgs a) {
  __shared__ double sum[kBins], abs_sum[kBins];
  __shared__ int32_t min_exponent[kBins];
  __shared__ uint32_t count[kBins];
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    sum[b] = 0;
    abs_sum[b] = 0;
    min_exponent[b] = kNoExponent;
    count[b] = 0;
  }
  __syncthreads();
  const float scale = a.summary->scale;
  if constexpr (kBins <= 4) {
    BinStats mine[kBins];
    for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < a.n;
         i += int64_t{gridDim.x} * kThreads) {
      const float c = a.centered[i];
      const uint8_t code = BinMeanCode(c, scale, kBins);
      a.codes[i] = code;
      LBCC_UNROLL
      for (int b = 0; b < kBins; ++b) {
        if (code == b) AddToBin(mine[b], c);
      }
    }
    LBCC_UNROLL
    for (int b = 0; b < kBins; ++b) {
      BinStats v = mine[b];
      for (int o = 16; o > 0; o >>= 1) {
        BinStats other;
        other.sum = __shfl_xor_sync(0xffffffffu, v.sum, o);
        other.abs_sum = __shfl_xor_sync(0xffffffffu, v.abs_sum, o);
        other.min_exponent = __shfl_xor_sync(0xffffffffu, v.min_exponent, o);
        other.count = __shfl_xor_sync(0xffffffffu, v.count, o);
        v = Combine(v, other);
      }
      if ((threadIdx.x & 31) == 0 && v.count > 0) {
        hd::AtomicAddF64(&sum[b], v.sum);
        hd::AtomicAddF64(&abs_sum[b], v.abs_sum);
        atomicMin(&min_exponent[b], v.min_exponent);
        atomicAdd(&count[b], v.count);
      }
    }
  } else {
    for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < a.n;
         i += int64_t{gridDim.x} * kThreads) {
      const float c = a.centered[i];
      const uint8_t code = BinMeanCode(c, scale, kBins);
      a.codes[i] = code;
      const double d = c;
      hd::AtomicAddF64(&sum[code], d);
      hd::AtomicAddF64(&abs_sum[code], d < 0 ? -d : d);
      const uint32_t bits = hd::AbsBits(c);
      if (bits != 0) atomicMin(&min_exponent[code], static_cast<int32_t>(bits >> 23) < 1 ? 1 : static_cast<int32_t>(bits >> 23));
      atomicAdd(&count[code], 1u);
    }
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    BinStats& out = a.bin_partials[blockIdx.x * 256 + b];
    out.sum = sum[b];
    out.abs_sum = abs_sum[b];
    out.min_exponent = min_exponent[b];
    out.count = count[b];
  }
}

// One block, one thread per bin: lookup table (exact sums, or the CPU's sequential fold).
__global__ void __launch_bounds__(kThreads) LookupKernel(BinMeanArgs a, int parts) {
  EncodeSummary& s = *a.summary;
  const int bins = 1 << a.bits;
  const bool bad = s.bad_chunk != INT_MAX;
  for (int b = threadIdx.x; b < bins; b += kThreads) {
    BinStats total;
    for (int p = 0; p < parts; ++p) total = Combine(total, a.bin_partials[p * 256 + b]);
    double sum = total.sum;
    if (!BinSumIsExact(total) && !bad) {
      sum = BinFold(a.centered, a.codes, a.n, b);
      atomicOr(&s.fallbacks, kFallbackBins);
    }
    s.lookup[b] = BinLookup(sum, total.count);
    s.table[b] = hd::Add(s.lookup[b], s.shift);
  }
}

__global__ void __launch_bounds__(kThreads) PackBinMeanKernel(BinMeanArgs a) {
  __shared__ float table[256];
  const int bins = 1 << a.bits;
  for (int b = threadIdx.x; b < bins; b += kThreads) table[b] = a.summary->table[b];
  __syncthreads();
  const int64_t bytes = (a.n * a.bits + 7) / 8;
  for (int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x; j < bytes;
       j += int64_t{gridDim.x} * kThreads) {
    PackBinMeanByte(a.codes, a.n, a.bits, table, j, a.section, a.values);
  }
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
  AdaptiveKernel<<<Grid(args.num_chunks, 64), 64, 0, S(stream)>>>(args);
  return LastError();
}

int EncodeBinMean(const BinMeanArgs& args, Stream stream) {
  const int64_t n = args.n;
  // Partials: up to kMaxPartials blocks, at least 2048 values each.
  int parts = static_cast<int>((n + 2047) / 2048);
  if (parts > kMaxPartials) parts = kMaxPartials;
  if (parts < 1) parts = 1;
  const int64_t per_thread = (n + int64_t{parts} * kThreads - 1) / (int64_t{parts} * kThreads);
  // Roundings a square goes through: its thread's items, the block's 256 partials, the parts.
  const int64_t depth = per_thread + kThreads + kMaxPartials + kThreads + 8;
  cudaStream_t s = S(stream);
  PartialStatsKernel<<<parts, kThreads, 0, s>>>(args, false);
  FinalizeKernel<<<1, kThreads, 0, s>>>(args, parts, false, depth);
  PartialStatsKernel<<<parts, kThreads, 0, s>>>(args, true);
  FinalizeKernel<<<1, kThreads, 0, s>>>(args, parts, true, depth);
  switch (args.bits) {
    case 2:
      CodesKernel<4><<<parts, kThreads, 0, s>>>(args);
      break;
    case 4:
      CodesKernel<16><<<parts, kThreads, 0, s>>>(args);
      break;
    default:
      CodesKernel<256><<<parts, kThreads, 0, s>>>(args);
      break;
  }
  LookupKernel<<<1, kThreads, 0, s>>>(args, parts);
  PackBinMeanKernel<<<Grid((n * args.bits + 7) / 8), kThreads, 0, s>>>(args);
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
