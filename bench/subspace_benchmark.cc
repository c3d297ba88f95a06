// Subspace codec benchmarks, with cblas_sgemm measured in the same binary.
//
//   bazel run //bench:subspace_benchmark -- --benchmark_min_time=1
//
// BM_SubspaceForwardEncode / ForwardDecode / BackwardEncode / BackwardDecode: [8192 x 2048] fp32
// activations at k = 64 (the shape), coefficient dtype and table as named. Each
// iteration also times a plain cblas_sgemm of the same shape on the same data, right after the
// codec call, so `vs_sgemm` = sgemm seconds / codec seconds is a paired ratio that other load on
// the machine affects equally (target >= 0.8). `FLOP/s` counts the 2 n d k flops of the
// projection, directly comparable with BM_Sgemm's.
//
// BM_SubspaceError: bytes per token and reconstruction error (residual energy fraction
// ||h - dec(enc(h))||^2 / ||h - T[y]||^2 on held-out tokens, bf16 coefficients) for k/d = 1/8,
// 1/32, 1/64 at d = 1024, a single basis (the best rank-k subspace of the training tokens) vs a
// mixture of M = 4 subspaces of the same rank fitted by K-subspaces over blocks of 64 tokens
// (the single basis' payload is never larger). Two synthetic data sets: `mixture` (each block of
// 64 tokens lies in one of 4 planted rank-k subspaces, plus 1 % noise) and `lowrank` (one planted
// rank-4k subspace with a decaying spectrum, plus 1 % noise: no mixture structure). These rows
// are measurements of error, not timings.
#include <cblas.h>

#include <time.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "bench/limits.h"
#include "benchmark/benchmark.h"
#include "codecs/subspace_codec.h"
#include "codecs/subspace_training.h"

namespace lbcc::codecs {
namespace {

constexpr int64_t kTokens = 8192, kD = 2048, kK = 64, kVocab = 32768;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// CPU seconds of the whole process (every OpenBLAS thread included).
double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Wall and CPU seconds of one call.
struct Cost {
  double wall = 0, cpu = 0;
  Cost& operator+=(const Cost& o) {
    wall += o.wall;
    cpu += o.cpu;
    return *this;
  }
};

std::shared_ptr<const SubspaceBasis> Seeded(int64_t d, int64_t k, int64_t m, int64_t v, bool table,
                                            uint64_t seed) {
  SubspaceSeedSpec spec;
  spec.model_dim = d;
  spec.rank = k;
  spec.components = m;
  spec.vocab_size = v;
  spec.with_table = table;
  spec.table_stddev = 0.1;
  spec.seed = seed;
  spec.version = 1;
  auto basis = SubspaceBasis::FromSeed(spec);
  LBCC_CHECK(basis.ok()) << basis.status();
  return *basis;
}

std::vector<float> Gaussian(int64_t n, uint64_t seed, double scale = 1.0) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(scale * subspace_internal::Gaussian(seed, 7, static_cast<uint64_t>(i)));
  }
  return x;
}

// The shared inputs of the speed benchmarks (built once: the table alone is 256 MiB).
struct SpeedData {
  std::shared_ptr<const SubspaceBasis> with_table, without_table, mixture;
  std::vector<float> h, out, sgemm_out, ut;  // ut: U^T [k x d] for the plain decode-shaped sgemm
  std::vector<int32_t> ids;
};

SpeedData& Data() {
  static SpeedData* data = [] {
    auto* s = new SpeedData;
    s->with_table = Seeded(kD, kK, 1, kVocab, true, 1);
    s->without_table = Seeded(kD, kK, 1, kVocab, false, 1);
    s->mixture = Seeded(kD, kK, 4, kVocab, true, 2);
    s->h = Gaussian(kTokens * kD, 3);
    s->out.resize(kTokens * kD);
    s->sgemm_out.resize(kTokens * kD);
    s->ids.resize(kTokens);
    for (int64_t t = 0; t < kTokens; ++t) {
      s->ids[t] = static_cast<int32_t>(subspace_internal::Random64(4, 0, t) % kVocab);
    }
    s->ut.resize(kK * kD);
    for (int64_t i = 0; i < kD; ++i) {
      for (int64_t j = 0; j < kK; ++j) s->ut[j * kD + i] = s->with_table->u()[i * kK + j];
    }
    return s;
  }();
  return *data;
}

