// The device codecs' whole pipeline (kernels, orchestration, envelope) against the CPU codecs:
// payloads byte for byte, error feedback and decoded tensors bit for bit.
//
// Built twice: device_codec_test runs on the emulated backend (the kernels' code on the host,
// every build), device_codec_gpu_test (LBCC_TEST_ON_GPU, tag gpu) on the CUDA backend and skips
// without a device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status_matchers.h"
#include "base/dtype.h"
#include "base/tensor_view.h"
#include "codecs/codec.h"
#include "codecs/dense_quant.h"
#include "codecs/topk_ef.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/device_codec.h"

namespace lbcc::kernels {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

// The backend under test: the emulated one, or CUDA (nullptr when unavailable).
Backend* TestBackend() {
#ifdef LBCC_TEST_ON_GPU
  return DeviceCodecsAvailable() ? CudaBackend() : nullptr;
#else
  return &EmulatedBackend();
#endif
}

Backend& Emu() { return *TestBackend(); }

#define LBCC_SKIP_WITHOUT_BACKEND() \
  if (TestBackend() == nullptr) GTEST_SKIP() << "no CUDA device (or built without CUDA)"

// Device memory holding `host` (on the backend under test).
DeviceBuffer Upload(absl::Span<const float> host) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(Emu(), std::max<size_t>(4, 4 * host.size()), 0);
  LBCC_CHECK(b.ok()) << b.status();
  LBCC_CHECK(b->CopyFromHost({reinterpret_cast<const uint8_t*>(host.data()), 4 * host.size()}).ok());
  return *std::move(b);
}

std::vector<float> Download(const DeviceBuffer& b, size_t n) {
  std::vector<float> host(n);
  LBCC_CHECK(b.CopyToHost({reinterpret_cast<uint8_t*>(host.data()), 4 * n}).ok());
  return host;
}

const float* F(const DeviceBuffer& b) { return static_cast<const float*>(b.data()); }
float* Mut(DeviceBuffer& b) { return static_cast<float*>(b.data()); }

int64_t Count(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> Gaussian(int64_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

uint32_t Bits(float x) { return hd::Bits(x); }

void ExpectBitwiseEqual(absl::Span<const float> a, absl::Span<const float> b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(Bits(a[i]), Bits(b[i])) << what << " at " << i << ": " << a[i] << " vs " << b[i];
  }
}

// Runs `rounds` encodes of the same deltas through the CPU codec and the emulated device codec,
// committing (or aborting) both, and compares every payload and state.
void CompareTopK(const codecs::TopKEfOptions& options, const Shape& shape, int rounds,
                 const std::vector<std::vector<float>>& deltas, const std::string& what) {
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<codecs::TopKEfCodec> codec,
                            codecs::TopKEfCodec::Create(options));
  codecs::TopKEfState cpu_state;
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceTopKEfState> dev_state,
                            DeviceTopKEfState::Create(Emu(), 0));
  LBCC_ASSERT_OK_AND_ASSIGN(const size_t max_bytes, codec->MaxEncodedBytes(shape));
  const int64_t n = Count(shape);
  for (int round = 0; round < rounds; ++round) {
    const std::string where = absl::StrCat(what, " round ", round);
    std::vector<float> delta = deltas[round % deltas.size()];
    LBCC_ASSERT_OK_AND_ASSIGN(TensorView view, TensorView::Host(delta.data(), shape));
    std::vector<uint8_t> cpu_out(max_bytes), dev_out(max_bytes);
    LBCC_ASSERT_OK_AND_ASSIGN(const size_t cpu_size,
                              codec->Encode(view, &cpu_state, absl::MakeSpan(cpu_out)));
    const DeviceBuffer dev_delta = Upload(delta);
    LBCC_ASSERT_OK_AND_ASSIGN(
        const size_t dev_size,
        internal::EncodeWith(Emu(), *codec, F(dev_delta), shape, dev_state.get(),
                             absl::MakeSpan(dev_out), nullptr, nullptr));
    ASSERT_EQ(dev_size, cpu_size) << where;
    cpu_out.resize(cpu_size);
    dev_out.resize(dev_size);
    ASSERT_EQ(dev_out, cpu_out) << where;
    std::vector<float> pending(static_cast<size_t>(n));
    ASSERT_THAT(dev_state->CopyPendingErrorToHost(absl::MakeSpan(pending)), IsOk());
    ExpectBitwiseEqual(pending, cpu_state.pending_error(), where + " pending error");
    if (round % 3 == 2) {
      ASSERT_THAT(cpu_state.Abort(), IsOk());
      ASSERT_THAT(dev_state->Abort(), IsOk());
    } else {
      ASSERT_THAT(cpu_state.Commit(), IsOk());
      ASSERT_THAT(dev_state->Commit(), IsOk());
    }
    std::vector<float> committed(static_cast<size_t>(n));
    ASSERT_THAT(dev_state->CopyErrorToHost(absl::MakeSpan(committed)), IsOk());
    ExpectBitwiseEqual(committed, cpu_state.error(), where + " committed error");
  }
}

