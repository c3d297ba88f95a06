// The emulated backend (backend.h): the kernels' code run on the host, one simulated thread at
// a time. Device memory is host memory; streams are ignored (everything completes in order, at
// once). Kernels that run as one thread block per item go through HostBlock, with the
// launchers' grids (topk_kernels.cu), block after block.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/backend.h"
#include "kernels/block.h"

namespace lbcc::kernels {
namespace {

class Emulated final : public Backend {
 public:
  absl::string_view name() const override { return "emulated"; }
  bool is_device() const override { return false; }

  absl::Status SetDevice(int) override { return absl::OkStatus(); }
  absl::StatusOr<void*> Malloc(size_t bytes) override {
    void* p = std::aligned_alloc(256, RoundUp(bytes));
    if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("malloc ", bytes));
    return p;
  }
  void Free(void* p) override { std::free(p); }
  absl::StatusOr<void*> MallocHost(size_t bytes) override { return Malloc(bytes); }
  void FreeHost(void* p) override { std::free(p); }
  absl::Status Memset(void* p, int value, size_t bytes, Stream) override {
    if (bytes > 0) std::memset(p, value, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes, Stream) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes, Stream) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes, Stream) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize(Stream) override { return absl::OkStatus(); }
  absl::StatusOr<void*> CreateEvent() override { return new absl::Time(); }
  void DestroyEvent(void* event) override { delete static_cast<absl::Time*>(event); }
  absl::Status RecordEvent(void* event, Stream) override {
    *static_cast<absl::Time*>(event) = absl::Now();
    return absl::OkStatus();
  }
  absl::StatusOr<double> ElapsedSeconds(void* start, void* stop) override {
    return absl::ToDoubleSeconds(*static_cast<absl::Time*>(stop) - *static_cast<absl::Time*>(start));
  }

  absl::Status Select(const SelectArgs& args, Stream) override {
    HostBlock<SelectShared, SelectLocal> block(kSelectThreads);
    for (int64_t c = 0; c < args.g.num_chunks; ++c) SelectChunk(block, args, c);
    return absl::OkStatus();
  }