TensorView View(std::vector<float>& x, int64_t rows, int64_t cols) {
  auto view = TensorView::Host(x.data(), {rows, cols});
  LBCC_CHECK(view.ok());
  return *view;
}

std::shared_ptr<const SubspaceBasis> BasisFor(int64_t kind) {
  SpeedData& s = Data();
  return kind == 0 ? s.without_table : kind == 1 ? s.with_table : s.mixture;
}

const char* KindName(int64_t kind) {
  return kind == 0 ? "noT" : kind == 1 ? "T" : "mixM4";
}

SubspaceCodec MakeCodec(std::shared_ptr<const SubspaceBasis> basis, DType dtype) {
  SubspaceCodecOptions options;
  options.coefficient_dtype = dtype;
  options.mixture_block = 64;
  auto codec = SubspaceCodec::Create(std::move(basis), options);
  LBCC_CHECK(codec.ok());
  return *std::move(codec);
}

void Report(benchmark::State& state, const Cost& codec, const Cost& sgemm, size_t payload_bytes) {
  const double flops = 2.0 * kTokens * kD * kK;
  state.counters["FLOP/s"] =
      benchmark::Counter(flops * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["vs_sgemm"] = sgemm.wall / codec.wall;
  state.counters["vs_sgemm_cpu"] = sgemm.cpu / codec.cpu;
  state.counters["B/token"] = static_cast<double>(payload_bytes) / kTokens;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kTokens * kD * 4);
}

// The plain sgemm an encode is compared with: [n x d] x [d x k].
void EncodeShapedSgemm(const SubspaceBasis& basis) {
  SpeedData& s = Data();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kTokens, kK, kD, 1.0f, s.h.data(), kD,
              basis.u().data(), kK, 0.0f, s.sgemm_out.data(), kK);
}

// ... and a decode: [n x k] x [k x d].
void DecodeShapedSgemm() {
  SpeedData& s = Data();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kTokens, kD, kK, 1.0f, s.h.data(), kK,
              s.ut.data(), kD, 0.0f, s.sgemm_out.data(), kD);
}

template <typename Fn>
Cost Measure(Fn&& fn) {
  const double t0 = Now(), c0 = CpuNow();
  fn();
  const double c1 = CpuNow(), t1 = Now();
  return {t1 - t0, c1 - c0};
}

void BM_SubspaceForwardEncode(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  auto basis = BasisFor(state.range(1));
  SubspaceCodec codec = MakeCodec(basis, dtype);
  SpeedData& s = Data();
  std::vector<uint8_t> out(codec.ForwardPayloadBytes(kTokens));
  const TensorView h = View(s.h, kTokens, kD);
  Cost codec_cost, sgemm_cost;
  for (auto _ : state) {
    const Cost c = Measure([&] { LBCC_CHECK(codec.EncodeForward(h, s.ids, absl::MakeSpan(out)).ok()); });
    state.SetIterationTime(c.wall);
    codec_cost += c;
    sgemm_cost += Measure([&] { EncodeShapedSgemm(*basis); });
  }
  Report(state, codec_cost, sgemm_cost, out.size());
  state.SetLabel(absl::StrCat(DTypeName(dtype), " ", KindName(state.range(1))));
}

void BM_SubspaceForwardDecode(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  auto basis = BasisFor(state.range(1));
  SubspaceCodec codec = MakeCodec(basis, dtype);
  SpeedData& s = Data();
  auto payload = codec.EncodeForward(View(s.h, kTokens, kD), s.ids);
  LBCC_CHECK(payload.ok());
  const TensorView out = View(s.out, kTokens, kD);
  Cost codec_cost, sgemm_cost;
  for (auto _ : state) {
    const Cost c = Measure([&] { LBCC_CHECK(codec.DecodeForward(*payload, out).ok()); });
    state.SetIterationTime(c.wall);
    codec_cost += c;
    sgemm_cost += Measure([&] { DecodeShapedSgemm(); });
  }
  Report(state, codec_cost, sgemm_cost, payload->size());
  state.SetLabel(absl::StrCat(DTypeName(dtype), " ", KindName(state.range(1))));
}

