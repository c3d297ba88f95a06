// The planner's byte formulas against the codecs: real tensors encoded, sizes compared.
#include "plan/bytes.h"

#include <random>
#include <vector>

#include "base/status_matchers.h"
#include "base/tensor_view.h"
#include "codecs/dense_quant.h"
#include "codecs/index_coding.h"
#include "codecs/subspace_basis.h"
#include "codecs/subspace_codec.h"
#include "codecs/topk_ef.h"
#include "gtest/gtest.h"

namespace lbcc::plan {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<float> Gaussian(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// Encodes a Gaussian tensor of `shape` once; returns the payload size.
size_t EncodedSize(const std::vector<int64_t>& shape, const codecs::TopKEfOptions& options,
                   uint64_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> delta = Gaussian(n, seed);
  auto codec = codecs::TopKEfCodec::Create(options);
  EXPECT_THAT(codec.status(), IsOk());
  codecs::TopKEfState state;
  auto view = TensorView::Host(delta.data(), Shape(shape.begin(), shape.end()));
  EXPECT_THAT(view.status(), IsOk());
  auto max = (*codec)->MaxEncodedBytes(shape);
  EXPECT_THAT(max.status(), IsOk());
  std::vector<uint8_t> out(*max);
  auto size = (*codec)->Encode(*view, &state, absl::MakeSpan(out));
  EXPECT_THAT(size.status(), IsOk());
  return size.ok() ? *size : 0;
}

struct Case {
  std::vector<int64_t> shape;
  double top_k;
  codecs::ValueCoding values;
};

TEST(TopKEfBytes, Packed12IsExact) {
  const std::vector<Case> cases = {
      {{64, 4096}, 64, codecs::ValueCoding::kBinMean2},
      {{128, 128}, 128, codecs::ValueCoding::kBinMean2},
      {{100, 30}, 64, codecs::ValueCoding::kBinMean2},   // chunks of 50 x 30
      {{1000}, 64, codecs::ValueCoding::kBinMean4},      // 1-D: rows of 40
      {{97, 131}, 7.5, codecs::ValueCoding::kBf16},      // primes: chunks of one element
      {{256, 192}, 200, codecs::ValueCoding::kF32},
      {{3, 64, 64}, 64, codecs::ValueCoding::kAbsmax8},
      {{64, 64}, 4096, codecs::ValueCoding::kBinMean8},  // every element
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    codecs::TopKEfOptions options;
    options.top_k = c.top_k;
    options.values = c.values;
    options.indices = codecs::IndexCoding::kPacked12;
    absl::StatusOr<double> predicted = TopKEfPayloadBytes(c.shape, options);
    ASSERT_THAT(predicted.status(), IsOk());
    EXPECT_EQ(*predicted, static_cast<double>(EncodedSize(c.shape, options, seed++)))
        << "shape " << c.shape.size() << "-d, top_k " << c.top_k;
  }
}

// Adaptive coding depends on where the selected entries fall: the prediction is the expected
// length for uniformly spread selections (what Gaussian noise gives), within 1 %, and the
// payload never exceeds the adaptive bound.
TEST(TopKEfBytes, AdaptiveExpectedWithinOnePercentAndBelowBound) {
  for (double top_k : {16.0, 64.0, 128.0, 400.0}) {
    for (codecs::IndexCoding coding : {codecs::IndexCoding::kAdaptive, codecs::IndexCoding::kAuto}) {
      const std::vector<int64_t> shape = {512, 4096};  // 512 chunks of 64 x 64
      codecs::TopKEfOptions options;
      options.top_k = top_k;
      options.indices = coding;
      absl::StatusOr<double> predicted = TopKEfPayloadBytes(shape, options);
      ASSERT_THAT(predicted.status(), IsOk());
      const double actual = static_cast<double>(EncodedSize(shape, options, 7));
      EXPECT_NEAR(*predicted / actual, 1.0, 0.01) << "top_k " << top_k;
      codecs::TopKEfOptions bound = options;
      bound.indices = codecs::IndexCoding::kAdaptive;
      auto codec = codecs::TopKEfCodec::Create(bound);
      ASSERT_THAT(codec.status(), IsOk());
      auto max = (*codec)->MaxEncodedBytes(shape);
      ASSERT_THAT(max.status(), IsOk());
      EXPECT_LE(actual, static_cast<double>(*max));
      if (coding == codecs::IndexCoding::kAuto) {
        codecs::TopKEfOptions packed = options;
        packed.indices = codecs::IndexCoding::kPacked12;
        EXPECT_LE(*predicted, *TopKEfPayloadBytes(shape, packed));
      }
    }
  }
}

TEST(TopKEfBytes, ExpectedAdaptiveBitsMatchesTheCodersLengthOnUniformSelections) {
  // Uniform random k-subsets per chunk, coded by the codec's own length function.
  const codecs::IndexLayout layout{2000, 64, 4096};
  std::mt19937_64 rng(3);
  std::vector<uint16_t> local;
  std::vector<uint16_t> all(4096);
  for (int i = 0; i < 4096; ++i) all[i] = static_cast<uint16_t>(i);
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<uint16_t> pick(all.begin(), all.begin() + layout.k);
    std::sort(pick.begin(), pick.end());
    local.insert(local.end(), pick.begin(), pick.end());
  }
  const codecs::AdaptiveChoice choice = codecs::ChooseAdaptive(local, layout);
  const double expected = ExpectedAdaptiveBits(layout.num_chunks, layout.chunk_len, layout.k);
  EXPECT_NEAR(expected / static_cast<double>(choice.bits), 1.0, 0.005);
}

TEST(SubspaceBytes, ForwardAndBackwardAreExact) {
  struct SubCase {
    int64_t d, k, vocab;
    DType dtype;
  };
  for (const SubCase& c : {SubCase{64, 8, 1000, DType::kBF16}, SubCase{96, 12, 70000, DType::kF32},
                           SubCase{64, 40, 0, DType::kI8}, SubCase{32, 5, 200, DType::kF16}}) {
    codecs::SubspaceSeedSpec spec;
    spec.model_dim = c.d;
    spec.rank = c.k;
    spec.vocab_size = c.vocab;
    spec.seed = 11;
    auto basis = codecs::SubspaceBasis::FromSeed(spec);
    ASSERT_THAT(basis.status(), IsOk());
    codecs::SubspaceCodecOptions options;
    options.coefficient_dtype = c.dtype;
    auto codec = codecs::SubspaceCodec::Create(*basis, options);
    ASSERT_THAT(codec.status(), IsOk());
    const int64_t tokens = 37;
    std::vector<float> h = Gaussian(tokens * c.d, 5);
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < tokens && c.vocab > 0; ++t) ids.push_back(static_cast<int32_t>(t % c.vocab));
    auto view = TensorView::Host(h.data(), {tokens, c.d});
    ASSERT_THAT(view.status(), IsOk());
    auto fwd = codec->EncodeForward(*view, ids);
    ASSERT_THAT(fwd.status(), IsOk());
    auto bwd = codec->EncodeBackward(*view);
    ASSERT_THAT(bwd.status(), IsOk());
    BoundaryCoding coding;
    coding.model_dim = c.d;
    coding.rank = c.k;
    coding.vocab_size = c.vocab;
    coding.coefficient_dtype = c.dtype;
    absl::StatusOr<BoundaryBytes> predicted = SubspaceBoundaryBytes(coding, tokens);
    ASSERT_THAT(predicted.status(), IsOk());
    EXPECT_EQ(predicted->forward, static_cast<double>(fwd->size()));
    EXPECT_EQ(predicted->backward, static_cast<double>(bwd->size()));
  }
}