struct ShapeCase {
  Shape shape;
  const char* name;
};

const std::vector<ShapeCase>& Shapes() {
  static const auto* shapes = new std::vector<ShapeCase>{
      {{128, 256}, "128x256"},    {{64, 64}, "64x64"},         {{3000}, "1d-3000"},
      {{67, 131}, "prime-dims"},  {{2, 96, 40}, "rank3"},      {{}, "scalar"},
      {{0, 5}, "empty"},          {{5, 7}, "5x7"},             {{130, 36}, "130x36"},
      {{192, 68}, "w-not-vec4"},  {{96, 12}, "w-12"},          {{64, 4}, "w-4"},
  };
  return *shapes;
}

TEST(DeviceTopKTest, DefaultOptionsMatchTheCpuCodecOnEveryShape) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(11);
  for (const ShapeCase& s : Shapes()) {
    const int64_t n = Count(s.shape);
    std::vector<std::vector<float>> deltas;
    for (int i = 0; i < 3; ++i) deltas.push_back(Gaussian(n, rng, 0.01f));
    CompareTopK(codecs::TopKEfOptions(), s.shape, 4, deltas, s.name);
    ASSERT_FALSE(HasFatalFailure()) << s.name;
  }
}

// A training-sized tensor (many chunks, multi-block reductions, the CUB scan on the GPU): same
// payloads, and the statistics take their fast path on Gaussian data.
TEST(DeviceTopKTest, LargeTensorMatchesTheCpuCodec) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(22);
  const Shape shape = TestBackend()->is_device() ? Shape{4096, 4096} : Shape{512, 768};
  const int64_t n = Count(shape);
  std::vector<std::vector<float>> deltas;
  for (int i = 0; i < 2; ++i) deltas.push_back(Gaussian(n, rng, 1e-3f));
  for (codecs::IndexCoding ic : {codecs::IndexCoding::kAuto, codecs::IndexCoding::kAdaptive}) {
    codecs::TopKEfOptions o;
    o.indices = ic;
    CompareTopK(o, shape, 3, deltas, absl::StrCat("large, indices ", static_cast<int>(ic)));
    ASSERT_FALSE(HasFatalFailure());
  }
  LBCC_ASSERT_OK_AND_ASSIGN(auto codec, codecs::TopKEfCodec::Create(codecs::TopKEfOptions()));
  LBCC_ASSERT_OK_AND_ASSIGN(auto state, DeviceTopKEfState::Create(Emu(), 0));
  std::vector<uint8_t> out(*codec->MaxEncodedBytes(shape));
  ASSERT_THAT(internal::EncodeWith(Emu(), *codec, F(Upload(deltas[0])), shape, state.get(),
                                   absl::MakeSpan(out), nullptr, nullptr),
              IsOk());
  EXPECT_EQ(state->stats().shift_fallbacks, 0);
  EXPECT_EQ(state->stats().bin_fallbacks, 0);
}

