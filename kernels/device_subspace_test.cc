// The device subspace codec against codecs::SubspaceCodec: identical envelopes, parameters, ids
// and selectors; coefficients equal up to the products' summation order; each decodes the
// other's payloads. Built twice like device_codec_test: on the emulated backend, and on CUDA
// (LBCC_TEST_ON_GPU, tag gpu; skips without a device).
#include "kernels/device_subspace.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status_matchers.h"
#include "codecs/payload.h"
#include "codecs/subspace_basis.h"
#include "codecs/subspace_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/device_codec.h"

namespace lbcc::kernels {
namespace {

Backend* TestBackend() {
#ifdef LBCC_TEST_ON_GPU
  return DeviceCodecsAvailable() ? CudaBackend() : nullptr;
#else
  return &EmulatedBackend();
#endif
}

#define LBCC_SKIP_WITHOUT_BACKEND() \
  if (TestBackend() == nullptr) GTEST_SKIP() << "no CUDA device (or built without CUDA)"

// A [rows, cols] f32 tensor on the backend under test, holding `host`.
struct Tensor {
  DeviceBuffer buffer;
  TensorView view;
};
Tensor Upload(const std::vector<float>& host, int64_t rows, int64_t cols) {
  Tensor t;
  t.buffer = *DeviceBuffer::Allocate(*TestBackend(), std::max<size_t>(4, 4 * host.size()), 0);
  LBCC_CHECK(t.buffer.CopyFromHost({reinterpret_cast<const uint8_t*>(host.data()), 4 * host.size()}).ok());
  t.view = *t.buffer.View({rows, cols});
  return t;
}
std::vector<float> Download(const Tensor& t) {
  std::vector<float> host(static_cast<size_t>(t.view.num_elements()));
  LBCC_CHECK(t.buffer.CopyToHost({reinterpret_cast<uint8_t*>(host.data()), 4 * host.size()}).ok());
  return host;
}

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

std::shared_ptr<const codecs::SubspaceBasis> MakeBasis(int64_t d, int64_t k, int64_t m, int64_t v,
                                                       bool table, uint64_t seed = 5) {
  codecs::SubspaceSeedSpec spec;
  spec.model_dim = d;
  spec.rank = k;
  spec.components = m;
  spec.vocab_size = v;
  spec.with_table = table;
  spec.table_stddev = 0.5;
  spec.seed = seed;
  spec.version = 1;
  return *codecs::SubspaceBasis::FromSeed(spec);
}

// Activations in span: h = T[y] + U_m c with the component m of each mixture block chosen by
// the test (so the encoder's choice is clear-cut).
std::vector<float> Activations(const codecs::SubspaceBasis& b, const std::vector<int32_t>& ids,
                               int64_t block, std::mt19937& rng) {
  const int64_t tokens = static_cast<int64_t>(ids.size()), d = b.model_dim(), k = b.rank();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> h(static_cast<size_t>(tokens * d), 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t m = (t / block) % b.components();
    for (int64_t j = 0; j < k; ++j) {
      const float c = normal(rng);
      for (int64_t i = 0; i < d; ++i) h[t * d + i] += b.u()[i * b.ld() + m * k + j] * c;
    }
    if (b.has_table()) {
      for (int64_t i = 0; i < d; ++i) h[t * d + i] += b.table()[ids[t] * d + i];
    }
  }
  return h;
}

float Tolerance(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 1e-4f;
    case DType::kF16:
      return 4e-3f;
    case DType::kBF16:
      return 3e-2f;
    default:
      return 4e-2f;
  }
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The envelope and params of two payloads agree; returns the body offset.
void ExpectSameHeader(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  ASSERT_EQ(a.size(), b.size());
  auto ia = codecs::ParsePayload(a);
  auto ib = codecs::ParsePayload(b);
  ASSERT_THAT(ia.status(), IsOk());
  ASSERT_THAT(ib.status(), IsOk());
  const size_t body_at = static_cast<size_t>(ia->body.data() - a.data());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), body_at));
}

