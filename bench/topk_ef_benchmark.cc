// TopK-EF and dense-quantizer throughput next to the machine's limits, measured in one run.
//
//   bazel run //bench:topk_ef_benchmark -- --benchmark_min_time=1
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
//   BM_TopKEfDecodePrepare8/<rows>/<cols>/1: PrepareDecode alone of BM_TopKEfDecode8's packed12
//     payloads (envelopes, checksums, index decode and checks, value tables).
//   BM_DecodeScatterFloor/<rows>/<cols>/<count>: the bare aggregation of the same number of
//     selected values (uniformly random positions): a sum and (count 1) a count per position in
//     an accumulator that stays in L1, from unpacked indices and 2-bit codes. The binary prints
//     the decode floor, checks + this + the output pass: what a decoder that did nothing else
//     would take.
//   BM_TopKEfBits/<index coding>: 4096 x 4096, top_k 64, 2-bit values: counters
//     bits_per_param (whole payload) and header_bits_per_param.
//   BM_DenseInt8RoundTrip/<n>: int8 absmax (block 256) quantize + dequantize of n floats;
//     bytes_per_second counts the 4n input bytes, to compare with BM_Memcpy/<4n>.
// The binary ends with the ratios (from this run) that bench/codecs_results.sh records.
#include <immintrin.h>

#include <algorithm>
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

// `replicas` payloads of the shape (rows, cols) with the index coding state.range(2).
std::vector<std::vector<uint8_t>> DecodePayloads(benchmark::State& state, int replicas) {
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
  return payloads;
}

// DecodeAccumulate of `replicas` payloads, SparseLoCo mean; items: selected values. With
// prepare_only, PrepareDecode alone: the payloads' checks (envelope, checksum, index decode and
// order, value tables), none of the aggregation.
void RunDecode(benchmark::State& state, int replicas, bool accumulate, bool prepare_only = false) {
  const Shape shape = {state.range(0), state.range(1)};
  const std::vector<std::vector<uint8_t>> payloads = DecodePayloads(state, replicas);
  const std::vector<absl::Span<const uint8_t>> spans(payloads.begin(), payloads.end());
  const int64_t selected = replicas * (*InspectPayload(payloads[0])).selected;
  AlignedVector<float> out(static_cast<size_t>(shape[0] * shape[1]), 0.0f);  // a framework's tensor
  const TensorView view = *TensorView::Host(out.data(), shape);
  const DecodeOptions options = {Aggregation::kSparseLoCoMean, accumulate};
  DecodeScratch scratch;
  for (auto _ : state) {
    absl::Status status = prepare_only ? PrepareDecode(spans, options, view, &scratch)
                                       : DecodeAccumulate(spans, options, view, &scratch);
    LBCC_CHECK(status.ok()) << status;
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * selected);
}

// The part of BM_TopKEfDecode8 that checks the payloads before anything is aggregated.
void BM_TopKEfDecodePrepare8(benchmark::State& state) {
  RunDecode(state, 8, /*accumulate=*/true, /*prepare_only=*/true);
}

// A floor for any decoder that aggregates by position: 8 replicas' selected values of a
// (rows, cols) tensor at top_k 64, each added into a per-position sum and, with kCount, count
// (what the SparseLoCo mean needs; the plain sum needs none) in one 4096-position accumulator
// per chunk that stays in L1; indices and 2-bit codes already unpacked, nothing checked,
// divided, reset or written to an output. Positions uniformly random and distinct within a
// chunk, like the normal data's selections. items: selected values.
template <bool kCount>
void ScatterFloor(const uint16_t* idx, const uint8_t* codes, int64_t values, const float* table,
                  float* sum, uint16_t* count) {
  auto add = [&](uint32_t l, float v) {
    sum[l] += v;
    if (kCount) count[l] = static_cast<uint16_t>(count[l] + 1);
  };
  for (int64_t v = 0; v < values; v += 4, idx += 4) {
    const uint32_t b = *codes++;
    add(idx[0], table[b & 3]);
    add(idx[1], table[(b >> 2) & 3]);
    add(idx[2], table[(b >> 4) & 3]);
    add(idx[3], table[b >> 6]);
  }
}

void BM_DecodeScatterFloor(benchmark::State& state) {
  constexpr int kReplicas = 8, kChunk = 4096, kPerChunk = 64;
  const int64_t chunks = state.range(0) * state.range(1) / kChunk;
  const int64_t values = chunks * kReplicas * kPerChunk;
  std::mt19937 rng(17);
  std::vector<uint16_t> positions(kChunk);
  for (int i = 0; i < kChunk; ++i) positions[i] = static_cast<uint16_t>(i);
  // Chunk-major, then replica: the order in which a decoder visits them.
  std::vector<uint16_t> indices;
  std::vector<uint8_t> codes;
  for (int64_t c = 0; c < chunks * kReplicas; ++c) {
    std::shuffle(positions.begin(), positions.end(), rng);
    std::sort(positions.begin(), positions.begin() + kPerChunk);
    indices.insert(indices.end(), positions.begin(), positions.begin() + kPerChunk);
    for (int j = 0; j < kPerChunk / 4; ++j) codes.push_back(static_cast<uint8_t>(rng()));
  }
  const float table[4] = {-0.02f, -0.005f, 0.005f, 0.02f};
  std::vector<float> sum(kChunk, -0.0f);
  std::vector<uint16_t> count(kChunk, 0);
  for (auto _ : state) {
    if (state.range(2) != 0) {
      ScatterFloor<true>(indices.data(), codes.data(), values, table, sum.data(), count.data());
    } else {
      ScatterFloor<false>(indices.data(), codes.data(), values, table, sum.data(), count.data());
    }
    benchmark::DoNotOptimize(sum.data());
    benchmark::DoNotOptimize(count.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * values);
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
    benchmark::RegisterBenchmark("BM_TopKEfDecodePrepare8", BM_TopKEfDecodePrepare8)
        ->Args({rows, rows, static_cast<int64_t>(IndexCoding::kPacked12)})
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    for (int64_t with_count : {1, 0}) {
      benchmark::RegisterBenchmark("BM_DecodeScatterFloor", BM_DecodeScatterFloor)
          ->Args({rows, rows, with_count})
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
    const double prepare =
        get(std::string("BM_TopKEfDecodePrepare8/") + size + "/1/real_time", "seconds");
    const std::string floor_name = std::string("BM_DecodeScatterFloor/") + size;
    const double scatter = get(floor_name + "/1/real_time", "seconds");
    const double scatter_sum = get(floor_name + "/0/real_time", "seconds");
    const double values = get(floor_name + "/1/real_time", "items_per_second") * scatter;
    if (rmw > 0 && prepare > 0 && scatter > 0 && scatter_sum > 0 && values > 0) {
      // What a decoder that did nothing else would take, its parts one after the other.
      const double floor = prepare + scatter + rmw, floor_sum = prepare + scatter_sum + rmw;
      std::printf(
          "  decode floor %s: checks %.3f + per-position sum and count %.3f + output pass "
          "%.3f = %.3f ms = %.3f G selected values/s (sum alone, no count: %.3f G/s)\n",
          size, prepare * 1e3, scatter * 1e3, rmw * 1e3, floor * 1e3, values / floor / 1e9,
          values / floor_sum / 1e9);
    }
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
