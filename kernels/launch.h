// The CUDA kernels' launchers (kernels/*.cu) and the argument blocks every backend takes.
//
// Plain C++ with no Abseil, so that nvcc compiles the .cu files from kernels/ headers alone.
// Each launcher queues its kernels on `stream` (a cudaStream_t; nullptr for the legacy default
// stream) and returns the cudaError_t of the launch as an int (0: success). Only the CUDA
// backend (kernels/cuda_backend.cc) calls them.
//
// Thread-safety: launches on different streams may run from different threads.
#ifndef LBCC_KERNELS_LAUNCH_H_
#define LBCC_KERNELS_LAUNCH_H_

#include <cstddef>
#include <cstdint>

#include "kernels/aggregate.h"
#include "kernels/binmean_kernels.h"
#include "kernels/binmean_stats.h"
#include "kernels/dense_encode.h"
#include "kernels/subspace_kernels.h"
#include "kernels/topk_encode.h"
#include "kernels/topk_select.h"

namespace lbcc::kernels {

using Stream = void*;

struct PlanArgs {
  IndexPlanArgs plan;
  int64_t num_chunks = 0;
  const uint32_t* bits6 = nullptr;  // per chunk
  const uint32_t* bits7 = nullptr;
  const uint64_t* offsets6 = nullptr;  // exclusive scans of bits6 / bits7
  const uint64_t* offsets7 = nullptr;
  EncodeSummary* summary = nullptr;
};

struct IndexWriteArgs {
  int64_t num_chunks = 0;
  int64_t k = 0;
  int64_t chunk_len = 0;
  const uint16_t* sel_local = nullptr;
  const uint64_t* offsets6 = nullptr;
  const uint64_t* offsets7 = nullptr;
  const EncodeSummary* summary = nullptr;  // the plan
  uint8_t* out = nullptr;  // 4-byte aligned, zeroed, room for either coding
};


struct AbsmaxArgs {
  int coding = kValueAbsmax8;
  int64_t n = 0;
  int64_t block = 0;
  float* values = nullptr;    // in: selected values; out: reconstructions
  uint8_t* section = nullptr; // 4 * runs bytes of scales (4-byte aligned), then the codes
};

struct SubtractArgs {
  Geometry g;
  int64_t k = 0;
  int64_t count = 0;
  const uint16_t* sel_local = nullptr;
  const float* v_hat = nullptr;
  float* next = nullptr;
};

namespace launch {

int Select(const SelectArgs& args, Stream stream);
size_t ScanTempBytes(int64_t n);
int ExclusiveScan(const uint32_t* in, uint64_t* out, int64_t n, void* temp, size_t temp_bytes,
                  Stream stream);
int PlanIndex(const PlanArgs& args, Stream stream);
int WriteIndices(const IndexWriteArgs& args, Stream stream);
int EncodeBinMean(const BinMeanArgs& args, Stream stream);
int EncodeFloatValues(int coding, float* values, int64_t n, uint8_t* section, Stream stream);
int EncodeAbsmax(const AbsmaxArgs& args, Stream stream);
int SubtractReconstruction(const SubtractArgs& args, Stream stream);
int AggregateTopK(const AggregateArgs& args, Stream stream);
int AggregateDense(const DenseAggregateArgs& args, Stream stream);
int DenseEncode(const DenseEncodeArgs& args, Stream stream);
int SubspaceForwardPrep(const SubspaceForwardArgs& args, Stream stream);
int SubspaceQuantize(const SubspaceQuantizeArgs& args, Stream stream);
int SubspaceDequantize(const SubspaceDequantizeArgs& args, Stream stream);
int SubspaceGatherTable(const SubspaceGatherArgs& args, Stream stream);

}  // namespace launch
}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_LAUNCH_H_
