// TopK-EF and dense-quantizer throughput next to the machine's limits, measured in one run.
//
//   bazel run //codecs:topk_ef_benchmark -- --benchmark_min_time=1
//
// Cases (fp32 data from fixed seeds, i.i.d. normal, so selected positions are uniformly random):
//   BM_TopKEfEncode/4096/4096 threads 1 and 2: EF update + chunked top-k + 2-bit values +
//     12-bit indices + Commit, SparseLoCo defaults (top_k 64); each thread encodes its own
//     tensor (one replica per thread). items_per_second = elements.
//   BM_Triad/16777216 threads 1 and 2: the streaming limit over the same element count.
//   BM_TopKEfDecode8/<rows>/<cols>/<index coding>: DecodeAccumulate of 8 replicas' payloads,
//     SparseLoCo mean, added into the output. items_per_second = selected values decoded.
//   BM_TopKEfDecodeAssign4/<rows>/<cols>/<index coding>: 4 payloads written as the output (not
//     added): what SparseAllReduce does per rank on a 4-rank testbed with a 4M tensor
//     (2048 x 2048) or with each of its 16 parts (64 x 4096).
//   BM_OutputRmw/<rows>/<cols>: the decode's memory limit, out[i] += s over an fp32 output of
//     that shape (the replicas touch ~87 % of its cache lines); the binary prints each decode's
//     time as a multiple of this pass.
//   BM_TopKEfBits/<index coding>: 4096 x 4096, top_k 64, 2-bit values: counters
//     bits_per_param (whole payload) and header_bits_per_param.
//   BM_DenseInt8RoundTrip/<n>: int8 absmax (block 256) quantize + dequantize of n floats;
//     bytes_per_second counts the 4n input bytes, to compare with BM_Memcpy/<4n>.
// The binary ends with the ratios (from this run) that codecs/README.md reports.
#include <immintrin.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/aligned.h"
#include "base/check.h"
#include "base/cpu.h"
#include "bench/limits.h"
#include "benchmark/benchmark.h"
#include "codecs/codec.h"
#include "codecs/dense_quant.h"
#include "codecs/topk_ef.h"

namespace lbcc::codecs {
namespace {

constexpr int64_t kRows = 4096, kCols = 4096;

std::vector<float> Normals(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

std::unique_ptr<TopKEfCodec> MakeTopK(IndexCoding indices) {
  TopKEfOptions options;  // SparseLoCo defaults: top_k 64, beta 0.95, lr 1, 2-bit bin-mean
  options.indices = indices;
  absl::StatusOr<std::unique_ptr<TopKEfCodec>> codec = TopKEfCodec::Create(options);
  LBCC_CHECK(codec.ok()) << codec.status();
  return *std::move(codec);
}

void BM_TopKEfEncode(benchmark::State& state) {
  const Shape shape = {state.range(0), state.range(1)};
  const int64_t n = shape[0] * shape[1];
  auto codec = MakeTopK(IndexCoding::kPacked12);
  std::vector<float> delta = Normals(n, 1234 + state.thread_index());
  TopKEfState ef;
  std::vector<uint8_t> out(*codec->MaxEncodedBytes(shape));
  const TensorView view = *TensorView::Host(delta.data(), shape);
  size_t bytes = 0;
  for (auto _ : state) {
    absl::StatusOr<size_t> size = codec->Encode(view, &ef, absl::MakeSpan(out));
    LBCC_CHECK(size.ok()) << size.status();
    LBCC_CHECK(ef.Commit().ok());
    bytes = *size;
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * n);
  state.counters["bits_per_param"] =
      benchmark::Counter(8.0 * static_cast<double>(bytes) / n, benchmark::Counter::kAvgThreads);
}

// DecodeAccumulate of `replicas` payloads of the shape (rows, cols), SparseLoCo mean; items:
// selected values.
void RunDecode(benchmark::State& state, int replicas, bool accumulate) {
  const Shape shape = {state.range(0), state.range(1)};
  const int64_t n = shape[0] * shape[1];
  auto codec = MakeTopK(static_cast<IndexCoding>(state.range(2)));
  std::vector<std::vector<uint8_t>> payloads;
  for (int r = 0; r < replicas; ++r) {
    std::vector<float> delta = Normals(n, 50 + r);
    TopKEfState ef;
    std::vector<uint8_t> out(*codec->MaxEncodedBytes(shape));
    const size_t size =
        *codec->Encode(*TensorView::Host(delta.data(), shape), &ef, absl::MakeSpan(out));
    out.resize(size);
    payloads.push_back(std::move(out));
  }
  const std::vector<absl::Span<const uint8_t>> spans(payloads.begin(), payloads.end());
  const int64_t selected = replicas * (*InspectPayload(payloads[0])).selected;
  AlignedVector<float> out(static_cast<size_t>(n), 0.0f);  // as a framework's tensor
  const TensorView view = *TensorView::Host(out.data(), shape);
  DecodeScratch scratch;
  for (auto _ : state) {
    absl::Status status = DecodeAccumulate(spans, {Aggregation::kSparseLoCoMean, accumulate},
                                           view, &scratch);
    LBCC_CHECK(status.ok()) << status;
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * selected);
}

// The case: 8 replicas accumulated into the output.
void BM_TopKEfDecode8(benchmark::State& state) { RunDecode(state, 8, /*accumulate=*/true); }

// SparseAllReduce's case on a 4-rank testbed: 4 payloads (one per rank) written as the output.
void BM_TopKEfDecodeAssign4(benchmark::State& state) {
  RunDecode(state, 4, /*accumulate=*/false);
}

// The memory work decode-accumulate cannot avoid once its replicas touch nearly every cache
// line of the output (8 x 1.56 % of the positions is ~12 %, ~87 % of the 64-byte lines): one
// read-modify-write pass out[i] += s over an fp32 output of the same shape.
// With AVX2 like the decoder (32-byte loads and stores); the caller checks the CPU.
__attribute__((target("avx2"))) void AddScalarAvx2(float* o, int64_t n, float s) {
  const __m256 v = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_loadu_ps(o + i), v));
    _mm256_storeu_ps(o + i + 8, _mm256_add_ps(_mm256_loadu_ps(o + i + 8), v));
  }
  for (; i < n; ++i) o[i] += s;
}