TEST(SubspaceBytes, ReferenceExampleAndDenseBoundary) {
  // subspace.md: d 1024, k 160, bf16, 2-byte ids: 322 B per token (+ 76 B of envelope).
  BoundaryCoding coding;
  coding.model_dim = 1024;
  coding.rank = 160;
  coding.vocab_size = 50257;
  absl::StatusOr<BoundaryBytes> b = SubspaceBoundaryBytes(coding, 1000);
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_EQ(b->forward, 322.0 * 1000 + 76);
  coding.rank = 0;
  b = SubspaceBoundaryBytes(coding, 1000);
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_EQ(b->forward, 2048.0 * 1000);
  EXPECT_EQ(b->backward, 2048.0 * 1000);
  coding.rank = 2000;
  EXPECT_FALSE(SubspaceBoundaryBytes(coding, 1000).ok());
}

TEST(Groups, FollowSparseAllReducesPlan) {
  // 16 tensors of 256K: groups of >= 2^20 elements -> 4 groups of 4.
  const std::vector<int64_t> sixteen(16, 1 << 18);
  const auto g = PlanGroups(sixteen, 1 << 20);
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(g[1], std::make_pair(size_t{4}, size_t{8}));
  // One large tensor is one group.
  EXPECT_EQ(PlanGroups(std::vector<int64_t>{1 << 22}, 1 << 20).size(), 1u);
}

