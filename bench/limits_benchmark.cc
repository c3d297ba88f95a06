// The machine's limits on their own: triad, memcpy and sgemm at a few sizes. Every other
// benchmark binary registers the ones it compares against next to its own cases.
//
//   bazel run //bench:limits_benchmark -- --benchmark_min_time=0.2
#include "bench/limits.h"
#include "benchmark/benchmark.h"

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  for (int64_t n : {int64_t{1} << 16, int64_t{1} << 24}) lbcc::bench::RegisterTriad(n);
  lbcc::bench::RegisterTriad(int64_t{1} << 24, 2);
  for (int64_t bytes : {int64_t{1} << 18, int64_t{1} << 26}) lbcc::bench::RegisterMemcpy(bytes);
  lbcc::bench::RegisterSgemm(1024, 1024, 1024);
  lbcc::bench::RegisterSgemm(4096, 160, 1024);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