TEST(DeviceTopKTest, EveryValueAndIndexCodingMatches) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(12);
  const Shape shape = {96, 320};
  const int64_t n = Count(shape);
  std::vector<std::vector<float>> deltas;
  for (int i = 0; i < 2; ++i) deltas.push_back(Gaussian(n, rng, 3.0f));
  for (uint8_t v = 1; v <= 8; ++v) {
    for (codecs::IndexCoding ic : {codecs::IndexCoding::kAuto, codecs::IndexCoding::kPacked12,
                                   codecs::IndexCoding::kAdaptive}) {
      for (double top_k : {64.0, 3.0, 500.0}) {
        codecs::TopKEfOptions o;
        o.values = static_cast<codecs::ValueCoding>(v);
        o.indices = ic;
        o.top_k = top_k;
        o.value_block = v % 2 == 0 ? 7 : 64;
        o.beta = 0.9f;
        o.lr = 0.7f;
        const std::string what = absl::StrCat("values ", int{v}, " indices ", static_cast<int>(ic),
                                              " top_k ", top_k);
        CompareTopK(o, shape, 3, deltas, what);
        ASSERT_FALSE(HasFatalFailure()) << what;
      }
    }
  }
}

TEST(DeviceTopKTest, TakeAllAndTinyDensities) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(13);
  for (double top_k : {4096.0, 4000.0, 0.5, 1.0}) {
    codecs::TopKEfOptions o;
    o.top_k = top_k;
    const Shape shape = {64, 192};
    CompareTopK(o, shape, 3, {Gaussian(Count(shape), rng)}, absl::StrCat("top_k ", top_k));
    ASSERT_FALSE(HasFatalFailure());
  }
}

// Many equal magnitudes: the tie rule (lower local position first) decides the selection.
TEST(DeviceTopKTest, TiesFollowTheCpuRule) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(14);
  const Shape shape = {128, 128};
  const int64_t n = Count(shape);
  std::vector<float> delta(static_cast<size_t>(n));
  const float levels[] = {1.0f, -1.0f, 0.5f, -0.5f, 0.0f, 2.0f};
  for (float& x : delta) x = levels[rng() % 6];
  codecs::TopKEfOptions o;
  o.beta = 1.0f;
  CompareTopK(o, shape, 4, {delta}, "ties");
  ASSERT_FALSE(HasFatalFailure());
  std::vector<float> zeros(static_cast<size_t>(n), 0.0f);
  CompareTopK(o, shape, 2, {zeros}, "zeros");
}

// Values spanning a hundred binades: the statistics' sequential fallbacks must give the CPU's
// bits too.
TEST(DeviceTopKTest, WideDynamicRangeTakesTheFallbacksAndStillMatches) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(15);
  const Shape shape = {256, 256};
  const int64_t n = Count(shape);
  std::vector<float> delta(static_cast<size_t>(n));
  // Each 64 x 64 chunk on its own scale, 2^-60 .. 2^60: the selected values span them all.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t r = 0; r < 256; ++r) {
    for (int64_t c = 0; c < 256; ++c) {
      const int chunk = static_cast<int>((r / 64) * 4 + c / 64);
      delta[r * 256 + c] = std::ldexp(normal(rng), -60 + 8 * chunk);
    }
  }
  for (uint8_t v : {uint8_t{4}, uint8_t{6}}) {
    codecs::TopKEfOptions o;
    o.values = static_cast<codecs::ValueCoding>(v);
    o.top_k = 256;
    CompareTopK(o, shape, 2, {delta}, "wide");
    ASSERT_FALSE(HasFatalFailure());
  }
  // The fallbacks really ran.
  LBCC_ASSERT_OK_AND_ASSIGN(auto codec, codecs::TopKEfCodec::Create(codecs::TopKEfOptions()));
  LBCC_ASSERT_OK_AND_ASSIGN(auto state, DeviceTopKEfState::Create(Emu(), 0));
  std::vector<uint8_t> out(*codec->MaxEncodedBytes(shape));
  ASSERT_THAT(internal::EncodeWith(Emu(), *codec, F(Upload(delta)), shape, state.get(),
                                   absl::MakeSpan(out), nullptr, nullptr),
              IsOk());
  EXPECT_EQ(state->stats().encodes, 1);
  EXPECT_EQ(state->stats().shift_fallbacks, 1);
}

