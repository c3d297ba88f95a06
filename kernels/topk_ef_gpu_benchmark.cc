// The device codecs' throughput next to the GPU's copy bandwidth, measured in one run.
//
//   bazel run --config=cuda //kernels:topk_ef_gpu_benchmark -- --benchmark_format=json
//
// Every case skips ("no CUDA device") without a GPU or a CUDA build.
//
//   BM_DeviceCopy/<bytes>: cudaMemcpy device to device; bytes_per_second counts bytes read plus
//     bytes written: the limit the encode's ratio refers to.
//   BM_TopKEfEncodeGpuKernels/<rows>/<cols>: SparseLoCo defaults (top_k 64 per 4096, beta 0.95,
//     2-bit bin-mean values, automatic index coding), i.i.d. normal deltas. Time = the device
//     work of one encode (CUDA events from the EF update to the error-feedback correction).
//     bytes_per_second counts the 12 bytes per element the encode must touch (read e and delta,
//     write e_new), compared at the end with BM_DeviceCopy's rate of this run.
//   BM_TopKEfEncodeGpu/<rows>/<cols>: the same, end to end (wall clock per EncodeOnDevice: the
//     kernels, the payload's copy to pinned host memory, the envelope and checksum on the host).
//   BM_TopKEfDecodeGpu8/<rows>/<cols>: DecodeAccumulateOnDevice of 8 replicas' payloads
//     (validation on the host, upload, aggregation on the GPU); items = elements written.
//   BM_DenseInt8EncodeGpu/<n>: dense int8 (block 256) encode of n floats, end to end;
//     bytes_per_second counts the 4n input bytes.
// The binary ends with the encode's copy fractions on stdout.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "benchmark/benchmark.h"
#include "codecs/dense_quant.h"
#include "codecs/topk_ef.h"
#include "kernels/backend.h"
#include "kernels/device_codec.h"