void BM_OutputRmw(benchmark::State& state) {
  const int64_t n = state.range(0) * state.range(1);
  std::vector<float> out = Normals(n, 11);
  float* o = out.data();
  const float s = 1e-30f;
  const bool avx2 = lbcc::CpuHasAvx2Fma();
  for (auto _ : state) {
    if (avx2) {
      AddScalarAvx2(o, n, s);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] += s;
    }
    benchmark::DoNotOptimize(o);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * n);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * 8);
}

void BM_TopKEfBits(benchmark::State& state) {
  const Shape shape = {kRows, kCols};
  const int64_t n = kRows * kCols;
  auto codec = MakeTopK(static_cast<IndexCoding>(state.range(0)));
  std::vector<float> delta = Normals(n, 7);
  std::vector<uint8_t> out(*codec->MaxEncodedBytes(shape));
  size_t bytes = 0;
  for (auto _ : state) {
    TopKEfState ef;
    bytes = *codec->Encode(*TensorView::Host(delta.data(), shape), &ef, absl::MakeSpan(out));
  }
  state.counters["bits_per_param"] = 8.0 * static_cast<double>(bytes) / n;
  state.counters["header_bits_per_param"] =
      8.0 * static_cast<double>(PayloadBytes(2, 16 + 20, 0)) / n;
}

void BM_DenseInt8RoundTrip(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto codec = *DenseQuantCodec::Create({DenseFormat::kInt8, 256, false, 0});
  std::vector<float> x = Normals(n, 3), y(static_cast<size_t>(n));
  const Shape shape = {n};
  std::vector<uint8_t> payload(*codec->MaxEncodedBytes(shape));
  const TensorView in = *TensorView::Host(x.data(), shape);
  const TensorView out = *TensorView::Host(y.data(), shape);
  DecodeScratch scratch;
  for (auto _ : state) {
    const size_t size = *codec->Encode(in, nullptr, absl::MakeSpan(payload));
    const absl::Span<const uint8_t> span(payload.data(), size);
    LBCC_CHECK(DecodeAccumulate(absl::MakeConstSpan(&span, 1), {}, out, &scratch).ok());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * 4);
}

}  // namespace
}  // namespace lbcc::codecs