// Two values +-c whose sum of squares 2 c^2 sits on a rounding boundary of sqrt -> fp32 (c found
// by search): the norm's bracket cannot decide, the CPU's fold runs, same payload.
TEST(DeviceTopKTest, NormOnARoundingBoundaryTakesTheFold) {
  LBCC_SKIP_WITHOUT_BACKEND();
  const float c = BitsToFloat(0x3f8b5f4fu);
  codecs::TopKEfOptions o;
  o.top_k = 4096;  // take both
  const Shape shape = {1, 2};
  CompareTopK(o, shape, 1, {{c, -c}}, "boundary");
  ASSERT_FALSE(HasFatalFailure());
  LBCC_ASSERT_OK_AND_ASSIGN(auto codec, codecs::TopKEfCodec::Create(o));
  LBCC_ASSERT_OK_AND_ASSIGN(auto state, DeviceTopKEfState::Create(Emu(), 0));
  std::vector<uint8_t> out(*codec->MaxEncodedBytes(shape));
  ASSERT_THAT(internal::EncodeWith(Emu(), *codec, F(Upload({c, -c})), shape, state.get(),
                                   absl::MakeSpan(out), nullptr, nullptr),
              IsOk());
  EXPECT_EQ(state->stats().norm_fallbacks, 1);
  EXPECT_EQ(state->stats().shift_fallbacks, 0);
}

TEST(DeviceTopKTest, NonFiniteInputLeavesTheStateUnchanged) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(16);
  const Shape shape = {128, 128};
  std::vector<float> delta = Gaussian(Count(shape), rng);
  LBCC_ASSERT_OK_AND_ASSIGN(auto codec, codecs::TopKEfCodec::Create(codecs::TopKEfOptions()));
  LBCC_ASSERT_OK_AND_ASSIGN(auto state, DeviceTopKEfState::Create(Emu(), 0));
  std::vector<uint8_t> out(*codec->MaxEncodedBytes(shape));
  ASSERT_THAT(internal::EncodeWith(Emu(), *codec, F(Upload(delta)), shape, state.get(),
                                   absl::MakeSpan(out), nullptr, nullptr),
              IsOk());
  ASSERT_THAT(state->Commit(), IsOk());
  std::vector<float> before(delta.size()), after(delta.size());
  ASSERT_THAT(state->CopyErrorToHost(absl::MakeSpan(before)), IsOk());
  delta[70 * 128 + 5] = std::numeric_limits<float>::quiet_NaN();
  codecs::TopKEfState cpu;
  LBCC_ASSERT_OK_AND_ASSIGN(TensorView view, TensorView::Host(delta.data(), shape));
  const absl::Status cpu_status = codec->Encode(view, &cpu, absl::MakeSpan(out)).status();
  const absl::Status dev_status = internal::EncodeWith(Emu(), *codec, F(Upload(delta)), shape,
                                                       state.get(), absl::MakeSpan(out), nullptr,
                                                       nullptr)
                                      .status();
  EXPECT_THAT(dev_status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rows 64..127")));
  EXPECT_EQ(dev_status.message(), cpu_status.message());
  EXPECT_FALSE(state->has_pending());
  ASSERT_THAT(state->CopyErrorToHost(absl::MakeSpan(after)), IsOk());
  ExpectBitwiseEqual(after, before, "state after NaN");
}