// The context ring's payloads (comm::ContextRing's codecs): the formula against real encodes of
// a K block, mixtures with a selector per block included.
TEST(RingBytes, EveryCodecMatchesARealEncode) {
  const int64_t tokens = 8 * 64, d = 64;  // batch 8 x 64 tokens, the example's block
  std::vector<float> k = Gaussian(tokens * d, 3);
  auto view = TensorView::Host(k.data(), {tokens, d});
  ASSERT_THAT(view.status(), IsOk());

  RingCoding raw;
  raw.kind = RingCoding::Kind::kRawF32;
  absl::StatusOr<RingTensorBytes> b = RingPayloadBytes(raw, tokens, d);
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_EQ(b->forward, tokens * d * 4.0);

  for (const char* format : {"bf16", "fp16"}) {
    codecs::DenseQuantOptions options;
    options.format = *codecs::ParseDenseFormat(format);
    auto codec = codecs::DenseQuantCodec::Create(options);
    ASSERT_THAT(codec.status(), IsOk());
    std::vector<uint8_t> out(tokens * d * 4 + 4096);
    auto n = (*codec)->Encode(*view, nullptr, absl::MakeSpan(out));
    ASSERT_THAT(n.status(), IsOk());
    RingCoding dense;
    dense.dense_format = format;
    b = RingPayloadBytes(dense, tokens, d);
    ASSERT_THAT(b.status(), IsOk());
    EXPECT_EQ(b->forward, static_cast<double>(*n)) << format;
    EXPECT_EQ(b->backward, b->forward) << format;
  }

  for (int64_t components : {1, 4}) {
    codecs::SubspaceSeedSpec spec;
    spec.model_dim = d;
    spec.rank = 3;
    spec.components = components;
    spec.seed = 5;
    auto basis = codecs::SubspaceBasis::FromSeed(spec);
    ASSERT_THAT(basis.status(), IsOk());
    codecs::SubspaceCodecOptions options;
    options.mixture_block = 16;
    auto codec = codecs::SubspaceCodec::Create(*basis, options);
    ASSERT_THAT(codec.status(), IsOk());
    codecs::SubspaceSelectors selectors;
    auto fwd = codec->EncodeForward(*view, {}, &selectors);
    ASSERT_THAT(fwd.status(), IsOk());
    auto bwd = codec->EncodeBackward(*view, selectors);
    ASSERT_THAT(bwd.status(), IsOk());
    RingCoding sub;
    sub.kind = RingCoding::Kind::kSubspace;
    sub.rank = 3;
    sub.components = components;
    sub.mixture_block = 16;
    b = RingPayloadBytes(sub, tokens, d);
    ASSERT_THAT(b.status(), IsOk());
    EXPECT_EQ(b->forward, static_cast<double>(fwd->size())) << "M " << components;
    EXPECT_EQ(b->backward, static_cast<double>(bwd->size())) << "M " << components;
  }
}

TEST(RingBytes, BadCodingsNameTheValue) {
  RingCoding sub;
  sub.kind = RingCoding::Kind::kSubspace;
  sub.rank = 65;
  EXPECT_THAT(RingPayloadBytes(sub, 10, 64),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("k is 65")));
  sub.rank = 4;
  sub.components = 256;
  EXPECT_THAT(RingPayloadBytes(sub, 10, 64),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("M is 256")));
  RingCoding dense;
  dense.dense_format = "bf17";
  EXPECT_FALSE(RingPayloadBytes(dense, 10, 64).ok());
  EXPECT_THAT(RingPayloadBytes(RingCoding(), 0, 64),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 tokens")));
}

}  // namespace
}  // namespace lbcc::plan