int main(int argc, char** argv) {
  using namespace lbcc::codecs;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::printf("SIMD level: %s\n",
              std::string(lbcc::SimdLevelName(lbcc::ActiveSimdLevel())).c_str());
  const int64_t elements = kRows * kCols;
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark("BM_TopKEfEncode", BM_TopKEfEncode)
        ->Args({kRows, kCols})
        ->Threads(threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    lbcc::bench::RegisterTriad(elements, threads);
  }
  for (int64_t rows : {int64_t{512}, int64_t{1024}, int64_t{2048}, kRows}) {
    for (IndexCoding coding : {IndexCoding::kPacked12, IndexCoding::kAdaptive}) {
      benchmark::RegisterBenchmark("BM_TopKEfDecode8", BM_TopKEfDecode8)
          ->Args({rows, rows, static_cast<int64_t>(coding)})
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
    benchmark::RegisterBenchmark("BM_OutputRmw", BM_OutputRmw)
        ->Args({rows, rows})
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (IndexCoding coding : {IndexCoding::kPacked12, IndexCoding::kAdaptive}) {
    benchmark::RegisterBenchmark("BM_TopKEfDecodeAssign4", BM_TopKEfDecodeAssign4)
        ->Args({64, 4096, static_cast<int64_t>(coding)})
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_TopKEfDecodeAssign4", BM_TopKEfDecodeAssign4)
        ->Args({2048, 2048, static_cast<int64_t>(coding)})
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (IndexCoding coding : {IndexCoding::kPacked12, IndexCoding::kAdaptive}) {
    benchmark::RegisterBenchmark("BM_TopKEfBits", BM_TopKEfBits)
        ->Arg(static_cast<int64_t>(coding))
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("BM_DenseInt8RoundTrip", BM_DenseInt8RoundTrip)
      ->Arg(elements)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  lbcc::bench::RegisterMemcpy(elements * 4);

  lbcc::bench::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  auto get = [&](const std::string& run, const std::string& counter) {
    return reporter.Get(run, counter);
  };
  const double encode1 = get("BM_TopKEfEncode/4096/4096/real_time/threads:1", "items_per_second");
  const double encode2 = get("BM_TopKEfEncode/4096/4096/real_time/threads:2", "items_per_second");
  const double triad1 = get("BM_Triad/16777216/real_time/threads:1", "items_per_second");
  const double triad2 = get("BM_Triad/16777216/real_time/threads:2", "items_per_second");
  const double memcpy = get("BM_Memcpy/67108864/real_time/threads:1", "bytes_per_second");
  const double dense = get("BM_DenseInt8RoundTrip/16777216/real_time", "bytes_per_second");
  std::printf("\nratios from this run (targets in parentheses):\n");
  if (encode1 > 0 && triad1 > 0) {
    std::printf(
        "  encode 4096x4096, 1 thread:  %.3f G elem/s = %.2f x triad (%.3f G/s)   (>= 0.5)\n",
        encode1 / 1e9, encode1 / triad1, triad1 / 1e9);
  }
  if (encode2 > 0 && encode1 > 0) {
    std::printf(
        "  encode, 2 threads:           %.3f G elem/s = %.2f x 1 thread; triad 2 threads "
        "%.3f G/s   (>= 1.7)\n",
        encode2 / 1e9, encode2 / encode1, triad2 / 1e9);
  }
  for (const char* size : {"512/512", "1024/1024", "2048/2048", "4096/4096"}) {
    const double rmw = get(std::string("BM_OutputRmw/") + size + "/real_time", "seconds");
    for (int coding : {1, 2}) {
      const std::string name =
          std::string("BM_TopKEfDecode8/") + size + "/" + std::to_string(coding) + "/real_time";
      const double rate = get(name, "items_per_second");
      const double seconds = get(name, "seconds");
      if (rate > 0) {
        std::printf("  decode-accumulate 8 payloads %s %s: %.3f G selected values/s   (>= 1)",
                    size, coding == 1 ? "packed12" : "adaptive", rate / 1e9);
        if (rmw > 0 && seconds > 0) {
          std::printf("; %.3f ms = %.2f x the output read-modify-write pass (%.3f ms)",
                      seconds * 1e3, seconds / rmw, rmw * 1e3);
        }
        std::printf("\n");
      }
    }
  }
  const double bits12 = get("BM_TopKEfBits/1/iterations:1", "bits_per_param");
  const double bits_adaptive = get("BM_TopKEfBits/2/iterations:1", "bits_per_param");
  const double header = get("BM_TopKEfBits/1/iterations:1", "header_bits_per_param");
  if (bits12 > 0) {
    std::printf(
        "  bits/param, 2-bit values, 12-bit indices: %.5f (header %.6f)   (<= 0.22 + "
        "header)\n",
        bits12, header);
  }
  if (bits_adaptive > 0) {
    std::printf("  bits/param, 2-bit values, adaptive indices: %.5f   (<= 0.17)\n", bits_adaptive);
  }
  const double encode1_cpu =
      get("BM_TopKEfEncode/4096/4096/real_time/threads:1", "cpu_items_per_second");
  const double triad1_cpu = get("BM_Triad/16777216/real_time/threads:1", "cpu_items_per_second");
  const double memcpy_cpu = get("BM_Memcpy/67108864/real_time/threads:1", "cpu_bytes_per_second");
  const double dense_cpu = get("BM_DenseInt8RoundTrip/16777216/real_time", "cpu_bytes_per_second");
  if (encode1_cpu > 0 && triad1_cpu > 0 && memcpy_cpu > 0 && dense_cpu > 0) {
    std::printf("  over CPU time (1-thread cases): encode %.3f G elem/s = %.2f x triad (%.3f G/s); "
                "int8 %.2f GB/s = %.2f x memcpy (%.2f GB/s)\n",
                encode1_cpu / 1e9, encode1_cpu / triad1_cpu, triad1_cpu / 1e9, dense_cpu / 1e9,
                dense_cpu / memcpy_cpu, memcpy_cpu / 1e9);
  }
  if (dense > 0 && memcpy > 0) {
    std::printf(
        "  int8 quantize + dequantize: %.2f GB/s of input = %.2f x memcpy (%.2f GB/s)   "
        "(>= 0.5)\n",
        dense / 1e9, dense / memcpy, memcpy / 1e9);
  }
  return 0;
}