TEST(DeviceTopKTest, StateContractMatchesTheCpuState) {
  LBCC_SKIP_WITHOUT_BACKEND();
  LBCC_ASSERT_OK_AND_ASSIGN(auto codec, codecs::TopKEfCodec::Create(codecs::TopKEfOptions()));
  LBCC_ASSERT_OK_AND_ASSIGN(auto state, DeviceTopKEfState::Create(Emu(), 0));
  EXPECT_THAT(state->Commit(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(state->Abort(), StatusIs(absl::StatusCode::kFailedPrecondition));
  const Shape shape = {64, 64};
  std::vector<float> delta(4096, 1.0f);
  std::vector<uint8_t> out(*codec->MaxEncodedBytes(shape));
  ASSERT_THAT(internal::EncodeWith(Emu(), *codec, F(Upload(delta)), shape, state.get(),
                                   absl::MakeSpan(out), nullptr, nullptr),
              IsOk());
  EXPECT_TRUE(state->has_pending());
  EXPECT_THAT(internal::EncodeWith(Emu(), *codec, F(Upload(delta)), shape, state.get(),
                                   absl::MakeSpan(out), nullptr, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(state->Commit(), IsOk());
  const Shape other = {32, 128};
  EXPECT_THAT(internal::EncodeWith(Emu(), *codec, F(Upload(delta)), other, state.get(),
                                   absl::MakeSpan(out), nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("differs")));
  std::vector<uint8_t> small(16);
  EXPECT_THAT(internal::EncodeWith(Emu(), *codec, F(Upload(delta)), shape, state.get(),
                                   absl::MakeSpan(small), nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("MaxEncodedBytes")));
  // A CPU state is refused.
  codecs::TopKEfState cpu;
  EXPECT_THAT(internal::EncodeWith(Emu(), *codec, F(Upload(delta)), shape, &cpu, absl::MakeSpan(out),
                                   nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("DeviceTopKEfState")));
  // Load from a checkpoint, then the same payload as a CPU state loaded alike.
  std::mt19937 rng(17);
  std::vector<float> error = Gaussian(4096, rng);
  ASSERT_THAT(state->Load(shape, error), IsOk());
  ASSERT_THAT(cpu.Load(shape, error), IsOk());
  std::vector<uint8_t> a(out.size()), b(out.size());
  LBCC_ASSERT_OK_AND_ASSIGN(TensorView view, TensorView::Host(delta.data(), shape));
  LBCC_ASSERT_OK_AND_ASSIGN(size_t na, codec->Encode(view, &cpu, absl::MakeSpan(a)));
  LBCC_ASSERT_OK_AND_ASSIGN(size_t nb, internal::EncodeWith(Emu(), *codec, F(Upload(delta)), shape,
                                                            state.get(), absl::MakeSpan(b),
                                                            nullptr, nullptr));
  ASSERT_EQ(na, nb);
  a.resize(na);
  b.resize(nb);
  EXPECT_EQ(a, b);
  error[3] = std::numeric_limits<float>::infinity();
  EXPECT_THAT(state->Load(shape, error), StatusIs(absl::StatusCode::kInvalidArgument));
}

// Payloads of several replicas with different options, decoded by both decoders.
TEST(DeviceDecodeTest, TopKAggregationMatchesTheCpuDecoder) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(18);
  for (const ShapeCase& s : Shapes()) {
    const int64_t n = Count(s.shape);
    std::vector<std::vector<uint8_t>> payloads;
    for (int r = 0; r < 5; ++r) {
      codecs::TopKEfOptions o;
      o.values = static_cast<codecs::ValueCoding>(1 + r % 8);
      o.indices = r % 2 ? codecs::IndexCoding::kAdaptive : codecs::IndexCoding::kPacked12;
      o.top_k = r == 3 ? 600 : 64;
      o.value_block = 5;
      LBCC_ASSERT_OK_AND_ASSIGN(auto codec, codecs::TopKEfCodec::Create(o));
      codecs::TopKEfState state;
      std::vector<float> delta = Gaussian(n, rng);
      // Replicas share some positions (so the means divide by different counts).
      for (int64_t i = 0; i < n; i += 7) delta[i] = 10.0f + static_cast<float>(r);
      LBCC_ASSERT_OK_AND_ASSIGN(TensorView view, TensorView::Host(delta.data(), s.shape));
      std::vector<uint8_t> out(*codec->MaxEncodedBytes(s.shape));
      LBCC_ASSERT_OK_AND_ASSIGN(size_t size, codec->Encode(view, &state, absl::MakeSpan(out)));
      out.resize(size);
      payloads.push_back(std::move(out));
    }
    std::vector<absl::Span<const uint8_t>> spans(payloads.begin(), payloads.end());
    for (auto rule : {codecs::Aggregation::kSparseLoCoMean, codecs::Aggregation::kMean,
                      codecs::Aggregation::kSum}) {
      for (bool accumulate : {false, true}) {
        codecs::DecodeOptions options{rule, accumulate};
        std::vector<float> base = Gaussian(n, rng);
        std::vector<float> cpu = base, dev = base;
        LBCC_ASSERT_OK_AND_ASSIGN(TensorView view, TensorView::Host(cpu.data(), s.shape));
        ASSERT_THAT(codecs::DecodeAccumulate(spans, options, view), IsOk());
        DeviceBuffer dev_out = Upload(dev);
        ASSERT_THAT(internal::DecodeAccumulateWith(Emu(), spans, options, Mut(dev_out), s.shape,
                                                   nullptr, nullptr),
                    IsOk());
        dev = Download(dev_out, dev.size());
        ExpectBitwiseEqual(dev, cpu, absl::StrCat(s.name, " rule ", static_cast<int>(rule),
                                                  " accumulate ", accumulate));
        ASSERT_FALSE(HasFatalFailure());
      }
    }
  }
}

TEST(DeviceDecodeTest, DenseAggregationMatchesTheCpuDecoder) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(19);
  const Shape shape = {33, 65};
  const int64_t n = Count(shape);
  for (uint8_t f = 1; f <= 4; ++f) {
    std::vector<std::vector<uint8_t>> payloads;
    for (int r = 0; r < 3; ++r) {
      codecs::DenseQuantOptions o;
      o.format = static_cast<codecs::DenseFormat>(f);
      o.block = 16 * (r + 1);
      LBCC_ASSERT_OK_AND_ASSIGN(auto codec, codecs::DenseQuantCodec::Create(o));
      std::vector<float> x = Gaussian(n, rng);
      LBCC_ASSERT_OK_AND_ASSIGN(TensorView view, TensorView::Host(x.data(), shape));
      std::vector<uint8_t> out(*codec->MaxEncodedBytes(shape));
      LBCC_ASSERT_OK_AND_ASSIGN(size_t size, codec->Encode(view, nullptr, absl::MakeSpan(out)));
      out.resize(size);
      payloads.push_back(std::move(out));
    }
    for (size_t count : {size_t{1}, size_t{3}}) {
      std::vector<absl::Span<const uint8_t>> spans(payloads.begin(), payloads.begin() + count);
      for (auto rule : {codecs::Aggregation::kMean, codecs::Aggregation::kSum}) {
        for (bool accumulate : {false, true}) {
          codecs::DecodeOptions options{rule, accumulate};
          std::vector<float> base = Gaussian(n, rng);
          std::vector<float> cpu = base, dev = base;
          LBCC_ASSERT_OK_AND_ASSIGN(TensorView view, TensorView::Host(cpu.data(), shape));
          ASSERT_THAT(codecs::DecodeAccumulate(spans, options, view), IsOk());
          DeviceBuffer dev_out = Upload(dev);
          ASSERT_THAT(internal::DecodeAccumulateWith(Emu(), spans, options, Mut(dev_out), shape,
                                                     nullptr, nullptr),
                      IsOk());
          dev = Download(dev_out, dev.size());
          ExpectBitwiseEqual(dev, cpu, absl::StrCat("format ", int{f}, " payloads ", count));
          ASSERT_FALSE(HasFatalFailure());
        }
      }
    }
  }
}

TEST(DeviceDecodeTest, CorruptPayloadsAreRejectedAndTheOutputUntouched) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(20);
  const Shape shape = {64, 128};
  const int64_t n = Count(shape);
  LBCC_ASSERT_OK_AND_ASSIGN(auto codec, codecs::TopKEfCodec::Create(codecs::TopKEfOptions()));
  codecs::TopKEfState state;
  std::vector<float> delta = Gaussian(n, rng);
  LBCC_ASSERT_OK_AND_ASSIGN(TensorView view, TensorView::Host(delta.data(), shape));
  std::vector<uint8_t> good(*codec->MaxEncodedBytes(shape));
  LBCC_ASSERT_OK_AND_ASSIGN(size_t size, codec->Encode(view, &state, absl::MakeSpan(good)));
  good.resize(size);
  std::vector<uint8_t> bad = good;
  bad[bad.size() / 2] ^= 0x40;
  DeviceBuffer out = Upload(std::vector<float>(static_cast<size_t>(n), 7.0f));
  std::vector<absl::Span<const uint8_t>> spans = {good, bad};
  EXPECT_THAT(internal::DecodeAccumulateWith(Emu(), spans, {}, Mut(out), shape, nullptr, nullptr),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("payload 1")));
  for (float x : Download(out, static_cast<size_t>(n))) ASSERT_EQ(x, 7.0f);
  const Shape wrong = {128, 64};
  EXPECT_THAT(internal::DecodeAccumulateWith(Emu(), {good}, {}, Mut(out), wrong, nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape")));
  EXPECT_THAT(internal::DecodeAccumulateWith(Emu(), {}, {}, Mut(out), shape, nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// templar's options (k_rule per_chunk): the device twin stays byte-identical; flat 1-D chunks
// are host-only (Unimplemented); the median-norm clip decodes to the CPU decoder's bits.
TEST(DeviceTopKTest, TemplarOptionsAndTheMedianNormClipMatchTheCpuCodec) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(5);
  for (const ShapeCase& s : Shapes()) {
    const int64_t n = Count(s.shape);
    std::vector<std::vector<float>> deltas;
    for (int i = 0; i < 3; ++i) deltas.push_back(Gaussian(n, rng, 0.01f));
    CompareTopK(codecs::TopKEfOptions::Templar(), s.shape, 3, deltas, s.name);
    ASSERT_FALSE(HasFatalFailure()) << s.name;
  }
  codecs::TopKEfOptions flat;
  flat.chunk_1d = codecs::Chunk1D::kFlat4096;
  LBCC_ASSERT_OK_AND_ASSIGN(auto flat_codec, codecs::TopKEfCodec::Create(flat));
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceTopKEfState> st, DeviceTopKEfState::Create(Emu(), 0));
  const DeviceBuffer delta = Upload(Gaussian(8192, rng));
  std::vector<uint8_t> out(*flat_codec->MaxEncodedBytes({8192}));
  EXPECT_THAT(internal::EncodeWith(Emu(), *flat_codec, F(delta), {8192}, st.get(),
                                   absl::MakeSpan(out), nullptr, nullptr),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("flat4096")));
  for (codecs::ValueCoding values : {codecs::ValueCoding::kBinMean2, codecs::ValueCoding::kF32}) {
    codecs::TopKEfOptions o = codecs::TopKEfOptions::Templar();
    o.values = values;
    LBCC_ASSERT_OK_AND_ASSIGN(auto codec, codecs::TopKEfCodec::Create(o));
    const Shape shape = {96, 200};
    std::vector<std::vector<uint8_t>> payloads;
    for (float sigma : {1.0f, 3.0f, 0.5f, 40.0f}) {
      codecs::TopKEfState cpu_state;
      std::vector<float> d = Gaussian(Count(shape), rng, sigma);
      std::vector<uint8_t> p(*codec->MaxEncodedBytes(shape));
      LBCC_ASSERT_OK_AND_ASSIGN(TensorView view, TensorView::Host(d.data(), shape));
      LBCC_ASSERT_OK_AND_ASSIGN(const size_t size, codec->Encode(view, &cpu_state, absl::MakeSpan(p)));
      p.resize(size);
      payloads.push_back(std::move(p));
    }
    std::vector<absl::Span<const uint8_t>> spans(payloads.begin(), payloads.end());
    codecs::DecodeOptions options;
    options.clip_to_median_norm = true;
    std::vector<float> cpu(static_cast<size_t>(Count(shape)));
    LBCC_ASSERT_OK_AND_ASSIGN(TensorView view, TensorView::Host(cpu.data(), shape));
    ASSERT_THAT(codecs::DecodeAccumulate(spans, options, view), IsOk());
    DeviceBuffer dev_out = Upload(std::vector<float>(cpu.size(), 7.0f));
    const absl::Status status = internal::DecodeAccumulateWith(Emu(), spans, options, Mut(dev_out),
                                                               shape, nullptr, nullptr);
    if (values != codecs::ValueCoding::kBinMean2) {
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("bin-mean")));
      for (float x : Download(dev_out, cpu.size())) ASSERT_EQ(x, 7.0f);
      continue;
    }
    ASSERT_THAT(status, IsOk());
    ExpectBitwiseEqual(Download(dev_out, cpu.size()), cpu, "clipped decode");
  }
}

