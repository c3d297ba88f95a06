#include "codecs/topk_ef.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/cpu.h"
#include "base/dtype.h"
#include "base/status_matchers.h"
#include "codecs/codec.h"
#include "codecs/dense_quant.h"
#include "codecs/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::codecs {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

using Bytes = std::vector<uint8_t>;

// ---------------------------------------------------------------------------------------------
// An independent model of SparseLoCo's compressor, written from the reference description
// (../shared/reference/sparseloco.md) and the operation order documented in topk_ef.h and
// value_coding.h: plain loops, sorting for the selection, no SIMD.

int64_t BruteEdge(int64_t n) {
  int64_t best = 1;
  for (int64_t d = 1; d <= std::min<int64_t>(n, 64); ++d) {
    if (n % d == 0) best = d;
  }
  return best;
}

struct RefOut {
  int64_t k = 0;
  std::vector<int64_t> pos;  // global positions, chunk after chunk, ascending within a chunk
  std::vector<float> value;  // e' at pos
  std::vector<float> v_hat;  // reconstruction at pos
  std::vector<float> e_new;
};

struct RefOptions {
  double top_k = 64;
  float beta = 0.95f, lr = 1.0f;
  int bits = 2;  // bin-mean bits; 0: fp32 values
  float range = 6.0f;
};

RefOut Reference(const std::vector<int64_t>& shape, const std::vector<float>& e,
                 const std::vector<float>& d, const RefOptions& o) {
  RefOut r;
  const int64_t n = static_cast<int64_t>(e.size());
  std::vector<float> ep(e.size());
  for (int64_t i = 0; i < n; ++i) {
    const float u = o.beta * e[i];
    const float v = o.lr * d[i];
    ep[i] = u + v;
  }
  int64_t rows = 1, cols = 1;
  if (!shape.empty()) {
    cols = shape.back();
    for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  }
  r.e_new = ep;
  if (n == 0) return r;
  const int64_t h = BruteEdge(rows), w = BruteEdge(cols), len = h * w;
  r.k = std::clamp<int64_t>(
      std::max<int64_t>(1, static_cast<int64_t>(std::nearbyint(len * o.top_k / 4096.0))), 1, len);
  for (int64_t y = 0; y < rows / h; ++y) {
    for (int64_t x = 0; x < cols / w; ++x) {
      std::vector<int64_t> local(len);
      std::iota(local.begin(), local.end(), 0);
      auto at = [&](int64_t l) { return (y * h + l / w) * cols + x * w + l % w; };
      std::stable_sort(local.begin(), local.end(), [&](int64_t a, int64_t b) {
        return std::fabs(ep[at(a)]) > std::fabs(ep[at(b)]);
      });
      local.resize(r.k);
      std::sort(local.begin(), local.end());
      for (int64_t l : local) {
        r.pos.push_back(at(l));
        r.value.push_back(ep[at(l)]);
      }
    }
  }
  const std::vector<float>& v = r.value;
  const int64_t m = static_cast<int64_t>(v.size());
  if (o.bits == 0) {
    r.v_hat = v;
  } else {
    const int bins = 1 << o.bits;
    double lanes[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < m; ++i) lanes[i % 4] += v[i];
    const float shift = static_cast<float>(((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) / m);
    std::vector<float> c(m);
    double sq[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < m; ++i) {
      c[i] = v[i] - shift;
      sq[i % 4] += static_cast<double>(c[i]) * c[i];
    }
    const float norm = static_cast<float>(std::sqrt((sq[0] + sq[1]) + (sq[2] + sq[3])));
    const float sigma = m > 1 ? norm / static_cast<float>(std::sqrt(double(m - 1))) : 0.0f;
    float scale = (o.range * sigma) / static_cast<float>(bins);
    if (scale == 0 || !std::isfinite(scale)) scale = 1;
    std::vector<int> q(m);
    std::vector<double> sums(bins, 0);
    std::vector<int64_t> counts(bins, 0);
    for (int64_t i = 0; i < m; ++i) {
      const float t = (c[i] / scale) + static_cast<float>(bins / 2);
      q[i] = static_cast<int>(std::min(std::max(std::nearbyint(t), 0.0f), float(bins - 1)));
      sums[q[i]] += c[i];
      ++counts[q[i]];
    }
    for (int64_t i = 0; i < m; ++i) {
      const float lookup = static_cast<float>(sums[q[i]] / counts[q[i]]);
      r.v_hat.push_back(lookup + shift);
    }
  }
  for (int64_t i = 0; i < m; ++i) r.e_new[r.pos[i]] = ep[r.pos[i]] - r.v_hat[i];
  return r;
}

// ---------------------------------------------------------------------------------------------

struct Sparse {
  std::vector<int64_t> pos;
  std::vector<float> value;
  IndexCoding indices;
};

Sparse DecodeSparse(const Bytes& payload) {
  Sparse s;
  absl::StatusOr<PayloadInfo> info = ParsePayload(payload);
  EXPECT_THAT(info, IsOk());
  absl::StatusOr<TopKEfHeader> h = ParseTopKEfHeader(*info);
  EXPECT_THAT(h, IsOk());
  std::vector<uint16_t> local(h->layout.count());
  if (h->indices == IndexCoding::kAdaptive) {
    EXPECT_THAT(DecodeAdaptive(h->index_section, h->layout, h->adaptive, absl::MakeSpan(local)),
                IsOk());
  } else {
    EXPECT_THAT(DecodePacked12(h->index_section, h->layout, absl::MakeSpan(local)), IsOk());
  }
  ValueDecoder values;
  EXPECT_THAT(values.Init(h->values, h->value_params, h->value_section, h->layout.count()), IsOk());
  s.value.resize(local.size());
  if (!local.empty()) values.Decode(0, static_cast<int64_t>(local.size()), s.value.data());
  for (size_t t = 0; t < local.size(); ++t) {
    s.pos.push_back(h->geometry.Offset(static_cast<int64_t>(t) / h->layout.k, local[t]));
  }
  s.indices = h->indices;
  return s;
}

std::vector<float> Normals(int64_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Small integers: ties everywhere.
std::vector<float> Ties(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-3, 3);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(dist(rng));
  return v;
}

int64_t Count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::unique_ptr<TopKEfCodec> MakeCodec(const TopKEfOptions& options) {
  absl::StatusOr<std::unique_ptr<TopKEfCodec>> codec = TopKEfCodec::Create(options);
  EXPECT_THAT(codec, IsOk());
  return *std::move(codec);
}

Bytes Encode(const TopKEfCodec& codec, TopKEfState& state, std::vector<float>& delta,
             const std::vector<int64_t>& shape) {
  Bytes out(*codec.MaxEncodedBytes(shape));
  absl::StatusOr<TensorView> view =
      TensorView::Host(delta.data(), Shape(shape.begin(), shape.end()));
  EXPECT_THAT(view, IsOk());
  absl::StatusOr<size_t> size = codec.Encode(*view, &state, absl::MakeSpan(out));
  EXPECT_THAT(size, IsOk());
  out.resize(size.ok() ? *size : 0);
  return out;
}

// Recomputes the checksum after a deliberate edit, so the codec's own checks are what rejects.
void Reseal(Bytes& bytes) {
  const uint64_t sum = XXH3_64bits(bytes.data(), bytes.size() - 8);
  std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
}

class SimdTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (GetParam() == SimdLevel::kAvx2 && !CpuHasAvx2Fma()) GTEST_SKIP() << "no AVX2 on this CPU";
    SetSimdLevelForTesting(GetParam());
  }
  void TearDown() override { SetSimdLevelForTesting(SimdLevel::kScalar); }
};

const std::vector<std::vector<int64_t>>& Shapes() {
  static const auto* shapes = new std::vector<std::vector<int64_t>>{
      {64, 64}, {128, 192}, {61, 61},     {100, 130}, {67, 5},   {4096},   {1000}, {7},
      {},       {3, 5, 7},  {2, 64, 128}, {97, 200},  {1, 4096}, {257, 3}, {1, 1}, {0, 8},
  };
  return *shapes;
}

