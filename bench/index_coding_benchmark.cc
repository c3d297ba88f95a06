// Index-section decoding throughput: the adaptive coding next to the 12-bit packed one of the
// same indices (its limit), measured in one run.
//
//   flock -o /tmp/lbcc-bench.lock bazel run //bench:index_coding_benchmark --
//       --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// Cases, SparseLoCo's production setting (64x64 chunks, top_k 64 per 4096, so k = 64 per
// chunk; the encoder then picks b = 6, p = 0):
//   BM_DecodeAdaptive/<rows>/<cols>/<source>: DecodeAdaptive of the whole index section.
//     source 0: uniformly random positions; 1: the positions TopKEfCodec (IndexCoding::kAdaptive)
//     selects on i.i.d. normal data, with its own b and p, taken from its payload.
//   BM_DecodeAdaptiveSequential/...: internal::DecodeAdaptiveSequential, chunk after chunk (what
//     DecodeAdaptive was before its Rice-0 fast path; what it still does for p > 0).
//   BM_DecodePacked12/<rows>/<cols>/<source>: DecodePacked12 of the same indices.
//   BM_EncodeAdaptive/...: the encoder's side, ChooseAdaptive + EncodeAdaptive (must reproduce
//     the section); BM_EncodePacked12/...: EncodePacked12.
// items_per_second = indices decoded. The binary ends with each adaptive rate as a fraction of
// the packed12 rate of the same indices.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <utility>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/cpu.h"
#include "bench/limits.h"
#include "benchmark/benchmark.h"
#include "codecs/codec.h"
#include "codecs/index_coding.h"
#include "codecs/payload.h"
#include "codecs/topk_ef.h"

namespace lbcc::codecs {
namespace {

// One tensor's index list in both codings.
struct Section {
  IndexLayout layout;
  AdaptiveParams params;
  std::vector<uint16_t> local;
  std::vector<uint8_t> adaptive;
  std::vector<uint8_t> packed12;
};

// 64x64 chunks, k = 64 positions each, uniformly at random; the encoder's choice of b and p.
Section UniformSection(int64_t rows, int64_t cols) {
  Section s;
  s.layout = {(rows / 64) * (cols / 64), 64, 4096};
  std::mt19937 rng(11);
  std::vector<uint16_t> all(4096);
  std::iota(all.begin(), all.end(), 0);
  for (int64_t c = 0; c < s.layout.num_chunks; ++c) {
    // Partial Fisher-Yates: the first k entries become a uniform sample.
    for (int64_t i = 0; i < s.layout.k; ++i) {
      std::uniform_int_distribution<int64_t> pick(i, 4095);
      std::swap(all[i], all[pick(rng)]);
    }
    std::vector<uint16_t> chosen(all.begin(), all.begin() + s.layout.k);
    std::sort(chosen.begin(), chosen.end());
    s.local.insert(s.local.end(), chosen.begin(), chosen.end());
  }
  const AdaptiveChoice choice = ChooseAdaptive(s.local, s.layout);
  s.params = choice.params;
  s.adaptive.resize((choice.bits + 7) / 8);
  EncodeAdaptive(s.local, s.layout, s.params, absl::MakeSpan(s.adaptive));
  return s;
}

// The index section TopKEfCodec writes for i.i.d. normal data (SparseLoCo defaults).
Section EncoderSection(int64_t rows, int64_t cols) {
  TopKEfOptions options;
  options.indices = IndexCoding::kAdaptive;
  auto codec = TopKEfCodec::Create(options);
  LBCC_CHECK(codec.ok()) << codec.status();
  const Shape shape = {rows, cols};
  std::mt19937 rng(12);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> delta(static_cast<size_t>(rows * cols));
  for (float& x : delta) x = dist(rng);
  TopKEfState ef;
  std::vector<uint8_t> payload(*(*codec)->MaxEncodedBytes(shape));
  const absl::StatusOr<size_t> size =
      (*codec)->Encode(*TensorView::Host(delta.data(), shape), &ef, absl::MakeSpan(payload));
  LBCC_CHECK(size.ok()) << size.status();
  payload.resize(*size);
  const absl::StatusOr<PayloadInfo> info = ParsePayload(payload);
  LBCC_CHECK(info.ok()) << info.status();
  const absl::StatusOr<TopKEfHeader> h = ParseTopKEfHeader(*info);
  LBCC_CHECK(h.ok()) << h.status();
  LBCC_CHECK(h->indices == IndexCoding::kAdaptive);
  Section s;
  s.layout = h->layout;
  s.params = h->adaptive;
  s.adaptive.assign(h->index_section.begin(), h->index_section.end());
  s.local.resize(static_cast<size_t>(s.layout.count()));
  const absl::Status status =
      DecodeAdaptive(s.adaptive, s.layout, s.params, absl::MakeSpan(s.local));
  LBCC_CHECK(status.ok()) << status;
  return s;
}

const Section& GetSection(int64_t rows, int64_t cols, int64_t source) {
  static auto* cache = new std::map<std::vector<int64_t>, std::unique_ptr<Section>>;
  std::unique_ptr<Section>& s = (*cache)[{rows, cols, source}];
  if (s == nullptr) {
    s = std::make_unique<Section>(source == 0 ? UniformSection(rows, cols)
                                              : EncoderSection(rows, cols));
    s->packed12.resize(Packed12Bytes(s->layout.count()));
    EncodePacked12(s->local, absl::MakeSpan(s->packed12));
  }
  return *s;
}

void SetCounters(benchmark::State& state, const Section& s, size_t bytes) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * s.layout.count());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["bits_per_index"] = 8.0 * static_cast<double>(bytes) / s.layout.count();
  state.counters["b"] = s.params.sub_block_log2;
  state.counters["p"] = s.params.rice;
}

