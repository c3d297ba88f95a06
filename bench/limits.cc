#include "bench/limits.h"

#include <cblas.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"

namespace lbcc::bench {

void Triad(float* __restrict a, const float* __restrict b, const float* __restrict c, float s,
           size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

namespace {

// Each thread of a multi-threaded run works on its own arrays (no false sharing, no reuse of
// another thread's cache lines), like a replica encoding its own tensor.
void BM_Triad(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  for (auto _ : state) {
    Triad(a.data(), b.data(), c.data(), 0.5f, n);
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * n);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * 3 * sizeof(float));
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<char> src(bytes, 1), dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * bytes);
}

void BM_Sgemm(benchmark::State& state) {
  const int m = static_cast<int>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const int k = static_cast<int>(state.range(2));
  std::vector<float> a(static_cast<size_t>(m) * k, 0.5f), b(static_cast<size_t>(k) * n, 0.25f),
      c(static_cast<size_t>(m) * n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(),
                n, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(
      2.0 * m * n * k * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

}  // namespace

void RegisterTriad(int64_t elements, int threads) {
  benchmark::RegisterBenchmark("BM_Triad", BM_Triad)
      ->Arg(elements)
      ->Threads(threads)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

void RegisterMemcpy(int64_t bytes, int threads) {
  benchmark::RegisterBenchmark("BM_Memcpy", BM_Memcpy)
      ->Arg(bytes)
      ->Threads(threads)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

void RegisterSgemm(int64_t m, int64_t n, int64_t k) {
  benchmark::RegisterBenchmark("BM_Sgemm", BM_Sgemm)->Args({m, n, k})->Unit(benchmark::kMillisecond);
}

void RatioReporter::ReportRuns(const std::vector<Run>& runs) {
  for (const Run& run : runs) {
    const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
    if (run.run_type == Run::RT_Iteration && run.repetitions > 1) continue;
    if (run.run_type == Run::RT_Aggregate && !median) continue;
    for (const auto& [name, counter] : run.counters) {
      values_[run.run_name.str() + "#" + name] = counter.value;
      values_[run.run_name.str() + "#seconds"] =
          run.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(run.time_unit);
      const double cpu = run.GetAdjustedCPUTime();
      if (cpu > 0) {
        values_[run.run_name.str() + "#cpu_" + name] =
            counter.value * run.GetAdjustedRealTime() / cpu;
      }
    }
  }
  ConsoleReporter::ReportRuns(runs);
}

double RatioReporter::Get(const std::string& run, const std::string& counter) const {
  auto it = values_.find(run + "#" + counter);
  return it == values_.end() ? 0.0 : it->second;
}

}  // namespace lbcc::bench
