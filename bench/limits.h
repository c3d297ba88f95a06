// Hardware limits that LBCC's benchmarks report their ratios against, measured in the same
// binary: a streaming triad a[i] = b[i] + s * c[i], memcpy, and cblas_sgemm.
//
// Each Register*() call adds Google Benchmark cases to the binary that calls it, so a codec
// benchmark reports e.g. "encode elements/s" next to "triad elements/s" from the same run.
//
// Thread-safety: call the Register functions from main() before benchmark::RunSpecifiedBenchmarks.
#ifndef LBCC_BENCH_LIMITS_H_
#define LBCC_BENCH_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"

namespace lbcc::bench {

// a[i] = b[i] + s * c[i] over n floats; one pass, the loop the compiler vectorises.
void Triad(float* a, const float* b, const float* c, float s, size_t n);

// BM_Triad/<n>: items_per_second = elements of the triad per second, bytes_per_second counts
// the 12 bytes each element moves. Threads as given (1 = one core).
void RegisterTriad(int64_t elements, int threads = 1);
// BM_Memcpy/<bytes>: bytes_per_second.
void RegisterMemcpy(int64_t bytes, int threads = 1);
// BM_Sgemm/<m>/<n>/<k>: FLOP/s of cblas_sgemm (row-major, no transposes).
void RegisterSgemm(int64_t m, int64_t n, int64_t k);

// A console reporter that keeps every run's counters so that main() can print ratios at the
// end: with --benchmark_repetitions the median of each case, otherwise its one run. Get(run,
// counter) also answers "seconds" (real time per iteration) and "cpu_<counter>" (the rate over
// CPU time instead of wall time: on a shared machine a one-thread case that was descheduled
// keeps a meaningful CPU-time rate); 0 for what was not reported.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override;
  double Get(const std::string& run, const std::string& counter) const;

 private:
  std::map<std::string, double> values_;
};

}  // namespace lbcc::bench

#endif  // LBCC_BENCH_LIMITS_H_