TEST(DeviceDenseTest, EncodeMatchesTheCpuCodec) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(21);
  for (const Shape& shape : {Shape{33, 65}, Shape{4096}, Shape{7}, Shape{0}, Shape{}}) {
    const int64_t n = Count(shape);
    std::vector<float> x = Gaussian(n, rng, 100.0f);
    if (n > 3) x[3] = 0.0f;
    for (uint8_t f = 1; f <= 4; ++f) {
      for (bool stochastic : {false, true}) {
        codecs::DenseQuantOptions o;
        o.format = static_cast<codecs::DenseFormat>(f);
        o.block = 48;
        o.stochastic = stochastic;
        o.seed = 99;
        LBCC_ASSERT_OK_AND_ASSIGN(auto codec, codecs::DenseQuantCodec::Create(o));
        LBCC_ASSERT_OK_AND_ASSIGN(TensorView view, TensorView::Host(x.data(), shape));
        std::vector<uint8_t> cpu(*codec->MaxEncodedBytes(shape)), dev(cpu.size());
        LBCC_ASSERT_OK_AND_ASSIGN(size_t a, codec->Encode(view, nullptr, absl::MakeSpan(cpu)));
        LBCC_ASSERT_OK_AND_ASSIGN(size_t b, internal::EncodeWith(Emu(), *codec, F(Upload(x)), shape,
                                                                 nullptr, absl::MakeSpan(dev),
                                                                 nullptr, nullptr));
        ASSERT_EQ(a, b);
        ASSERT_EQ(dev, cpu) << "format " << int{f} << " stochastic " << stochastic << " n " << n;
      }
    }
  }
}