void BM_SubspaceBackwardEncode(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  auto basis = BasisFor(0);
  SubspaceCodec codec = MakeCodec(basis, dtype);
  SpeedData& s = Data();
  std::vector<uint8_t> out(codec.BackwardPayloadBytes(kTokens));
  const TensorView g = View(s.h, kTokens, kD);
  Cost codec_cost, sgemm_cost;
  for (auto _ : state) {
    const Cost c = Measure([&] { LBCC_CHECK(codec.EncodeBackward(g, {}, absl::MakeSpan(out)).ok()); });
    state.SetIterationTime(c.wall);
    codec_cost += c;
    sgemm_cost += Measure([&] { EncodeShapedSgemm(*basis); });
  }
  Report(state, codec_cost, sgemm_cost, out.size());
  state.SetLabel(std::string(DTypeName(dtype)));
}

void BM_SubspaceBackwardDecode(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  SubspaceCodec codec = MakeCodec(BasisFor(0), dtype);
  SpeedData& s = Data();
  auto payload = codec.EncodeBackward(View(s.h, kTokens, kD));
  LBCC_CHECK(payload.ok());
  const TensorView out = View(s.out, kTokens, kD);
  Cost codec_cost, sgemm_cost;
  for (auto _ : state) {
    const Cost c = Measure([&] { LBCC_CHECK(codec.DecodeBackward(*payload, out).ok()); });
    state.SetIterationTime(c.wall);
    codec_cost += c;
    sgemm_cost += Measure([&] { DecodeShapedSgemm(); });
  }
  Report(state, codec_cost, sgemm_cost, payload->size());
  state.SetLabel(std::string(DTypeName(dtype)));
}

// Synthetic activations h - T[y] for the error study (see the header comment).
std::vector<float> Synthetic(bool mixture_data, const SubspaceBasis& planted, int64_t tokens,
                             int64_t block, uint64_t seed) {
  const int64_t d = planted.model_dim(), k = planted.rank(), ld = planted.ld();
  // x = noise + c_all [tokens x M*k] U_all^T.
  std::vector<float> x = Gaussian(tokens * d, seed + 1, 0.1 * std::sqrt(double(k) / d));
  std::vector<float> c_all(tokens * ld, 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    if (mixture_data) {  // the block's topic, unit spectrum
      const int64_t topic = subspace_internal::Random64(seed, 9, t / block) % planted.components();
      for (int64_t j = 0; j < k; ++j) {
        c_all[t * ld + topic * k + j] =
            static_cast<float>(subspace_internal::Gaussian(seed, 11, t * k + j));
      }
    } else {  // all components at once, spectrum decaying as 1 / sqrt(1 + j / 4)
      for (int64_t j = 0; j < ld; ++j) {
        c_all[t * ld + j] = static_cast<float>(subspace_internal::Gaussian(seed, 11, t * ld + j) /
                                               std::sqrt(1.0 + j / 4.0));
      }
    }
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tokens, d, ld, 1.0f, c_all.data(), ld,
              planted.u().data(), ld, 1.0f, x.data(), d);
  return x;
}

// Residual energy fraction of a codec round trip (bf16 coefficients) on h = T[y] + x.
double RoundTripError(std::shared_ptr<const SubspaceBasis> basis, const std::vector<float>& x,
                      int64_t block, size_t* payload_bytes) {
  const int64_t d = basis->model_dim(), tokens = static_cast<int64_t>(x.size()) / d;
  SubspaceCodecOptions options;
  options.coefficient_dtype = DType::kBF16;
  options.mixture_block = block;
  auto codec = SubspaceCodec::Create(basis, options);
  LBCC_CHECK(codec.ok());
  std::vector<int32_t> ids(tokens);
  std::vector<float> h(x.size()), out(x.size());
  for (int64_t t = 0; t < tokens; ++t) {
    ids[t] = static_cast<int32_t>(subspace_internal::Random64(6, 0, t) % basis->vocab_size());
    for (int64_t i = 0; i < d; ++i) h[t * d + i] = basis->table()[ids[t] * d + i] + x[t * d + i];
  }
  auto payload = codec->EncodeForward(View(h, tokens, d), ids);
  LBCC_CHECK(payload.ok());
  LBCC_CHECK(codec->DecodeForward(*payload, View(out, tokens, d)).ok());
  *payload_bytes = payload->size();
  double err = 0, total = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (double{h[i]} - out[i]) * (double{h[i]} - out[i]);
    total += double{x[i]} * x[i];
  }
  return err / total;
}