// The codec's payloads and error-feedback state equal the reference bit for bit over several
// rounds, for many shapes (prime, odd, 1-D, rank 0 and 3), tie-heavy data and two value codings.
TEST_P(SimdTest, MatchesTheReferenceCompressorBitForBit) {
  for (const std::vector<int64_t>& shape : Shapes()) {
    for (int bits : {2, 0}) {
      for (bool ties : {false, true}) {
        TopKEfOptions options;
        options.values = bits == 2 ? ValueCoding::kBinMean2 : ValueCoding::kF32;
        options.top_k = ties ? 300 : 64;
        RefOptions ref_options{options.top_k, options.beta, options.lr, bits, 6.0f};
        auto codec = MakeCodec(options);
        TopKEfState state;
        const int64_t n = Count(shape);
        std::vector<float> e(n, 0.0f);
        for (int round = 0; round < 3; ++round) {
          std::vector<float> delta = ties ? Ties(n, 7 + round) : Normals(n, 11 + round);
          const RefOut ref = Reference(shape, e, delta, ref_options);
          const Bytes payload = Encode(*codec, state, delta, shape);
          const Sparse got = DecodeSparse(payload);
          ASSERT_EQ(got.pos, ref.pos) << ShapeToString(shape) << " round " << round;
          ASSERT_EQ(got.value.size(), ref.v_hat.size());
          for (size_t i = 0; i < got.value.size(); ++i) {
            ASSERT_EQ(FloatBits(got.value[i]), FloatBits(ref.v_hat[i])) << i;
          }
          const absl::Span<const float> pending = state.pending_error();
          ASSERT_EQ(pending.size(), ref.e_new.size());
          for (size_t i = 0; i < pending.size(); ++i) {
            ASSERT_EQ(FloatBits(pending[i]), FloatBits(ref.e_new[i])) << i;
          }
          ASSERT_THAT(state.Commit(), IsOk());
          e = ref.e_new;
        }
      }
    }
  }
}

// beta * e_old + lr * delta == e_new + reconstruction, exactly in the documented fp32 order:
// e_new = fl(fl(fl(beta * e_old) + fl(lr * delta)) - v_hat) where selected, e' elsewhere; and
// adding v_hat back recovers e' to within half an ulp of e'.
TEST_P(SimdTest, ErrorFeedbackIdentityIsExact) {
  const std::vector<int64_t> shape = {192, 320};
  TopKEfOptions options;
  options.beta = 0.9f;
  options.lr = 0.7f;
  auto codec = MakeCodec(options);
  TopKEfState state;
  ASSERT_THAT(state.Load(shape, Normals(Count(shape), 3, 2.0f)), IsOk());
  std::vector<float> delta = Normals(Count(shape), 4);
  const std::vector<float> e_old(state.error().begin(), state.error().end());
  const Bytes payload = Encode(*codec, state, delta, shape);
  const Sparse sparse = DecodeSparse(payload);
  std::vector<float> recon(e_old.size(), 0.0f);
  std::vector<bool> selected(e_old.size(), false);
  for (size_t i = 0; i < sparse.pos.size(); ++i) {
    recon[sparse.pos[i]] = sparse.value[i];
    selected[sparse.pos[i]] = true;
  }
  const absl::Span<const float> e_new = state.pending_error();
  for (size_t i = 0; i < e_old.size(); ++i) {
    const float u = options.beta * e_old[i];
    const float v = options.lr * delta[i];
    const float e_prime = u + v;
    const float expected = selected[i] ? e_prime - recon[i] : e_prime;
    ASSERT_EQ(FloatBits(e_new[i]), FloatBits(expected)) << i;
    const double residual = (static_cast<double>(e_new[i]) + recon[i]) - e_prime;
    ASSERT_LE(std::fabs(residual),
              0.5 * std::fabs(std::nextafter(e_prime, INFINITY) - e_prime) + 1e-45)
        << i;
  }
}

// A brute-force aggregation of 8 replicas (mixed index codings) for every rule, overwriting and
// accumulating. The output is 32-byte aligned for the sum and 16-byte (not 32) for the others,
// so 512 x 640 (over 1 MiB) also takes both non-temporal store paths of a large overwritten
// output, and 384 x 5760 (over 8 MiB: 90 chunks per block row, one full strip of 64 and one of
// 26) the staged strips of a large accumulated one. The accumulated output holds -0 and NaN
// here and there, which untouched positions must keep bit for bit.
TEST_P(SimdTest, AggregationOfEightReplicasEqualsBruteForce) {
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {128, 192}, {100, 130}, {1000}, {512, 640}, {384, 5760}}) {
    const int64_t n = Count(shape);
    std::vector<Bytes> payloads;
    for (int r = 0; r < 8; ++r) {
      TopKEfOptions options;
      options.indices = r % 2 ? IndexCoding::kAdaptive : IndexCoding::kPacked12;
      options.values = r == 5 ? ValueCoding::kBf16 : ValueCoding::kBinMean2;
      options.top_k = r == 3 ? 128 : 64;  // replicas may even differ in k
      auto codec = MakeCodec(options);
      TopKEfState state;
      // Replicas share part of their signal, so selections overlap.
      std::vector<float> delta = Normals(n, 100 + r);
      const std::vector<float> common = Normals(n, 99);
      for (int64_t i = 0; i < n; ++i) delta[i] += 1.5f * common[i];
      payloads.push_back(Encode(*codec, state, delta, shape));
    }
    std::vector<absl::Span<const uint8_t>> spans(payloads.begin(), payloads.end());
    std::vector<Sparse> sparse;
    for (const Bytes& p : payloads) sparse.push_back(DecodeSparse(p));
    DecodeScratch scratch;
    for (Aggregation rule : {Aggregation::kSparseLoCoMean, Aggregation::kMean, Aggregation::kSum}) {
      for (bool accumulate : {false, true}) {
        std::vector<float> before = Normals(n, 5);
        for (int64_t i = 0; i < n; i += 97) before[i] = -0.0f;
        for (int64_t i = 50; i < n; i += 1001) before[i] = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> storage(static_cast<size_t>(n) + 12);
        void* space = storage.data();
        size_t room = storage.size() * sizeof(float);
        float* out = static_cast<float*>(std::align(32, (n + 4) * sizeof(float), space, room));
        ASSERT_NE(out, nullptr);
        if (rule != Aggregation::kSum) out += 4;
        std::copy(before.begin(), before.end(), out);
        ASSERT_THAT(DecodeAccumulate(
                        spans, {rule, accumulate},
                        *TensorView::Host(out, Shape(shape.begin(), shape.end())), &scratch),
                    IsOk());
        std::vector<float> sum(n, 0.0f);
        std::vector<int> count(n, 0);
        for (const Sparse& s : sparse) {
          for (size_t i = 0; i < s.pos.size(); ++i) {
            const int64_t p = s.pos[i];
            sum[p] = count[p] == 0 ? s.value[i] : sum[p] + s.value[i];
            ++count[p];
          }
        }
        int64_t overlapping = 0;
        for (int64_t i = 0; i < n; ++i) {
          float expected = accumulate ? before[i] : 0.0f;
          if (count[i] > 0) {
            overlapping += count[i] > 1;
            float agg = sum[i];
            if (rule == Aggregation::kSparseLoCoMean) agg = agg / static_cast<float>(count[i]);
            if (rule == Aggregation::kMean) agg = agg / 8.0f;
            expected = accumulate ? before[i] + agg : agg;
          }
          ASSERT_EQ(FloatBits(out[i]), FloatBits(expected))
              << AggregationName(rule) << " " << accumulate << " at " << i;
        }
        EXPECT_GT(overlapping, 0);
      }
    }
  }
}