  size_t ScanTempBytes(int64_t) override { return 0; }
  absl::Status ExclusiveScan(const uint32_t* in, uint64_t* out, int64_t n, void*, size_t,
                             Stream) override {
    uint64_t running = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t v = in[i];
      out[i] = running;
      running += v;
    }
    return absl::OkStatus();
  }

  absl::Status PlanIndex(const PlanArgs& a, Stream) override {
    uint64_t total6 = 0, total7 = 0;
    if (a.num_chunks > 0 && a.offsets6 != nullptr) {
      total6 = a.offsets6[a.num_chunks - 1] + a.bits6[a.num_chunks - 1];
      total7 = a.offsets7[a.num_chunks - 1] + a.bits7[a.num_chunks - 1];
    }
    PlanIndexCoding(a.plan, total6, total7, a.summary);
    return absl::OkStatus();
  }

  absl::Status WriteIndices(const IndexWriteArgs& a, Stream) override {
    const EncodeSummary& s = *a.summary;
    const int64_t count = a.num_chunks * a.k;
    if (s.index_coding == kIndexPacked12) {
      for (int64_t i = 0; i < (count + 1) / 2; ++i) WritePacked12Pair(a.sel_local, count, i, a.out);
      return absl::OkStatus();
    }
    const uint64_t* offsets = s.sub_block_log2 == 7 ? a.offsets7 : a.offsets6;
    HostBlock<AdaptiveShared, AdaptiveLocal> block(kAdaptiveThreads);
    for (int64_t c = 0; c < a.num_chunks; ++c) {
      WriteAdaptiveChunk(block, a.sel_local + c * a.k, a.k, a.chunk_len, s.sub_block_log2, s.rice,
                         offsets[c], reinterpret_cast<uint32_t*>(a.out));
    }
    return absl::OkStatus();
  }

  // The launchers' grid (topk_kernels.cu), block after block.
  absl::Status EncodeBinMean(const BinMeanArgs& a, Stream) override {
    const int parts = BinMeanParts(a.n);
    HostBlock<StatsShared, StatsLocal> stats(kBinMeanThreads);
    for (int p = 0; p < parts; ++p) PartialStatsBlock(stats, a, false, p, parts);
    FinalizeStatsBlock(stats, a, parts, false);
    for (int p = 0; p < parts; ++p) PartialStatsBlock(stats, a, true, p, parts);
    FinalizeStatsBlock(stats, a, parts, true);
    HostBlock<CodesShared, CodesLocal> codes(kBinMeanThreads);
    for (int p = 0; p < parts; ++p) CodesBlock(codes, a, p, parts);
    HostBlock<LookupShared, LookupLocal> lookup(kBinMeanThreads);
    for (int bin = 0; bin < 1 << a.bits; ++bin) LookupBlock(lookup, a, parts, bin);
    HostBlock<PackShared, PackLocal> pack(kBinMeanThreads);
    const int64_t bytes = (a.n * a.bits + 7) / 8;
    const int64_t blocks = std::max<int64_t>(1, (bytes + kBinMeanThreads - 1) / kBinMeanThreads);
    for (int64_t p = 0; p < blocks; ++p) PackBlock(pack, a, p, blocks);
    return absl::OkStatus();
  }

  absl::Status EncodeFloatValues(int coding, float* values, int64_t n, uint8_t* section,
                                 Stream) override {
    for (int64_t i = 0; i < n; ++i) EncodeFloatValue(coding, i, section, values);
    return absl::OkStatus();
  }

  absl::Status EncodeAbsmax(const AbsmaxArgs& a, Stream) override {
    const int64_t runs = (a.n + a.block - 1) / a.block;
    float* scales = reinterpret_cast<float*>(a.section);
    for (int64_t r = 0; r < runs; ++r) {
      uint32_t max_bits = 0;
      const int64_t end = std::min(a.n, (r + 1) * a.block);
      for (int64_t i = r * a.block; i < end; ++i) max_bits = std::max(max_bits, hd::AbsBits(a.values[i]));
      scales[r] = AbsmaxScale(max_bits, a.coding);
    }
    const int64_t bytes = a.coding == kValueAbsmax8 ? a.n : (a.n + 1) / 2;
    for (int64_t j = 0; j < bytes; ++j) {
      PackAbsmaxByte(a.coding, scales, a.block, a.n, j, a.section + 4 * runs, a.values);
    }
    return absl::OkStatus();
  }

  absl::Status SubtractReconstruction(const SubtractArgs& a, Stream) override {
    for (int64_t i = 0; i < a.count; ++i) {
      kernels::SubtractReconstruction(a.g, a.k, a.sel_local, a.v_hat, i, a.next);
    }
    return absl::OkStatus();
  }

  absl::Status AggregateTopK(const AggregateArgs& args, Stream) override {
    HostBlock<AggregateShared, AggregateLocal> block(kAggregateThreads);
    for (int64_t c = 0; c < args.g.num_chunks; ++c) AggregateChunk(block, args, c);
    return absl::OkStatus();
  }

  absl::Status AggregateDense(const DenseAggregateArgs& args, Stream) override {
    for (int64_t i = 0; i < args.num_elements; ++i) AggregateDenseElement(args, i);
    return absl::OkStatus();
  }

  absl::Status DenseEncode(const DenseEncodeArgs& args, Stream) override {
    if (args.format == kDenseInt8 || args.format == kDenseInt4) {
      HostBlock<DenseBlockShared, DenseBlockLocal> block(kDenseThreads);
      const int64_t blocks = (args.n + args.block - 1) / args.block;
      for (int64_t b = 0; b < blocks; ++b) DenseEncodeIntBlock(block, args, b);
    } else {
      for (int64_t i = 0; i < args.n; ++i) DenseEncodeHalfElement(args, i);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<void*> CreateBlas() override { return static_cast<void*>(this); }
  void DestroyBlas(void*) override {}

  // Column-major, like cuBLAS; fp32 accumulation in the natural order.
  absl::Status Gemm(void*, Stream, bool ta, bool tb, int m, int n, int k, float alpha,
                    const float* a, int lda, const float* b, int ldb, float beta, float* c,
                    int ldc) override {
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        float acc = 0;
        for (int p = 0; p < k; ++p) {
          const float av = ta ? a[p + static_cast<int64_t>(i) * lda] : a[i + static_cast<int64_t>(p) * lda];
          const float bv = tb ? b[j + static_cast<int64_t>(p) * ldb] : b[p + static_cast<int64_t>(j) * ldb];
          acc += av * bv;
        }
        float& out = c[i + static_cast<int64_t>(j) * ldc];
        out = beta == 0.0f ? alpha * acc : alpha * acc + beta * out;
      }
    }
    return absl::OkStatus();
  }

  absl::Status SubspaceForwardPrep(const SubspaceForwardArgs& a, Stream) override {
    const int64_t ld = a.components * a.k;
    if (a.ids != nullptr) {
      for (int64_t e = 0; e < a.tokens * ld; ++e) SubtractProjectedTable(a, e);
    }
    if (a.components > 1) {
      const int64_t blocks = (a.tokens + a.mixture_block - 1) / a.mixture_block;
      for (int64_t blk = 0; blk < blocks; ++blk) a.selectors[blk] = ChooseComponent(a, blk);
      for (int64_t e = 0; e < a.tokens * a.k; ++e) GatherComponent(a, e);
    }
    return absl::OkStatus();
  }

  absl::Status SubspaceQuantize(const SubspaceQuantizeArgs& a, Stream) override {
    if (a.dtype == kCoefI8) {
      const int64_t runs = a.tokens * ((a.k + a.int8_block - 1) / a.int8_block);
      for (int64_t r = 0; r < runs; ++r) QuantizeInt8Run(a, r);
    } else {
      for (int64_t e = 0; e < a.tokens * a.k; ++e) QuantizeCoefficient(a, e);
    }
    return absl::OkStatus();
  }

  absl::Status SubspaceDequantize(const SubspaceDequantizeArgs& a, Stream) override {
    for (int64_t e = 0; e < a.tokens * a.k; ++e) DequantizeCoefficient(a, e);
    return absl::OkStatus();
  }

  absl::Status SubspaceGatherTable(const SubspaceGatherArgs& a, Stream) override {
    for (int64_t e = 0; e < a.tokens * a.d; ++e) GatherTableElement(a, e);
    return absl::OkStatus();
  }

 private:
  static size_t RoundUp(size_t bytes) { return std::max<size_t>(256, (bytes + 255) / 256 * 256); }
};

}  // namespace

Backend& EmulatedBackend() {
  static Emulated* backend = new Emulated();
  return *backend;
}

}  // namespace lbcc::kernels