void BM_DecodeAdaptive(benchmark::State& state) {
  const Section& s = GetSection(state.range(0), state.range(1), state.range(2));
  std::vector<uint16_t> out(s.local.size());
  for (auto _ : state) {
    const absl::Status status = DecodeAdaptive(s.adaptive, s.layout, s.params, absl::MakeSpan(out));
    LBCC_CHECK(status.ok()) << status;
    benchmark::DoNotOptimize(out.data());
  }
  LBCC_CHECK(out == s.local);
  SetCounters(state, s, s.adaptive.size());
}

// The chunk-by-chunk decoder DecodeAdaptive falls back to (the decoder before its Rice-0
// fast path).
void BM_DecodeAdaptiveSequential(benchmark::State& state) {
  const Section& s = GetSection(state.range(0), state.range(1), state.range(2));
  std::vector<uint16_t> out(s.local.size());
  for (auto _ : state) {
    const absl::Status status =
        internal::DecodeAdaptiveSequential(s.adaptive, s.layout, s.params, absl::MakeSpan(out));
    LBCC_CHECK(status.ok()) << status;
    benchmark::DoNotOptimize(out.data());
  }
  LBCC_CHECK(out == s.local);
  SetCounters(state, s, s.adaptive.size());
}

void BM_DecodePacked12(benchmark::State& state) {
  const Section& s = GetSection(state.range(0), state.range(1), state.range(2));
  std::vector<uint16_t> out(s.local.size());
  for (auto _ : state) {
    const absl::Status status = DecodePacked12(s.packed12, s.layout, absl::MakeSpan(out));
    LBCC_CHECK(status.ok()) << status;
    benchmark::DoNotOptimize(out.data());
  }
  LBCC_CHECK(out == s.local);
  SetCounters(state, s, s.packed12.size());
}

// The encoder's index work for the adaptive coding: ChooseAdaptive (sizes of both sub-block
// widths), then EncodeAdaptive with the chosen parameters.
void BM_EncodeAdaptive(benchmark::State& state) {
  const Section& s = GetSection(state.range(0), state.range(1), state.range(2));
  std::vector<uint8_t> out(AdaptiveMaxBytes(s.layout));
  size_t bytes = 0;
  for (auto _ : state) {
    const AdaptiveChoice choice = ChooseAdaptive(s.local, s.layout);
    bytes = static_cast<size_t>((choice.bits + 7) / 8);
    EncodeAdaptive(s.local, s.layout, choice.params, absl::MakeSpan(out.data(), bytes));
    benchmark::DoNotOptimize(out.data());
  }
  LBCC_CHECK(std::equal(s.adaptive.begin(), s.adaptive.end(), out.begin()) &&
             bytes == s.adaptive.size());
  SetCounters(state, s, bytes);
}

void BM_EncodePacked12(benchmark::State& state) {
  const Section& s = GetSection(state.range(0), state.range(1), state.range(2));
  std::vector<uint8_t> out(s.packed12.size());
  for (auto _ : state) {
    EncodePacked12(s.local, absl::MakeSpan(out));
    benchmark::DoNotOptimize(out.data());
  }
  LBCC_CHECK(out == s.packed12);
  SetCounters(state, s, s.packed12.size());
}

}  // namespace
}  // namespace lbcc::codecs

int main(int argc, char** argv) {
  using namespace lbcc::codecs;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::printf("SIMD level: %s\n",
              std::string(lbcc::SimdLevelName(lbcc::ActiveSimdLevel())).c_str());
  const std::vector<std::vector<int64_t>> cases = {
      {2048, 2048, 0}, {2048, 2048, 1}, {4096, 4096, 0}, {4096, 4096, 1}};
  using Fn = void (*)(benchmark::State&);
  const std::vector<std::pair<const char*, Fn>> benchmarks = {
      {"BM_DecodeAdaptive", BM_DecodeAdaptive},
      {"BM_DecodeAdaptiveSequential", BM_DecodeAdaptiveSequential},
      {"BM_DecodePacked12", BM_DecodePacked12},
      {"BM_EncodeAdaptive", BM_EncodeAdaptive},
      {"BM_EncodePacked12", BM_EncodePacked12}};
  for (const std::vector<int64_t>& args : cases) {
    for (const auto& [name, fn] : benchmarks) {
      benchmark::RegisterBenchmark(name, fn)->Args(args)->Unit(benchmark::kMicrosecond);
    }
  }
  lbcc::bench::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  std::printf("\nG indices/s (medians when repeated):\n");
  for (const std::vector<int64_t>& args : cases) {
    const std::string suffix = "/" + std::to_string(args[0]) + "/" + std::to_string(args[1]) +
                               "/" + std::to_string(args[2]);
    auto rate = [&](const std::string& name) {
      return reporter.Get(name + suffix, "items_per_second");
    };
    const double adaptive = rate("BM_DecodeAdaptive");
    const double sequential = rate("BM_DecodeAdaptiveSequential");
    const double packed = rate("BM_DecodePacked12");
    if (adaptive > 0 && sequential > 0 && packed > 0) {
      std::printf(
          "  %s %-8s adaptive %.3f (sequential %.3f, x%.2f)  packed12 %.3f  "
          "adaptive/packed12 %.2f\n",
          suffix.c_str() + 1, args[2] == 0 ? "uniform" : "encoder", adaptive / 1e9,
          sequential / 1e9, adaptive / sequential, packed / 1e9, adaptive / packed);
    }
  }
  return 0;
}