// Scalar and AVX2 produce the same payload bytes and the same state.
TEST(TopKEfSimdTest, Avx2AndScalarPayloadsAreIdentical) {
  if (!CpuHasAvx2Fma()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (const std::vector<int64_t>& shape : Shapes()) {
    for (ValueCoding values :
         {ValueCoding::kBinMean2, ValueCoding::kBinMean8, ValueCoding::kAbsmax4}) {
      TopKEfOptions options;
      options.values = values;
      auto codec = MakeCodec(options);
      TopKEfState scalar, avx2;
      for (int round = 0; round < 3; ++round) {
        std::vector<float> delta =
            round == 1 ? Ties(Count(shape), 3) : Normals(Count(shape), 9 + round);
        SetSimdLevelForTesting(SimdLevel::kScalar);
        const Bytes a = Encode(*codec, scalar, delta, shape);
        SetSimdLevelForTesting(SimdLevel::kAvx2);
        const Bytes b = Encode(*codec, avx2, delta, shape);
        SetSimdLevelForTesting(SimdLevel::kScalar);
        ASSERT_EQ(a, b) << ShapeToString(shape);
        ASSERT_TRUE(std::equal(scalar.pending_error().begin(), scalar.pending_error().end(),
                               avx2.pending_error().begin(), avx2.pending_error().end(),
                               [](float x, float y) { return FloatBits(x) == FloatBits(y); }));
        ASSERT_THAT(scalar.Commit(), IsOk());
        ASSERT_THAT(avx2.Commit(), IsOk());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, SimdTest, ::testing::Values(SimdLevel::kScalar, SimdLevel::kAvx2),
                         [](const auto& info) { return std::string(SimdLevelName(info.param)); });

size_t ExpectedValueBytes(const TopKEfOptions& o, int64_t count) {
  return ValueParamBytes(o.values) + ValueSectionBytes(o.values, count, o.value_block);
}

TEST(TopKEfTest, PayloadSizeEqualsTheFormulaPerIndexCoding) {
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{256, 512}, {61, 61}, {100, 130}, {4096}}) {
    for (ValueCoding values : {ValueCoding::kBinMean2, ValueCoding::kF32, ValueCoding::kAbsmax8}) {
      std::vector<float> delta = Normals(Count(shape), 1);
      TopKEfOptions options;
      options.values = values;
      size_t sizes[3];
      for (IndexCoding indices :
           {IndexCoding::kPacked12, IndexCoding::kAdaptive, IndexCoding::kAuto}) {
        options.indices = indices;
        auto codec = MakeCodec(options);
        TopKEfState state;
        const Bytes payload = Encode(*codec, state, delta, shape);
        const Sparse sparse = DecodeSparse(payload);
        const int64_t count = static_cast<int64_t>(sparse.pos.size());
        LBCC_ASSERT_OK_AND_ASSIGN(PayloadInfo info, ParsePayload(payload));
        LBCC_ASSERT_OK_AND_ASSIGN(TopKEfHeader h, ParseTopKEfHeader(info));
        size_t index_bytes = Packed12Bytes(count);
        if (h.indices == IndexCoding::kAdaptive) {
          std::vector<uint16_t> local(count);
          ASSERT_THAT(DecodeAdaptive(h.index_section, h.layout, h.adaptive, absl::MakeSpan(local)),
                      IsOk());
          index_bytes = (AdaptiveBits(local, h.layout, h.adaptive) + 7) / 8;
          EXPECT_EQ(h.adaptive.rice, AdaptiveRice(h.layout, h.adaptive.sub_block_log2));
        }
        const size_t expected = PayloadBytes(
            shape.size(), 16 + ValueParamBytes(values),
            index_bytes + ExpectedValueBytes(options, count) - ValueParamBytes(values));
        EXPECT_EQ(payload.size(), expected) << IndexCodingName(indices);
        EXPECT_LE(payload.size(), *codec->MaxEncodedBytes(shape));
        sizes[static_cast<int>(indices)] = payload.size();
        if (indices != IndexCoding::kAuto) EXPECT_EQ(h.indices, indices);
      }
      EXPECT_EQ(sizes[0], std::min(sizes[1], sizes[2]));  // auto is the smaller
    }
  }
}

// SparseLoCo's production setting on i.i.d. data (uniformly random positions): 12-bit indices
// and 2-bit values cost 0.21875 bits per parameter plus the header; adaptive stays below 0.17.
TEST(TopKEfTest, BitsPerParameterAtTopK64) {
  const std::vector<int64_t> shape = {1024, 1024};
  std::vector<float> delta = Normals(Count(shape), 2);
  for (IndexCoding indices : {IndexCoding::kPacked12, IndexCoding::kAdaptive}) {
    TopKEfOptions options;
    options.indices = indices;
    auto codec = MakeCodec(options);
    TopKEfState state;
    const Bytes payload = Encode(*codec, state, delta, shape);
    const double bits = 8.0 * payload.size() / Count(shape);
    const double header = 8.0 * PayloadBytes(2, 16 + 20, 0) / Count(shape);
    if (indices == IndexCoding::kPacked12) {
      EXPECT_DOUBLE_EQ(bits, 0.21875 + header);
    } else {
      EXPECT_LT(bits, 0.17);
    }
  }
}

TEST(TopKEfTest, RandomizedRoundTripsThroughDecodeAccumulate) {
  std::mt19937 rng(2024);
  const std::vector<ValueCoding> codings = {
      ValueCoding::kF32,      ValueCoding::kBf16,     ValueCoding::kF16,     ValueCoding::kBinMean2,
      ValueCoding::kBinMean4, ValueCoding::kBinMean8, ValueCoding::kAbsmax8, ValueCoding::kAbsmax4};
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<int64_t> shape;
    const int rank = static_cast<int>(rng() % 4);
    for (int i = 0; i < rank; ++i) shape.push_back(1 + static_cast<int64_t>(rng() % 150));
    TopKEfOptions options;
    const double top_ks[] = {1, 7.5, 64, 300, 4096};
    options.top_k = top_ks[rng() % 5];
    options.values = codings[rng() % codings.size()];
    options.indices = static_cast<IndexCoding>(rng() % 3);
    options.beta = 0.5f + 0.5f * static_cast<float>(rng() % 100) / 100;
    options.lr = 0.1f + static_cast<float>(rng() % 100) / 50;
    options.value_block = 1 + static_cast<int64_t>(rng() % 100);
    auto codec = MakeCodec(options);
    TopKEfState state;
    const int64_t n = Count(shape);
    for (int round = 0; round < 2; ++round) {
      std::vector<float> delta = Normals(n, trial * 10 + round, 0.01f + trial);
      std::vector<float> e_old;
      if (state.initialized()) e_old.assign(state.error().begin(), state.error().end());
      const Bytes payload = Encode(*codec, state, delta, shape);
      const Sparse sparse = DecodeSparse(payload);
      std::vector<float> out(n, 123.0f);
      const absl::Span<const uint8_t> span(payload);
      ASSERT_THAT(
          DecodeAccumulate(absl::MakeConstSpan(&span, 1), {Aggregation::kSum, false},
                           *TensorView::Host(out.data(), Shape(shape.begin(), shape.end()))),
          IsOk());
      std::vector<float> expected(n, 0.0f);
      for (size_t i = 0; i < sparse.pos.size(); ++i) expected[sparse.pos[i]] = sparse.value[i];
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(FloatBits(out[i]), FloatBits(expected[i])) << i;
      // Mass is conserved up to one rounding per element: e_new + v_hat ~= beta e + lr delta.
      for (int64_t i = 0; i < n; ++i) {
        const float e0 = e_old.empty() ? 0.0f : e_old[i];
        const float e_prime = (options.beta * e0) + (options.lr * delta[i]);
        ASSERT_NEAR(state.pending_error()[i] + expected[i], e_prime,
                    1e-6f * (1 + std::fabs(e_prime) + std::fabs(expected[i])));
      }
      if (options.values == ValueCoding::kF32) {
        for (int64_t p : sparse.pos) ASSERT_EQ(state.pending_error()[p], 0.0f);
      }
      ASSERT_THAT(state.Commit(), IsOk());
    }
  }
}

TEST(TopKEfTest, TwoPhaseUpdateLosesNoMassOnAbort) {
  const std::vector<int64_t> shape = {128, 128};
  auto codec = MakeCodec(TopKEfOptions());
  TopKEfState state;
  std::vector<float> d1 = Normals(Count(shape), 1), d2 = Normals(Count(shape), 2);
  const Bytes p1 = Encode(*codec, state, d1, shape);
  ASSERT_TRUE(state.has_pending());
  // A second Encode before Commit/Abort is refused and changes nothing.
  Bytes out(*codec->MaxEncodedBytes(shape));
  EXPECT_THAT(codec->Encode(*TensorView::Host(d2.data(), {128, 128}), &state, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  const std::vector<float> pending1(state.pending_error().begin(), state.pending_error().end());
  ASSERT_THAT(state.Commit(), IsOk());
  EXPECT_TRUE(std::equal(pending1.begin(), pending1.end(), state.error().begin()));
  const std::vector<float> committed(state.error().begin(), state.error().end());

  // Round 2 fails on the network: Abort restores exactly the committed state.
  const Bytes p2 = Encode(*codec, state, d2, shape);
  ASSERT_THAT(state.Abort(), IsOk());
  EXPECT_FALSE(state.has_pending());
  EXPECT_TRUE(state.pending_error().empty());
  EXPECT_TRUE(std::equal(committed.begin(), committed.end(), state.error().begin()));
  // Retrying the same round gives the same payload and, once committed, the state a successful
  // first attempt would have produced.
  const Bytes retry = Encode(*codec, state, d2, shape);
  EXPECT_EQ(retry, p2);
  ASSERT_THAT(state.Commit(), IsOk());
  TopKEfState twin;
  Encode(*codec, twin, d1, shape);
  ASSERT_THAT(twin.Commit(), IsOk());
  Encode(*codec, twin, d2, shape);
  ASSERT_THAT(twin.Commit(), IsOk());
  EXPECT_TRUE(std::equal(twin.error().begin(), twin.error().end(), state.error().begin()));

  EXPECT_THAT(state.Commit(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(state.Abort(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(TopKEfTest, NonFiniteInputIsRejectedAndTheStateUntouched) {
  const std::vector<int64_t> shape = {64, 96};
  auto codec = MakeCodec(TopKEfOptions());
  TopKEfState state;
  ASSERT_THAT(state.Load(shape, Normals(Count(shape), 1)), IsOk());
  const std::vector<float> before(state.error().begin(), state.error().end());
  Bytes out(*codec->MaxEncodedBytes(shape));
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(), 3.4e38f};
  for (float bad : bad_values) {
    for (int64_t where : {int64_t{0}, int64_t{777}, Count(shape) - 1}) {
      std::vector<float> delta = Normals(Count(shape), 2);
      delta[where] = bad;
      if (bad == 3.4e38f) {
        // Finite, but e' = 0.95 * e + delta overflows when e is also huge.
        std::vector<float> e = before;
        e[where] = 3.4e38f;
        ASSERT_THAT(state.Load(shape, e), IsOk());
      }
      const std::vector<float> state_before(state.error().begin(), state.error().end());
      EXPECT_THAT(
          codec->Encode(*TensorView::Host(delta.data(), {64, 96}), &state, absl::MakeSpan(out)),
          StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NaN or infinite")))
          << bad << " at " << where;
      EXPECT_FALSE(state.has_pending());
      EXPECT_TRUE(std::equal(state_before.begin(), state_before.end(), state.error().begin()));
      if (bad == 3.4e38f) ASSERT_THAT(state.Load(shape, before), IsOk());
    }
  }
  std::vector<float> with_nan = before;
  with_nan[5] = NAN;
  EXPECT_THAT(state.Load(shape, with_nan), StatusIs(absl::StatusCode::kInvalidArgument));
}

// Records what a streamed encode reports.
class RecordingObserver : public EncodeObserver {
 public:
  void Append(absl::Span<const uint8_t> bytes) override {
    appended.insert(appended.end(), bytes.begin(), bytes.end());
    ++appends;
  }
  void Discard() override {
    appended.clear();
    ++discards;
  }
  Bytes appended;
  int appends = 0;
  int discards = 0;
};

absl::Span<const uint8_t> BodyOf(const Bytes& payload) {
  absl::StatusOr<PayloadInfo> info = ParsePayload(payload);
  EXPECT_THAT(info, IsOk());
  return info.ok() ? info->body : absl::Span<const uint8_t>();
}

// A streamed encode reports the leading bytes of its body while it selects, decodes to the same
// values and leaves the same pending state as Encode() (for packed12 the payloads are equal).
TEST(TopKEfTest, StreamedEncodeReportsTheBodyPrefixAndMatchesEncode) {
  const std::vector<std::vector<int64_t>> shapes = {
      {512, 1024}, {64, 8192}, {61, 4270}, {97, 200}, {5000}, {64, 64}, {3, 5, 7}, {1, 1}, {0, 8}};
  for (const std::vector<int64_t>& shape : shapes) {
    for (IndexCoding indices :
         {IndexCoding::kAuto, IndexCoding::kPacked12, IndexCoding::kAdaptive}) {
      for (double top_k : {64.0, 7.5, 300.0}) {
        TopKEfOptions options;
        options.indices = indices;
        options.top_k = top_k;
        options.values = top_k == 300.0 ? ValueCoding::kBf16 : ValueCoding::kBinMean2;
        auto codec = MakeCodec(options);
        const std::string what = absl::StrCat(ShapeToString(shape), " ",
                                              IndexCodingName(indices), " top_k ", top_k);
        const int64_t n = Count(shape);
        TopKEfState plain, streamed;
        ASSERT_THAT(plain.Load(shape, Normals(n, 7, 0.5f)), IsOk());
        ASSERT_THAT(streamed.Load(shape, Normals(n, 7, 0.5f)), IsOk());
        std::vector<float> delta = Normals(n, 8);
        const Bytes want = Encode(*codec, plain, delta, shape);
        Bytes got(*codec->MaxEncodedBytes(shape));
        RecordingObserver observer;
        absl::StatusOr<size_t> size = codec->EncodeStreamed(
            *TensorView::Host(delta.data(), Shape(shape.begin(), shape.end())), &streamed,
            absl::MakeSpan(got), &observer);
        ASSERT_THAT(size, IsOk()) << what;
        got.resize(*size);
        const absl::Span<const uint8_t> body = BodyOf(got);
        ASSERT_LE(observer.appended.size(), body.size()) << what;
        EXPECT_TRUE(std::equal(observer.appended.begin(), observer.appended.end(), body.begin()))
            << what;
        EXPECT_EQ(observer.discards, 0) << what;
        const Sparse a = DecodeSparse(want), b = DecodeSparse(got);
        EXPECT_EQ(a.pos, b.pos) << what;
        ASSERT_EQ(a.value.size(), b.value.size()) << what;
        for (size_t i = 0; i < a.value.size(); ++i) {
          ASSERT_EQ(FloatBits(a.value[i]), FloatBits(b.value[i])) << what << " " << i;
        }
        ASSERT_TRUE(std::equal(plain.pending_error().begin(), plain.pending_error().end(),
                               streamed.pending_error().begin(), streamed.pending_error().end(),
                               [](float x, float y) { return FloatBits(x) == FloatBits(y); }))
            << what;
        if (a.indices == IndexCoding::kPacked12 && b.indices == IndexCoding::kPacked12) {
          EXPECT_EQ(want, got) << what;
        }
        if (n >= 512 * 1024) {
          // Several groups of chunks: the section went out in pieces, most of it before the end.
          EXPECT_GT(observer.appends, 1) << what;
          const absl::StatusOr<TopKEfHeader> h = ParseTopKEfHeader(*ParsePayload(got));
          ASSERT_THAT(h, IsOk());
          EXPECT_GE(observer.appended.size() + 64, h->index_section.size()) << what;
        }
      }
    }
  }
}

// Auto picks the coding from the first group of chunks; when adaptive wins there but loses over
// the tensor (which the output buffer, sized for packed12, could not hold), the section is
// recoded as packed12 and the observer told to discard. Chunks of 61 x 61 at k = 7: adaptive
// costs 7 + 30 + 7 * 7 = 86 bits per chunk against packed12's 84, unless the selection sits in
// the last, 9-position sub-block (a 9-bit bitmap instead of 49 bits of offsets): so the first
// block row of chunks is built to select there and the other 23 select anywhere.
TEST(TopKEfTest, StreamedAutoFallsBackToPacked12WhenAdaptiveEndsLonger) {
  const std::vector<int64_t> shape = {61 * 24, 61 * 4};
  TopKEfOptions options;
  options.top_k = 7.7;  // k = round_half_even(3721 * 7.7 / 4096) = 7
  auto codec = MakeCodec(options);
  std::vector<float> delta = Normals(Count(shape), 11, 0.1f);
  for (int64_t x = 0; x < 4; ++x) {
    for (int64_t col = 52; col < 61; ++col) delta[60 * shape[1] + x * 61 + col] = 5.0f + col;
  }
  TopKEfState plain, streamed;
  const Bytes want = Encode(*codec, plain, delta, shape);
  Bytes got(*codec->MaxEncodedBytes(shape));
  RecordingObserver observer;
  absl::StatusOr<size_t> size = codec->EncodeStreamed(*TensorView::Host(delta.data(), {1464, 244}),
                                                      &streamed, absl::MakeSpan(got), &observer);
  ASSERT_THAT(size, IsOk());
  got.resize(*size);
  EXPECT_GT(observer.appends, 0);
  EXPECT_EQ(observer.discards, 1);
  EXPECT_TRUE(observer.appended.empty());
  EXPECT_EQ(DecodeSparse(got).indices, IndexCoding::kPacked12);
  EXPECT_EQ(want, got);  // Encode() chose packed12 from the whole tensor
}

// A streamed encode that meets a NaN after it reported part of the section fails like Encode():
// InvalidArgument, the state untouched.
TEST(TopKEfTest, StreamedEncodeRejectsNonFiniteInputLate) {
  const std::vector<int64_t> shape = {1024, 1024};
  auto codec = MakeCodec(TopKEfOptions());
  TopKEfState state;
  ASSERT_THAT(state.Load(shape, Normals(Count(shape), 1)), IsOk());
  const std::vector<float> before(state.error().begin(), state.error().end());
  std::vector<float> delta = Normals(Count(shape), 2);
  delta[Count(shape) - 5] = std::numeric_limits<float>::quiet_NaN();
  Bytes out(*codec->MaxEncodedBytes(shape));
  RecordingObserver observer;
  EXPECT_THAT(codec->EncodeStreamed(*TensorView::Host(delta.data(), {1024, 1024}), &state,
                                    absl::MakeSpan(out), &observer),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NaN or infinite")));
  EXPECT_GT(observer.appends, 0);
  EXPECT_FALSE(state.has_pending());
  EXPECT_TRUE(std::equal(before.begin(), before.end(), state.error().begin()));
}

TEST(TopKEfTest, CallerErrors) {
  EXPECT_THAT(TopKEfCodec::Create([] {
                TopKEfOptions o;
                o.top_k = 0;
                return o;
              }()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(TopKEfCodec::Create([] {
                TopKEfOptions o;
                o.top_k = 5000;
                return o;
              }()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(TopKEfCodec::Create([] {
                TopKEfOptions o;
                o.beta = NAN;
                return o;
              }()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(TopKEfCodec::Create([] {
                TopKEfOptions o;
                o.value_block = 0;
                return o;
              }()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto codec = MakeCodec(TopKEfOptions::FromDensity(64.0 / 4096));
  EXPECT_EQ(codec->options().top_k, 64);
  std::vector<float> delta(64 * 64, 1.0f);
  const TensorView view = *TensorView::Host(delta.data(), {64, 64});
  Bytes out(*codec->MaxEncodedBytes({64, 64}));
  EXPECT_THAT(codec->Encode(view, nullptr, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  TopKEfState state;
  EXPECT_THAT(codec->Encode(view, &state, absl::MakeSpan(out).subspan(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("MaxEncodedBytes")));
  ASSERT_THAT(state.Reset({32, 128}), IsOk());
  EXPECT_THAT(codec->Encode(view, &state, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape")));
  std::vector<uint16_t> half(64 * 64);
  EXPECT_THAT(codec->Encode(*TensorView::Create(half.data(), DType::kBF16, {64, 64}), &state,
                            absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kUnimplemented));
  EXPECT_NE(codec->NewState(), nullptr);
  EXPECT_THAT(codec->Describe(), HasSubstr("top_k=64"));
}

// ---------------------------------------------------------------------------------------------
// Rejections: DataLoss (or InvalidArgument for caller mistakes) and not one byte written.

class RejectTest : public ::testing::Test {
 protected:
  // A [61, 61] tensor: chunk_len 3721 < 4096, so a 12-bit index can point outside its chunk.
  Bytes Make(IndexCoding indices = IndexCoding::kPacked12,
             ValueCoding values = ValueCoding::kBinMean2, std::vector<int64_t> shape = {61, 61}) {
    TopKEfOptions options;
    options.indices = indices;
    options.values = values;
    auto codec = MakeCodec(options);
    TopKEfState state;
    std::vector<float> delta = Normals(Count(shape), 77);
    return Encode(*codec, state, delta, shape);
  }

  // Decodes `payloads` into a sentinel-filled output; expects `code` and an untouched output.
  void ExpectRejected(const std::vector<Bytes>& payloads, absl::StatusCode code,
                      const std::string& message = "", std::vector<int64_t> shape = {61, 61}) {
    std::vector<absl::Span<const uint8_t>> spans(payloads.begin(), payloads.end());
    std::vector<float> out(Count(shape), 7.0f);
    for (bool accumulate : {false, true}) {
      EXPECT_THAT(
          DecodeAccumulate(spans, {Aggregation::kSparseLoCoMean, accumulate},
                           *TensorView::Host(out.data(), Shape(shape.begin(), shape.end()))),
          StatusIs(code, HasSubstr(message)));
      EXPECT_THAT(out, ::testing::Each(7.0f));
      // The two-step form rejects the same way and leaves nothing to apply.
      DecodeScratch scratch;
      EXPECT_THAT(
          PrepareDecode(spans, {Aggregation::kSparseLoCoMean, accumulate},
                        *TensorView::Host(out.data(), Shape(shape.begin(), shape.end())), &scratch),
          StatusIs(code, HasSubstr(message)));
      EXPECT_THAT(ApplyDecode(&scratch), StatusIs(absl::StatusCode::kFailedPrecondition));
      EXPECT_THAT(out, ::testing::Each(7.0f));
    }
    if (code == absl::StatusCode::kDataLoss && payloads.size() == 1) {
      EXPECT_THAT(InspectPayload(payloads[0]), StatusIs(absl::StatusCode::kDataLoss));
    }
  }

  static size_t ParamsOffset(const Bytes& p) { return 24 + 8 * p[9]; }
};

TEST_F(RejectTest, GoodPayloadsDecode) {
  for (IndexCoding indices : {IndexCoding::kPacked12, IndexCoding::kAdaptive}) {
    const Bytes good = Make(indices);
    std::vector<float> out(61 * 61, 7.0f);
    const absl::Span<const uint8_t> span(good);
    EXPECT_THAT(DecodeAccumulate(absl::MakeConstSpan(&span, 1), {},
                                 *TensorView::Host(out.data(), {61, 61})),
                IsOk());
    LBCC_ASSERT_OK_AND_ASSIGN(PayloadSummary summary, InspectPayload(good));
    EXPECT_EQ(summary.codec, CodecId::kTopKEf);
    EXPECT_EQ(summary.k_per_chunk, 58);  // round(3721 * 64 / 4096)
    EXPECT_EQ(summary.selected, 58);
    EXPECT_EQ(summary.total_bytes, good.size());
    EXPECT_THAT(summary.details, HasSubstr(std::string(IndexCodingName(indices))));
  }
}

// PrepareDecode + ApplyDecode (several tensors staged first, then written) equals
// DecodeAccumulate bit for bit, for both index codings, every aggregation and both modes.
TEST_F(RejectTest, PrepareThenApplyEqualsDecodeAccumulate) {
  const std::vector<int64_t> shapes[2] = {{61, 61}, {128, 192}};
  std::vector<Bytes> payloads[2];
  for (int t = 0; t < 2; ++t) {
    for (int r = 0; r < 5; ++r) {
      TopKEfOptions options;
      options.indices = r % 2 ? IndexCoding::kAdaptive : IndexCoding::kPacked12;
      auto codec = MakeCodec(options);
      TopKEfState state;
      std::vector<float> delta = Normals(Count(shapes[t]), 100 * t + r);
      payloads[t].push_back(Encode(*codec, state, delta, shapes[t]));
    }
  }
  for (Aggregation aggregation :
       {Aggregation::kSparseLoCoMean, Aggregation::kMean, Aggregation::kSum}) {
    for (bool accumulate : {false, true}) {
      const DecodeOptions options{aggregation, accumulate};
      std::vector<float> expect[2], got[2];
      DecodeScratch scratch[2];
      std::vector<absl::Span<const uint8_t>> spans[2];
      for (int t = 0; t < 2; ++t) {
        spans[t].assign(payloads[t].begin(), payloads[t].end());
        expect[t] = Normals(Count(shapes[t]), 9);
        got[t] = expect[t];
        const Shape shape(shapes[t].begin(), shapes[t].end());
        ASSERT_THAT(DecodeAccumulate(spans[t], options, *TensorView::Host(expect[t].data(), shape)),
                    IsOk());
        ASSERT_THAT(PrepareDecode(spans[t], options, *TensorView::Host(got[t].data(), shape),
                                  &scratch[t]),
                    IsOk());
      }
      for (int t = 0; t < 2; ++t) {
        EXPECT_NE(std::memcmp(got[t].data(), expect[t].data(), got[t].size() * 4), 0)
            << "prepare wrote the output";
        ASSERT_THAT(ApplyDecode(&scratch[t]), IsOk());
        EXPECT_EQ(std::memcmp(got[t].data(), expect[t].data(), got[t].size() * 4), 0)
            << AggregationName(aggregation) << " accumulate " << accumulate << " tensor " << t;
        EXPECT_THAT(ApplyDecode(&scratch[t]), StatusIs(absl::StatusCode::kFailedPrecondition));
      }
    }
  }
}

TEST_F(RejectTest, UnknownVersionAndCodecId) {
  Bytes p = Make();
  p[5] = 3;  // codec version (1 and 2 are known)
  Reseal(p);
  ExpectRejected({p}, absl::StatusCode::kDataLoss, "unknown topk_ef version 3");
  p = Make();
  p[5] = 2;  // a version 1 payload read as version 2: its first value parameter byte is no
  Reseal(p);  // chunking
  ExpectRejected({p}, absl::StatusCode::kDataLoss);
  p = Make();
  p[6] = 99;  // codec id
  Reseal(p);
  ExpectRejected({p}, absl::StatusCode::kDataLoss, "unknown codec id");
  p = Make();
  p[4] = 9;  // envelope version
  Reseal(p);
  ExpectRejected({p}, absl::StatusCode::kDataLoss, "envelope version");
}

TEST_F(RejectTest, BadChecksumAndTruncation) {
  const Bytes good = Make();
  Bytes p = good;
  p[p.size() / 2] ^= 0x10;
  ExpectRejected({p}, absl::StatusCode::kDataLoss, "checksum");
  for (size_t cut : {size_t{0}, size_t{10}, size_t{30}, good.size() / 2, good.size() - 1}) {
    ExpectRejected({Bytes(good.begin(), good.begin() + cut)}, absl::StatusCode::kDataLoss);
  }
  Bytes longer = good;
  longer.push_back(0);
  ExpectRejected({longer}, absl::StatusCode::kDataLoss, "trailing");
}

TEST_F(RejectTest, OutOfRangeAndRepeatedIndices) {
  const Bytes good = Make();
  const size_t body = ParamsOffset(good) + 16 + 20;
  Bytes p = good;
  // First index := 4000 (>= 3721): low byte 0xA0, high nibble 0xF.
  p[body] = 0xA0;
  p[body + 1] = static_cast<uint8_t>((p[body + 1] & 0xF0) | 0x0F);
  Reseal(p);
  ExpectRejected({p}, absl::StatusCode::kDataLoss, "outside the chunk");
  p = good;
  // Second index := first index (a repeat).
  const uint32_t first = p[body] | ((p[body + 1] & 0x0F) << 8);
  p[body + 1] = static_cast<uint8_t>((p[body + 1] & 0x0F) | ((first & 0xF) << 4));
  p[body + 2] = static_cast<uint8_t>(first >> 4);
  Reseal(p);
  ExpectRejected({p}, absl::StatusCode::kDataLoss, "ascending");
}

TEST_F(RejectTest, BadParams) {
  const Bytes good = Make();
  const size_t params = ParamsOffset(good);
  auto edit = [&](size_t offset, uint8_t value) {
    Bytes p = good;
    p[params + offset] = value;
    Reseal(p);
    return p;
  };
  ExpectRejected({edit(0, 0)}, absl::StatusCode::kDataLoss, "k 0");
  ExpectRejected({edit(1, 0xFF)}, absl::StatusCode::kDataLoss);  // k = 65338 > chunk
  ExpectRejected({edit(4, 9)}, absl::StatusCode::kDataLoss, "value coding");
  ExpectRejected({edit(5, 3)}, absl::StatusCode::kDataLoss, "index coding");
  ExpectRejected({edit(6, 6)}, absl::StatusCode::kDataLoss, "packed12 with adaptive");
  ExpectRejected({edit(15, 1)}, absl::StatusCode::kDataLoss, "index section");
  ExpectRejected({edit(8, 0)}, absl::StatusCode::kDataLoss);  // index length != formula
  // Lookup table entry := NaN.
  Bytes p = good;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(p.data() + params + 16 + 8, &nan, 4);
  Reseal(p);
  ExpectRejected({p}, absl::StatusCode::kDataLoss, "not finite");
  // Flags.
  p = good;
  p[10] = 1;
  Reseal(p);
  ExpectRejected({p}, absl::StatusCode::kDataLoss, "flags");
}

TEST_F(RejectTest, AdaptiveCorruption) {
  const Bytes good = Make(IndexCoding::kAdaptive);
  const size_t params = ParamsOffset(good);
  ASSERT_EQ(good[params + 5], static_cast<uint8_t>(IndexCoding::kAdaptive));
  Bytes p = good;
  p[params + 6] = 8;  // sub-block log2
  Reseal(p);
  ExpectRejected({p}, absl::StatusCode::kDataLoss, "sub-block");
  // Flip each bit of the index section: decoding fails or yields a valid list; never a crash.
  const size_t body = params + 16 + 20;
  uint64_t index_bytes;
  std::memcpy(&index_bytes, good.data() + params + 8, 8);
  for (size_t bit = 0; bit < 8 * index_bytes; bit += 3) {
    p = good;
    p[body + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    Reseal(p);
    std::vector<float> out(61 * 61, 7.0f);
    const absl::Span<const uint8_t> span(p);
    const absl::Status status = DecodeAccumulate(absl::MakeConstSpan(&span, 1), {},
                                                 *TensorView::Host(out.data(), {61, 61}));
    if (!status.ok()) {
      ASSERT_EQ(status.code(), absl::StatusCode::kDataLoss);
      ASSERT_THAT(out, ::testing::Each(7.0f));
    }
  }
}

TEST_F(RejectTest, OneBadPayloadAmongGoodOnesWritesNothing) {
  const Bytes good = Make();
  Bytes bad = good;
  bad[bad.size() - 20] ^= 1;
  ExpectRejected({good, good, bad}, absl::StatusCode::kDataLoss, "payload 2");
  ExpectRejected({good, good, Bytes(good.begin(), good.end() - 1)}, absl::StatusCode::kDataLoss,
                 "payload 2");
}

TEST_F(RejectTest, CallerMistakesAreInvalidArgument) {
  const Bytes good = Make();
  ExpectRejected({good, Make(IndexCoding::kPacked12, ValueCoding::kBinMean2, {61, 62})},
                 absl::StatusCode::kInvalidArgument, "shape");
  ExpectRejected({}, absl::StatusCode::kInvalidArgument, "no payloads");
  std::vector<float> out(61 * 62, 7.0f);
  const absl::Span<const uint8_t> span(good);
  EXPECT_THAT(
      DecodeAccumulate(absl::MakeConstSpan(&span, 1), {}, *TensorView::Host(out.data(), {61, 62})),
      StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(out, ::testing::Each(7.0f));
}


// ---------------------------------------------------------------------------------------------
// SparseLoCo compatibility options (k_rule, chunk_1d), the median-norm clip, the magnitude
// bound. The Python suite (python/tests/test_templar_compat.py) checks the same against an
// independent re-statement of templar's rules over several shapes, EF steps and 4 replicas.

TEST(TopKEfCompatTest, PerChunkKIsTemplarsClampTopK) {
  // templar: min(top_k, len), at least 2, rounded down to even; LBCC caps a 1-element chunk.
  const struct {
    int64_t len;
    double top_k;
    int64_t k;
  } cases[] = {{4096, 64, 64}, {1500, 64, 64}, {64, 64, 64}, {30, 64, 30}, {31, 64, 30},
               {3, 64, 2},     {2, 64, 2},     {1, 64, 1},   {4096, 1, 2}, {4096, 7, 6},
               {26, 128, 26},  {4096, 4096, 4096}};
  for (const auto& c : cases) {
    EXPECT_EQ(KPerChunk(c.len, c.top_k, KRule::kPerChunk), c.k) << c.len << " " << c.top_k;
  }
  // The proportional rule for comparison (the examples): 23 of 1500, 1 of 64.
  EXPECT_EQ(KPerChunk(1500, 64), 23);
  EXPECT_EQ(KPerChunk(64, 64), 1);
  EXPECT_EQ(KPerChunk(4096, 64), KPerChunk(4096, 64, KRule::kPerChunk));
}

TEST(TopKEfCompatTest, OptionsAreValidatedAndNamed) {
  TopKEfOptions o = TopKEfOptions::Templar();
  EXPECT_THAT(o.Validate(), IsOk());
  o.top_k = 63.5;
  EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("whole number in [1, 4096] with k_rule per_chunk")));
  o.top_k = 0.5;
  EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument));
  o = TopKEfOptions();
  o.k_rule = static_cast<KRule>(7);
  EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("k_rule")));
  o = TopKEfOptions();
  o.chunk_1d = static_cast<Chunk1D>(9);
  EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chunk_1d")));
  for (Chunk1D r : {Chunk1D::kLbcc, Chunk1D::kTemplar, Chunk1D::kFlat4096}) {
    EXPECT_THAT(ParseChunk1D(Chunk1DName(r)), ::lbcc::testing::IsOkAndHolds(r));
  }
  for (KRule r : {KRule::kProportional, KRule::kPerChunk}) {
    EXPECT_THAT(ParseKRule(KRuleName(r)), ::lbcc::testing::IsOkAndHolds(r));
  }
  EXPECT_THAT(ParseKRule("even"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("even")));
  EXPECT_THAT(ParseChunk1D("flat"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(MakeCodec(TopKEfOptions::Templar())->Describe(),
              HasSubstr("k_rule=per_chunk, chunk_1d=templar"));
}

TEST(TopKEfCompatTest, ChunkingOf1DTensors) {
  TopKEfOptions flat;
  flat.chunk_1d = Chunk1D::kFlat4096;
  const struct {
    int64_t n;
    int64_t w_flat;
  } cases[] = {{8192, 4096}, {12288, 4096}, {5000, 2500}, {4096, 4096}, {64, 64}, {130, 130},
               {4099, 1}};  // 4099 is prime: chunks of 1, as the 64 rule gives a prime > 64
  for (const auto& c : cases) {
    const ChunkGeometry g = *flat.Geometry({c.n});
    EXPECT_EQ(g.w, c.w_flat) << c.n;
    EXPECT_EQ(g.h, 1);
    EXPECT_EQ(g.num_chunks, c.n / c.w_flat);
    const ChunkGeometry shape_aware = *TopKEfOptions().Geometry({c.n});
    EXPECT_EQ(shape_aware.w, ChunkEdge(c.n)) << c.n;
    EXPECT_EQ(flat.ChunkingFor({c.n}),
              c.w_flat == ChunkEdge(c.n) ? Chunking::kShapeAware : Chunking::kFlat1D);
  }
  // Other ranks keep the shape-aware rule.
  EXPECT_EQ(flat.ChunkingFor({64, 128}), Chunking::kShapeAware);
  EXPECT_EQ(flat.ChunkingFor({}), Chunking::kShapeAware);
  EXPECT_EQ(flat.ChunkingFor({2, 8192}), Chunking::kShapeAware);
}

// Version 1 whenever the geometry is the shape-aware one (lbcc and templar chunking give the
// same bytes); version 2 with the chunking byte for flat 1-D chunks, decoded with them.
TEST(TopKEfCompatTest, PayloadVersionFollowsTheChunking) {
  const std::vector<std::vector<int64_t>> shapes = {{130}, {64}, {8192}, {100, 30}, {3, 64, 8}};
  for (const std::vector<int64_t>& shape : shapes) {
    TopKEfOptions lbcc_rule, templar_rule, flat;
    templar_rule.chunk_1d = Chunk1D::kTemplar;
    flat.chunk_1d = Chunk1D::kFlat4096;
    for (KRule rule : {KRule::kProportional, KRule::kPerChunk}) {
      lbcc_rule.k_rule = templar_rule.k_rule = flat.k_rule = rule;
      TopKEfState s1, s2, s3;
      std::vector<float> d = Normals(Count(shape), 5);
      const Bytes a = Encode(*MakeCodec(lbcc_rule), s1, d, shape);
      const Bytes b = Encode(*MakeCodec(templar_rule), s2, d, shape);
      const Bytes c = Encode(*MakeCodec(flat), s3, d, shape);
      EXPECT_EQ(a, b);
      EXPECT_EQ(a[5], kTopKEfVersion);
      const bool flat_differs = flat.ChunkingFor(shape) == Chunking::kFlat1D;
      EXPECT_EQ(c[5], flat_differs ? kTopKEfVersionChunking : kTopKEfVersion);
      if (!flat_differs) EXPECT_EQ(a, c);
      EXPECT_LE(c.size(), *MakeCodec(flat)->MaxEncodedBytes(shape));
      // Every payload decodes to e' - e_new: the values the encoder took out of its buffer.
      for (auto [payload, state] : {std::pair<const Bytes*, TopKEfState*>{&a, &s1}, {&c, &s3}}) {
        ASSERT_THAT(state->Commit(), IsOk());
        std::vector<float> out(d.size(), 7.0f);
        const absl::Span<const uint8_t> span(*payload);
        ASSERT_THAT(DecodeAccumulate(absl::MakeConstSpan(&span, 1), {Aggregation::kSum, false},
                                     *TensorView::Host(out.data(), Shape(shape.begin(), shape.end()))),
                    IsOk());
        const float beta_e = 0.0f;  // first round: e = 0, so e' = delta
        int64_t selected = 0;
        for (size_t i = 0; i < d.size(); ++i) {
          selected += out[i] != 0;
          EXPECT_EQ(state->error()[i], (d[i] + beta_e) - out[i]) << i;
        }
        const absl::StatusOr<PayloadSummary> summary = InspectPayload(*payload);
        ASSERT_THAT(summary, IsOk());
        EXPECT_EQ(summary->selected, selected);
      }
    }
  }
  // A flat 8192 payload: two chunks of 4096, proportional k = 64 each; per_chunk 64 too.
  TopKEfOptions flat;
  flat.chunk_1d = Chunk1D::kFlat4096;
  TopKEfState st;
  std::vector<float> d = Normals(8192, 9);
  const absl::StatusOr<PayloadSummary> summary =
      InspectPayload(Encode(*MakeCodec(flat), st, d, {8192}));
  ASSERT_THAT(summary, IsOk());
  EXPECT_EQ(summary->codec_version, kTopKEfVersionChunking);
  EXPECT_EQ(summary->k_per_chunk, 64);
  EXPECT_EQ(summary->selected, 128);
  EXPECT_THAT(summary->details, HasSubstr("2 chunks of 1x4096"));
}

TEST(TopKEfCompatTest, UnknownChunkingIsDataLoss) {
  TopKEfOptions flat;
  flat.chunk_1d = Chunk1D::kFlat4096;
  TopKEfState st;
  std::vector<float> d = Normals(8192, 3);
  Bytes p = Encode(*MakeCodec(flat), st, d, {8192});
  const absl::StatusOr<PayloadInfo> info = ParsePayload(p);
  ASSERT_THAT(info, IsOk());
  const size_t chunking_at = static_cast<size_t>(info->params.data() - p.data()) + 16;
  ASSERT_EQ(p[chunking_at], 1);
  p[chunking_at] = 2;
  Reseal(p);
  std::vector<float> out(8192, 7.0f);
  const absl::Span<const uint8_t> span(p);
  EXPECT_THAT(DecodeAccumulate(absl::MakeConstSpan(&span, 1), {},
                               *TensorView::Host(out.data(), {8192})),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("unknown chunking 2")));
  EXPECT_THAT(out, ::testing::Each(7.0f));
}

// Payloads written before the versioned chunking (testdata/topk_ef_v1_golden/, by the tree at
// commit 4d02345): they still decode to the same bits, and today's encoder still writes them.
Bytes ReadFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  Bytes b;
  if (f == nullptr) return b;
  int c;
  while ((c = std::fgetc(f)) != EOF) b.push_back(static_cast<uint8_t>(c));
  std::fclose(f);
  return b;
}

// The golden inputs: a multiplicative hash of (i + salt) mapped to [-0.5, 0.5), exact in fp32.
std::vector<float> GoldenInput(int64_t n, uint64_t salt) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = ((static_cast<uint64_t>(i) + salt) * 2654435761u) % (uint64_t{1} << 32);
    v[static_cast<size_t>(i)] = static_cast<float>(static_cast<double>(h) / 4294967296.0 - 0.5);
  }
  return v;
}

TEST(TopKEfCompatTest, GoldenVersion1PayloadsStillDecodeAndAreStillWritten) {
  const struct {
    const char* name;
    std::vector<int64_t> shape;
    IndexCoding indices;
  } cases[] = {{"2d_100x30", {100, 30}, IndexCoding::kPacked12},
               {"1d_130", {130}, IndexCoding::kAdaptive}};
  for (const auto& c : cases) {
    const std::string dir = std::string("codecs/testdata/topk_ef_v1_golden/") + c.name;
    const Bytes r0 = ReadFile(dir + "_r0.bin"), r1 = ReadFile(dir + "_r1.bin");
    const Bytes decoded = ReadFile(dir + "_decoded.f32");
    ASSERT_FALSE(r0.empty());
    ASSERT_EQ(r0[5], 1);
    const int64_t n = Count(c.shape);
    ASSERT_EQ(decoded.size(), static_cast<size_t>(n) * 4);
    std::vector<float> out(static_cast<size_t>(n), 7.0f);
    const absl::Span<const uint8_t> spans[] = {r0, r1};
    ASSERT_THAT(DecodeAccumulate(spans, {Aggregation::kSparseLoCoMean, false},
                                 *TensorView::Host(out.data(), Shape(c.shape.begin(), c.shape.end()))),
                IsOk());
    EXPECT_EQ(std::memcmp(out.data(), decoded.data(), decoded.size()), 0) << c.name;
    TopKEfOptions o;
    o.indices = c.indices;
    auto codec = MakeCodec(o);
    TopKEfState st;
    std::vector<float> d0 = GoldenInput(n, 1), d1 = GoldenInput(n, 7);
    EXPECT_EQ(Encode(*codec, st, d0, c.shape), r0) << c.name;
    ASSERT_THAT(st.Commit(), IsOk());
    EXPECT_EQ(Encode(*codec, st, d1, c.shape), r1) << c.name;
  }
}

// The clip against a re-statement: each payload decoded alone, scaled by
// min(1, lower_median / (norm + 1e-8)), then the mean over the payloads that selected each
// coordinate, in rank order.
TEST(TopKEfCompatTest, ClipToMedianNormScalesEachPayloadBeforeTheMean) {
  const std::vector<int64_t> shape = {96, 200};
  const int64_t n = Count(shape);
  for (ValueCoding values : {ValueCoding::kBinMean2, ValueCoding::kF32, ValueCoding::kBinMean8}) {
    TopKEfOptions o = TopKEfOptions::Templar();
    o.values = values;
    auto codec = MakeCodec(o);
    std::vector<Bytes> payloads;
    const float scales[] = {1.0f, 3.0f, 0.5f, 40.0f};  // an outlier at rank 3
    for (int r = 0; r < 4; ++r) {
      TopKEfState st;
      std::vector<float> d = Normals(n, 100 + r, scales[r]);
      payloads.push_back(Encode(*codec, st, d, shape));
    }
    std::vector<absl::Span<const uint8_t>> spans(payloads.begin(), payloads.end());
    std::vector<std::vector<float>> alone(4, std::vector<float>(static_cast<size_t>(n)));
    std::vector<float> norms(4);
    for (int r = 0; r < 4; ++r) {
      ASSERT_THAT(DecodeAccumulate(absl::MakeConstSpan(&spans[r], 1), {Aggregation::kSum, false},
                                   *TensorView::Host(alone[r].data(), {96, 200})),
                  IsOk());
      double sum = 0;
      for (float v : alone[r]) sum += static_cast<double>(v) * v;
      norms[r] = static_cast<float>(std::sqrt(sum));
    }
    std::vector<float> sorted = norms;
    std::sort(sorted.begin(), sorted.end());
    const float median = sorted[1];  // lower median of 4
    std::vector<float> expected(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      float acc = -0.0f;
      int count = 0;
      for (int r = 0; r < 4; ++r) {
        const float v = alone[r][static_cast<size_t>(i)];
        if (v == 0) continue;  // not selected (bin-mean reconstructions are never 0 here)
        const float q = median / (norms[r] + 1e-8f);
        acc += v * (q < 1.0f ? q : 1.0f);
        ++count;
      }
      expected[static_cast<size_t>(i)] = count == 0 ? 0.0f : acc / static_cast<float>(count);
    }
    DecodeOptions clip;
    clip.clip_to_median_norm = true;
    std::vector<float> out(static_cast<size_t>(n), 7.0f);
    ASSERT_THAT(DecodeAccumulate(spans, clip, *TensorView::Host(out.data(), {96, 200})), IsOk());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[static_cast<size_t>(i)], expected[static_cast<size_t>(i)])
          << ValueCodingName(values) << " at " << i;
    }
    // The outlier was scaled down; the ranks below the median were not.
    EXPECT_GT(norms[3], 10 * norms[0]);
    std::vector<float> factors(4);
    MedianNormClipFactors(norms, absl::MakeSpan(factors));
    EXPECT_EQ(factors[0], 1.0f);
    EXPECT_EQ(factors[2], 1.0f);
    EXPECT_LT(factors[3], 0.1f);
    // Prepare + Apply give the same bits, whatever payload arrives first on the wire (the
    // decode's order is the rank order of the spans).
    DecodeScratch scratch;
    std::vector<float> again(static_cast<size_t>(n), 7.0f);
    ASSERT_THAT(PrepareDecode(spans, clip, *TensorView::Host(again.data(), {96, 200}), &scratch),
                IsOk());
    ASSERT_THAT(ApplyDecode(&scratch), IsOk());
    EXPECT_EQ(again, out);
  }
}

TEST(TopKEfCompatTest, ClipToMedianNormIsUnimplementedForCodecsThatDoNotClip) {
  auto dense = *DenseQuantCodec::Create(DenseQuantOptions());
  std::vector<float> x = Normals(256, 1);
  Bytes p(*dense->MaxEncodedBytes({256}));
  p.resize(*dense->Encode(*TensorView::Host(x.data(), {256}), nullptr, absl::MakeSpan(p)));
  DecodeOptions clip;
  clip.clip_to_median_norm = true;
  std::vector<float> out(256, 7.0f);
  const absl::Span<const uint8_t> span(p);
  EXPECT_THAT(DecodeAccumulate(absl::MakeConstSpan(&span, 1), clip,
                               *TensorView::Host(out.data(), {256})),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("clip_to_median_norm")));
  EXPECT_THAT(out, ::testing::Each(7.0f));
}

// Issue 19: deltas of 3e38 decoded to +inf once several replicas selected them. Entries of e'
// above 2^100 are refused at encode; at the bound, a decode of 65535 replicas stays finite.
TEST(TopKEfCompatTest, MagnitudesAbove2To100AreRefusedAndTheBoundDecodesFinite) {
  const std::vector<int64_t> shape = {4096};
  auto codec = MakeCodec(TopKEfOptions());
  for (float big : {3e38f, -3e38f, 0x1.000002p100f, 1e31f}) {
    TopKEfState st;
    std::vector<float> d = Normals(4096, 1);
    d[7] = big;
    Bytes out(*codec->MaxEncodedBytes(shape));
    EXPECT_THAT(codec->Encode(*TensorView::Host(d.data(), {4096}), &st, absl::MakeSpan(out)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds 2^100")))
        << big;
    EXPECT_FALSE(st.has_pending());
  }
  // At the bound, with the opposite sign elsewhere (the bin-mean's centred values double).
  std::vector<Bytes> payloads;
  for (int r = 0; r < 4; ++r) {
    TopKEfState st;
    std::vector<float> d = Normals(4096, 1);
    d[7] = kMaxEncodableMagnitude;
    d[9] = -kMaxEncodableMagnitude;
    payloads.push_back(Encode(*codec, st, d, shape));
  }
  std::vector<absl::Span<const uint8_t>> spans;
  for (int r = 0; r < 65535; ++r) spans.push_back(payloads[r % 4]);
  std::vector<float> out(4096);
  ASSERT_THAT(DecodeAccumulate(spans, {Aggregation::kSum, false}, *TensorView::Host(out.data(), {4096})),
              IsOk());
  for (float v : out) ASSERT_TRUE(std::isfinite(v)) << v;
  EXPECT_GT(out[7], 1e34f);
}

}  // namespace
}  // namespace lbcc::codecs