namespace lbcc::kernels {
namespace {

double g_copy_bytes_per_second = 0;  // from BM_DeviceCopy, this run
std::map<std::string, double> g_fractions;

std::vector<float> Normals(int64_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

DeviceBuffer Upload(const std::vector<float>& v) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(4 * v.size(), 0);
  LBCC_CHECK(b.ok()) << b.status();
  LBCC_CHECK(b->CopyFromHost({reinterpret_cast<const uint8_t*>(v.data()), 4 * v.size()}).ok());
  return *std::move(b);
}

bool SkipWithoutDevice(benchmark::State& state) {
  if (DeviceCodecsAvailable()) return false;
  state.SkipWithError("no CUDA device (or built without CUDA)");
  return true;
}

void BM_DeviceCopy(benchmark::State& state) {
  if (SkipWithoutDevice(state)) return;
  const size_t bytes = static_cast<size_t>(state.range(0));
  Backend& be = *CudaBackend();
  DeviceBuffer a = *DeviceBuffer::Allocate(bytes, 0), b = *DeviceBuffer::Allocate(bytes, 0);
  for (auto _ : state) {
    LBCC_CHECK(be.CopyOnDevice(b.data(), a.data(), bytes, nullptr).ok());
    LBCC_CHECK(be.Synchronize(nullptr).ok());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * static_cast<int64_t>(bytes));
}

std::unique_ptr<codecs::TopKEfCodec> SparseLoCoCodec() {
  absl::StatusOr<std::unique_ptr<codecs::TopKEfCodec>> codec =
      codecs::TopKEfCodec::Create(codecs::TopKEfOptions());
  LBCC_CHECK(codec.ok());
  return *std::move(codec);
}

void EncodeCase(benchmark::State& state, bool kernels_only) {
  if (SkipWithoutDevice(state)) return;
  const Shape shape = {state.range(0), state.range(1)};
  const int64_t n = shape[0] * shape[1];
  auto codec = SparseLoCoCodec();
  DeviceBuffer delta = Upload(Normals(n, 7, 1e-3f));
  absl::StatusOr<std::unique_ptr<DeviceTopKEfState>> st = DeviceTopKEfState::Create(0);
  LBCC_CHECK(st.ok()) << st.status();
  DeviceTopKEfState& ef = **st;
  ef.set_timing(kernels_only);
  std::vector<uint8_t> out(*codec->MaxEncodedBytes(shape));
  const TensorView view = *delta.View(shape);
  size_t bytes = 0;
  // Warm-up: allocations and the first launches.
  LBCC_CHECK(EncodeOnDevice(*codec, view, &ef, absl::MakeSpan(out), nullptr).ok());
  LBCC_CHECK(ef.Commit().ok());
  for (auto _ : state) {
    absl::StatusOr<size_t> size = EncodeOnDevice(*codec, view, &ef, absl::MakeSpan(out), nullptr);
    LBCC_CHECK(size.ok()) << size.status();
    LBCC_CHECK(ef.Commit().ok());
    bytes = *size;
    if (kernels_only) state.SetIterationTime(ef.stats().last_device_seconds);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 12 * n);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * n);
  state.counters["bits_per_param"] = 8.0 * static_cast<double>(bytes) / static_cast<double>(n);
  state.counters["norm_fallbacks"] = static_cast<double>(ef.stats().norm_fallbacks);
  state.counters["shift_fallbacks"] = static_cast<double>(ef.stats().shift_fallbacks);
  state.counters["bin_fallbacks"] = static_cast<double>(ef.stats().bin_fallbacks);
}

void BM_TopKEfEncodeGpuKernels(benchmark::State& state) { EncodeCase(state, true); }
void BM_TopKEfEncodeGpu(benchmark::State& state) { EncodeCase(state, false); }

void BM_TopKEfDecodeGpu8(benchmark::State& state) {
  if (SkipWithoutDevice(state)) return;
  const Shape shape = {state.range(0), state.range(1)};
  const int64_t n = shape[0] * shape[1];
  auto codec = SparseLoCoCodec();
  std::vector<std::vector<uint8_t>> payloads;
  for (int r = 0; r < 8; ++r) {
    std::vector<float> delta = Normals(n, 50 + r, 1.0f);
    codecs::TopKEfState ef;
    std::vector<uint8_t> out(*codec->MaxEncodedBytes(shape));
    const size_t size =
        *codec->Encode(*TensorView::Host(delta.data(), shape), &ef, absl::MakeSpan(out));
    out.resize(size);
    payloads.push_back(std::move(out));
  }
  std::vector<absl::Span<const uint8_t>> spans(payloads.begin(), payloads.end());
  DeviceBuffer out = *DeviceBuffer::Allocate(4 * n, 0);
  DeviceScratch scratch;
  codecs::DecodeOptions options;
  options.accumulate = true;
  for (auto _ : state) {
    LBCC_CHECK(DecodeAccumulateOnDevice(spans, options, *out.View(shape), nullptr, &scratch).ok());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * n);
}

void BM_DenseInt8EncodeGpu(benchmark::State& state) {
  if (SkipWithoutDevice(state)) return;
  const int64_t n = state.range(0);
  codecs::DenseQuantOptions o;
  o.format = codecs::DenseFormat::kInt8;
  auto codec = *codecs::DenseQuantCodec::Create(o);
  DeviceBuffer x = Upload(Normals(n, 3, 1.0f));
  std::vector<uint8_t> out(*codec->MaxEncodedBytes({n}));
  DeviceScratch scratch;
  for (auto _ : state) {
    LBCC_CHECK(EncodeOnDevice(*codec, *x.View({n}), nullptr, absl::MakeSpan(out), nullptr, &scratch)
                   .ok());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 4 * n);
}

// Collects the rates of this run to print the ratios the README asks for.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      auto it = run.counters.find("bytes_per_second");
      const double rate = it != run.counters.end() ? static_cast<double>(it->second) : 0.0;
      const std::string name = run.benchmark_name();
      // Names carry the namespace: "lbcc::kernels::BM_DeviceCopy/...".
      if (name.find("BM_DeviceCopy/") != std::string::npos) {
        g_copy_bytes_per_second = std::max(g_copy_bytes_per_second, rate);
      }
      if (name.find("BM_TopKEfEncodeGpu") != std::string::npos) g_fractions[name] = rate;
    }
  }
};

}  // namespace
}  // namespace lbcc::kernels

BENCHMARK(lbcc::kernels::BM_DeviceCopy)->Arg(int64_t{1} << 30)->UseRealTime();
BENCHMARK(lbcc::kernels::BM_TopKEfEncodeGpuKernels)
    ->Args({4096, 4096})
    ->Args({8192, 8192})
    ->Args({16384, 8192})
    ->UseManualTime();
BENCHMARK(lbcc::kernels::BM_TopKEfEncodeGpu)->Args({4096, 4096})->Args({8192, 8192})->UseRealTime();
BENCHMARK(lbcc::kernels::BM_TopKEfDecodeGpu8)->Args({4096, 4096})->UseRealTime();
BENCHMARK(lbcc::kernels::BM_DenseInt8EncodeGpu)->Arg(int64_t{1} << 26)->UseRealTime();

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // The console reporter also computes the ratios; a --benchmark_format=json run still prints
  // them at the end (the JSON goes to --benchmark_out when given).
  lbcc::kernels::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  using lbcc::kernels::g_copy_bytes_per_second;
  if (g_copy_bytes_per_second > 0) {
    std::printf("device copy: %.1f GB/s (read + write)\n", g_copy_bytes_per_second / 1e9);
    for (const auto& [name, rate] : lbcc::kernels::g_fractions) {
      std::printf("%s: %.1f GB/s of the 12 B/element it must touch = %.3f of device copy\n",
                  name.c_str(), rate / 1e9, rate / g_copy_bytes_per_second);
    }
  } else {
    std::printf("no GPU figures: no CUDA device in this run\n");
  }
  return 0;
}