struct Case {
  int64_t m;
  int64_t v;
  bool table;
  DType dtype;
};

TEST(DeviceSubspaceTest, ForwardAndBackwardMatchTheCpuCodec) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(3);
  const int64_t d = 96, k = 16, tokens = 50, block = 8;
  for (const Case& c : {Case{1, 300, true, DType::kF32}, Case{1, 300, true, DType::kBF16},
                        Case{1, 0, false, DType::kF16}, Case{3, 70000, true, DType::kI8},
                        Case{3, 300, false, DType::kF32}, Case{2, 0, false, DType::kBF16}}) {
    const std::string what = absl::StrCat("M ", c.m, " V ", c.v, " dtype ", DTypeName(c.dtype));
    auto basis = MakeBasis(d, k, c.m, c.v, c.table);
    codecs::SubspaceCodecOptions options;
    options.coefficient_dtype = c.dtype;
    options.mixture_block = block;
    options.int8_block = 5;
    auto cpu = *codecs::SubspaceCodec::Create(basis, options);
    LBCC_ASSERT_OK_AND_ASSIGN(auto dev,
                              DeviceSubspaceCodec::Create(*TestBackend(), basis, options, 0));
    std::vector<int32_t> ids;
    if (c.v > 0) {
      for (int64_t t = 0; t < tokens; ++t) ids.push_back(static_cast<int32_t>(rng() % c.v));
    }
    std::vector<float> h = Activations(*basis, ids.empty() ? std::vector<int32_t>(tokens, 0) : ids,
                                       block, rng);
    TensorView hv = *TensorView::Host(h.data(), {tokens, d});
    const Tensor h_dev = Upload(h, tokens, d);
    // Forward.
    codecs::SubspaceSelectors cpu_sel, dev_sel;
    LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> a, cpu.EncodeForward(hv, ids, &cpu_sel));
    std::vector<uint8_t> b(dev->ForwardPayloadBytes(tokens));
    LBCC_ASSERT_OK_AND_ASSIGN(size_t size,
                              dev->EncodeForward(h_dev.view, ids, absl::MakeSpan(b), &dev_sel));
    b.resize(size);
    ExpectSameHeader(a, b);
    EXPECT_EQ(dev_sel.values, cpu_sel.values) << what;
    EXPECT_EQ(dev_sel.mixture_block, cpu_sel.mixture_block) << what;
    std::vector<float> from_cpu(h.size()), from_dev(h.size()), dev_decoded(h.size());
    ASSERT_THAT(cpu.DecodeForward(a, *TensorView::Host(from_cpu.data(), {tokens, d})), IsOk());
    ASSERT_THAT(cpu.DecodeForward(b, *TensorView::Host(from_dev.data(), {tokens, d})), IsOk());
    std::vector<int32_t> ids_out(ids.size());
    codecs::SubspaceSelectors decoded_sel;
    Tensor decoded = Upload(dev_decoded, tokens, d);
    ASSERT_THAT(dev->DecodeForward(a, decoded.view, absl::MakeSpan(ids_out), &decoded_sel),
                IsOk());
    dev_decoded = Download(decoded);
    EXPECT_EQ(ids_out, ids);
    EXPECT_EQ(decoded_sel.values, cpu_sel.values);
    EXPECT_LE(MaxAbsDiff(from_dev, from_cpu), Tolerance(c.dtype)) << what;
    EXPECT_LE(MaxAbsDiff(dev_decoded, from_cpu), 1e-4f) << what;
    // Backward with the forward's selectors.
    std::vector<float> g = Activations(*basis, std::vector<int32_t>(tokens, 0), block, rng);
    TensorView gv = *TensorView::Host(g.data(), {tokens, d});
    const Tensor g_in = Upload(g, tokens, d);
    LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> ga, cpu.EncodeBackward(gv, cpu_sel));
    std::vector<uint8_t> gb(ga.size());
    LBCC_ASSERT_OK_AND_ASSIGN(size_t gsize,
                              dev->EncodeBackward(g_in.view, cpu_sel, absl::MakeSpan(gb)));
    gb.resize(gsize);
    ExpectSameHeader(ga, gb);
    std::vector<float> g_cpu(g.size()), g_dev(g.size());
    ASSERT_THAT(cpu.DecodeBackward(ga, *TensorView::Host(g_cpu.data(), {tokens, d})), IsOk());
    Tensor g_out = Upload(g_dev, tokens, d);
    ASSERT_THAT(dev->DecodeBackward(gb, g_out.view), IsOk());
    g_dev = Download(g_out);
    EXPECT_LE(MaxAbsDiff(g_dev, g_cpu), Tolerance(c.dtype)) << what;
  }
}