TEST(DeviceDenseTest, RejectsWhatTheCpuCodecRejectsWithTheSameMessage) {
  LBCC_SKIP_WITHOUT_BACKEND();
  const Shape shape = {100};
  std::vector<float> x(100, 1.0f);
  x[40] = 70000.0f;
  x[77] = std::numeric_limits<float>::infinity();
  for (uint8_t f = 1; f <= 4; ++f) {
    codecs::DenseQuantOptions o;
    o.format = static_cast<codecs::DenseFormat>(f);
    o.block = 16;
    LBCC_ASSERT_OK_AND_ASSIGN(auto codec, codecs::DenseQuantCodec::Create(o));
    LBCC_ASSERT_OK_AND_ASSIGN(TensorView view, TensorView::Host(x.data(), shape));
    std::vector<uint8_t> out(*codec->MaxEncodedBytes(shape));
    const absl::Status cpu = codec->Encode(view, nullptr, absl::MakeSpan(out)).status();
    const absl::Status dev = internal::EncodeWith(Emu(), *codec, F(Upload(x)), shape, nullptr,
                                                  absl::MakeSpan(out), nullptr, nullptr)
                                 .status();
    EXPECT_THAT(dev, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_EQ(dev.message(), cpu.message()) << "format " << int{f};
  }
}

TEST(DeviceCodecTest, WithoutCudaEveryEntryPointIsUnimplemented) {
  if (CudaBackend() != nullptr) GTEST_SKIP() << "built with CUDA";
  EXPECT_FALSE(DeviceCodecsAvailable());
  LBCC_ASSERT_OK_AND_ASSIGN(auto codec, codecs::TopKEfCodec::Create(codecs::TopKEfOptions()));
  EXPECT_THAT(NewDeviceState(*codec, 0), StatusIs(absl::StatusCode::kUnimplemented));
  float x = 0;
  LBCC_ASSERT_OK_AND_ASSIGN(TensorView cuda,
                            TensorView::Create(&x, DType::kF32, {1}, MemoryKind::kCuda, 0));
  std::vector<uint8_t> out(1024);
  EXPECT_THAT(EncodeOnDevice(*codec, cuda, nullptr, absl::MakeSpan(out), nullptr),
              StatusIs(absl::StatusCode::kUnimplemented));
  EXPECT_THAT(DecodeAccumulateOnDevice({out}, {}, cuda, nullptr),
              StatusIs(absl::StatusCode::kUnimplemented));
}

}  // namespace
}  // namespace lbcc::kernels