void BM_SubspaceError(benchmark::State& state) {
  const int64_t d = 1024, k = d / state.range(0), m = 4, block = 64, vocab = 4096;
  const bool mixture_data = state.range(1) != 0;
  const int64_t train = 16384, test = 8192;
  auto planted = Seeded(d, k, m, 0, false, 100 + k);
  const std::vector<float> x_train = Synthetic(mixture_data, *planted, train, block, 200);
  const std::vector<float> x_test = Synthetic(mixture_data, *planted, test, block, 300);
  auto table = Seeded(d, 1, 1, vocab, true, 7);
  SubspaceFitOptions fit;
  fit.rank = k;
  fit.mixture_block = block;
  fit.vocab_size = vocab;
  fit.table.assign(table->table().begin(), table->table().end());
  std::vector<float> train_copy = x_train;
  auto single = FitSubspaceBasis(View(train_copy, train, d), fit);
  fit.components = m;
  auto mixture = FitSubspaceBasis(View(train_copy, train, d), fit);
  LBCC_CHECK(single.ok() && mixture.ok()) << single.status() << mixture.status();
  double err_single = 0, err_mixture = 0;
  size_t bytes_single = 0, bytes_mixture = 0;
  for (auto _ : state) {
    err_single = RoundTripError(*single, x_test, block, &bytes_single);
    err_mixture = RoundTripError(*mixture, x_test, block, &bytes_mixture);
  }
  state.counters["B/tok_single"] = static_cast<double>(bytes_single) / test;
  state.counters["B/tok_mixture"] = static_cast<double>(bytes_mixture) / test;
  state.counters["B/tok_dense_bf16"] = 2.0 * d;
  state.counters["err_single"] = err_single;
  state.counters["err_mixture"] = err_mixture;
  state.SetLabel(absl::StrCat("d 1024 k ", k, " (k/d 1/", state.range(0), ") ",
                              mixture_data ? "mixture data" : "lowrank data"));
}

void RegisterAll() {
  bench::RegisterSgemm(kTokens, kK, kD);  // encode shape
  bench::RegisterSgemm(kTokens, kD, kK);  // decode shape
  const int64_t bf16 = static_cast<int64_t>(DType::kBF16), f32 = static_cast<int64_t>(DType::kF32),
                f16 = static_cast<int64_t>(DType::kF16), i8 = static_cast<int64_t>(DType::kI8);
  auto* fe = benchmark::RegisterBenchmark("BM_SubspaceForwardEncode", BM_SubspaceForwardEncode);
  auto* fd = benchmark::RegisterBenchmark("BM_SubspaceForwardDecode", BM_SubspaceForwardDecode);
  for (auto* b : {fe, fd}) {
    b->ArgNames({"dtype", "kind"});
    for (int64_t dtype : {f32, bf16, f16, i8}) b->Args({dtype, 1});
    b->Args({bf16, 0})->Args({bf16, 2});
    b->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  auto* be = benchmark::RegisterBenchmark("BM_SubspaceBackwardEncode", BM_SubspaceBackwardEncode);
  auto* bd = benchmark::RegisterBenchmark("BM_SubspaceBackwardDecode", BM_SubspaceBackwardDecode);
  for (auto* b : {be, bd}) {
    b->ArgNames({"dtype"})->Arg(f32)->Arg(bf16)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("BM_SubspaceError", BM_SubspaceError)
      ->ArgNames({"d_over_k", "mixture_data"})
      ->ArgsProduct({{8, 32, 64}, {1, 0}})
      ->Iterations(1)
      ->Repetitions(1)
      ->Unit(benchmark::kMillisecond);
}

}  // namespace
}  // namespace lbcc::codecs

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  lbcc::codecs::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