TEST(DeviceSubspaceTest, RejectsWhatTheCpuCodecRejects) {
  LBCC_SKIP_WITHOUT_BACKEND();
  const int64_t d = 32, k = 8, tokens = 4;
  auto basis = MakeBasis(d, k, 1, 10, true);
  auto other = MakeBasis(d, k, 1, 10, true, 99);
  LBCC_ASSERT_OK_AND_ASSIGN(auto dev, DeviceSubspaceCodec::Create(*TestBackend(), basis, {}, 0));
  auto cpu_other = *codecs::SubspaceCodec::Create(other, {});
  std::vector<float> h(tokens * d, 0.5f);
  std::vector<int32_t> ids = {1, 2, 3, 4};
  const Tensor h_dev = Upload(h, tokens, d);
  const Tensor out = Upload(std::vector<float>(tokens * d, 7.0f), tokens, d);
  const TensorView& hv = h_dev.view;
  const TensorView& ov = out.view;
  std::vector<uint8_t> payload(dev->ForwardPayloadBytes(tokens));
  EXPECT_THAT(dev->EncodeForward(hv, {1, 2, 3, 10}, absl::MakeSpan(payload)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
  std::vector<uint8_t> small(10);
  EXPECT_THAT(dev->EncodeForward(hv, ids, absl::MakeSpan(small)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> foreign,
                            cpu_other.EncodeForward(*TensorView::Host(h.data(), {tokens, d}), ids));
  EXPECT_THAT(dev->DecodeForward(foreign, ov), StatusIs(absl::StatusCode::kFailedPrecondition));
  LBCC_ASSERT_OK_AND_ASSIGN(size_t size, dev->EncodeForward(hv, ids, absl::MakeSpan(payload)));
  payload.resize(size);
  EXPECT_THAT(dev->DecodeBackward(payload, ov), StatusIs(absl::StatusCode::kDataLoss));
  payload[payload.size() / 2] ^= 1;
  EXPECT_THAT(dev->DecodeForward(payload, ov), StatusIs(absl::StatusCode::kDataLoss));
  for (float x : Download(out)) ASSERT_EQ(x, 7.0f);
  const Tensor wrong = Upload(std::vector<float>(tokens * d), tokens * 2, d / 2);
  EXPECT_THAT(dev->EncodeForward(wrong.view, ids, absl::MakeSpan(payload)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Memory of the wrong kind.
  EXPECT_THAT(dev->EncodeForward(*TensorView::Create(h.data(), DType::kF32, {tokens, d},
                                                     TestBackend()->is_device() ? MemoryKind::kHost
                                                                                : MemoryKind::kCuda,
                                                     0),
                                 ids, absl::MakeSpan(payload))
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(DeviceSubspaceTest, WithoutCudaCreateIsUnimplemented) {
  if (CudaBackend() != nullptr) GTEST_SKIP() << "built with CUDA";
  EXPECT_THAT(DeviceSubspaceCodec::Create(MakeBasis(16, 4, 1, 0, false), {}, 0).status(),
              StatusIs(absl::StatusCode::kUnimplemented));
}

}  // namespace
}  // namespace lbcc::kernels
