// The registry from a codec's side: a toy codec registered in this file alone (no other file
// knows it) round-trips through the free functions of codec.h, and ids nobody registered are
// DataLoss.
#include "codecs/codec_registry.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "codecs/codec.h"
#include "codecs/payload.h"
#include "codecs/topk_ef.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::codecs {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::Contains;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Ids no LBCC codec uses.
constexpr CodecId kToyId{1001};
constexpr CodecId kUnregisteredId{1002};

// fp32 values as they are (params: none; body: 4 bytes per element). Decoding aggregates like
// the dense quantizer.
class ToyCodec final : public Codec {
 public:
  explicit ToyCodec(absl::string_view name = "toy_identity") : name_(name) {}
  CodecId id() const override { return kToyId; }
  absl::string_view name() const override { return name_; }
  std::string Describe() const override { return "toy_identity()"; }
  absl::StatusOr<size_t> MaxEncodedBytes(absl::Span<const int64_t> shape) const override {
    absl::StatusOr<int64_t> n = NumElements(shape);
    if (!n.ok()) return n.status();
    return PayloadBytes(shape.size(), 0, 4 * static_cast<size_t>(*n));
  }
  absl::StatusOr<size_t> Encode(const TensorView& input, CodecState* /*state*/,
                                absl::Span<uint8_t> out) const override {
    PayloadWriter writer;
    const size_t body = 4 * static_cast<size_t>(input.num_elements());
    absl::Status status =
        writer.Begin(out, kToyId, /*codec_version=*/1, DType::kF32, input.shape(), 0, body);
    if (!status.ok()) return status;
    if (body > 0) std::memcpy(writer.body().data(), input.data(), body);
    return writer.Finish();
  }

  struct Scratch final : CodecScratch {
    std::vector<float> acc;
  };
  std::unique_ptr<CodecScratch> NewDecodeScratch() const override {
    ++scratches_made;
    return std::make_unique<Scratch>();
  }
  absl::Status PrepareDecode(const DecodeCall& call, CodecScratch* /*scratch*/) const override {
    for (size_t r = 0; r < call.infos.size(); ++r) {
      const PayloadInfo& info = call.infos[r];
      if (info.codec_version != 1 || !info.params.empty() ||
          info.body.size() != 4 * static_cast<size_t>(info.num_elements)) {
        return absl::DataLossError(absl::StrCat("corrupt toy payload ", r));
      }
    }
    return absl::OkStatus();
  }
  void ApplyDecode(const DecodeCall& call, CodecScratch* scratch) const override {
    auto& s = static_cast<Scratch&>(*scratch);
    const size_t n = static_cast<size_t>(call.out.num_elements());
    s.acc.assign(n, 0.0f);
    for (const PayloadInfo& info : call.infos) {
      for (size_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, info.body.data() + 4 * i, 4);
        s.acc[i] += v;
      }
    }
    const float divide =
        call.options.aggregation == Aggregation::kSum ? 1.0f : call.infos.size();
    float* o = call.out.data_as<float>();
    for (size_t i = 0; i < n; ++i) o[i] = (call.options.accumulate ? o[i] : 0) + s.acc[i] / divide;
  }
  absl::Status Inspect(const PayloadInfo& info, PayloadSummary* summary) const override {
    if (info.body.size() != 4 * static_cast<size_t>(info.num_elements)) {
      return absl::DataLossError("corrupt toy payload");
    }
    summary->selected = info.num_elements;
    summary->details = "toy: fp32 as is";
    return absl::OkStatus();
  }

  static inline int scratches_made = 0;

 private:
  absl::string_view name_;
};

LBCC_REGISTER_CODEC(std::make_unique<ToyCodec>());

std::vector<uint8_t> EncodeToy(std::vector<float> values, Shape shape) {
  const ToyCodec codec;
  std::vector<uint8_t> out(*codec.MaxEncodedBytes(shape));
  const TensorView view = *TensorView::Host(values.data(), shape);
  absl::StatusOr<size_t> size = codec.Encode(view, nullptr, absl::MakeSpan(out));
  EXPECT_THAT(size.status(), IsOk());
  out.resize(*size);
  return out;
}

TEST(CodecRegistryTest, ToyCodecRoundTripsThroughTheFreeFunctions) {
  const std::vector<uint8_t> a = EncodeToy({1, 2, 3, 4, 5, 6}, {2, 3});
  const std::vector<uint8_t> b = EncodeToy({3, 2, 1, 0, -1, -2}, {2, 3});
  const std::vector<absl::Span<const uint8_t>> payloads = {a, b};
  std::vector<float> out(6, 7.0f);
  const TensorView view = *TensorView::Host(out.data(), {2, 3});
  const int scratches_before = ToyCodec::scratches_made;
  DecodeScratch scratch;
  ASSERT_THAT(DecodeAccumulate(payloads, {Aggregation::kMean, false}, view, &scratch), IsOk());
  EXPECT_THAT(out, ElementsAre(2, 2, 2, 2, 2, 2));
  ASSERT_THAT(DecodeAccumulate(payloads, {Aggregation::kSum, true}, view, &scratch), IsOk());
  EXPECT_THAT(out, ElementsAre(6, 6, 6, 6, 6, 6));
  // The two-step form, and the codec's scratch made once per DecodeScratch.
  ASSERT_THAT(PrepareDecode(absl::MakeConstSpan(payloads).subspan(0, 1), {}, view, &scratch),
              IsOk());
  ASSERT_THAT(ApplyDecode(&scratch), IsOk());
  EXPECT_THAT(out, ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_EQ(ToyCodec::scratches_made - scratches_before, 1);

  LBCC_ASSERT_OK_AND_ASSIGN(PayloadSummary summary, InspectPayload(a));
  EXPECT_EQ(summary.codec, kToyId);
  EXPECT_EQ(summary.selected, 6);
  EXPECT_EQ(summary.total_bytes, a.size());
  EXPECT_EQ(summary.details, "toy: fp32 as is");
  EXPECT_EQ(CodecName(kToyId), "toy_identity");
  EXPECT_NE(FindCodec(kToyId), nullptr);
  EXPECT_THAT(RegisteredCodecs(), Contains(kToyId));
  EXPECT_THAT(RegisteredCodecs(), Contains(CodecId::kTopKEf));
  EXPECT_THAT(RegisteredCodecs(), Contains(CodecId::kDenseQuant));
}

TEST(CodecRegistryTest, ACorruptToyPayloadIsDataLossAndNothingIsWritten) {
  // 5 elements declared, a body of 16 bytes, sealed: only the codec can tell.
  PayloadWriter writer;
  std::vector<uint8_t> resealed(PayloadBytes(1, 0, 16));
  ASSERT_THAT(writer.Begin(absl::MakeSpan(resealed), kToyId, 1, DType::kF32, {5}, 0, 16), IsOk());
  writer.Finish();
  const absl::Span<const uint8_t> span(resealed);
  std::vector<float> out(5, 7.0f);
  EXPECT_THAT(DecodeAccumulate(absl::MakeConstSpan(&span, 1), {},
                               *TensorView::Host(out.data(), {5})),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("toy")));
  EXPECT_THAT(out, Each(7.0f));
  EXPECT_THAT(InspectPayload(resealed), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(CodecRegistryTest, AnUnknownCodecIdIsDataLoss) {
  std::vector<uint8_t> payload(PayloadBytes(1, 0, 16));
  PayloadWriter writer;
  ASSERT_THAT(writer.Begin(absl::MakeSpan(payload), kUnregisteredId, 1, DType::kF32, {4}, 0, 16),
              IsOk());
  writer.Finish();
  EXPECT_FALSE(IsKnownCodec(static_cast<uint16_t>(kUnregisteredId)));
  EXPECT_EQ(CodecName(kUnregisteredId), "unknown");
  EXPECT_EQ(FindCodec(kUnregisteredId), nullptr);
  EXPECT_THAT(ParsePayload(payload),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("unknown codec id 1002")));
  EXPECT_THAT(InspectPayload(payload), StatusIs(absl::StatusCode::kDataLoss));
  const absl::Span<const uint8_t> span(payload);
  std::vector<float> out(4, 7.0f);
  const TensorView view = *TensorView::Host(out.data(), {4});
  EXPECT_THAT(DecodeAccumulate(absl::MakeConstSpan(&span, 1), {}, view),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("unknown codec id")));
  DecodeScratch scratch;
  EXPECT_THAT(PrepareDecode(absl::MakeConstSpan(&span, 1), {}, view, &scratch),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(ApplyDecode(&scratch), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(out, Each(7.0f));
}

TEST(CodecRegistryTest, AnIdIsClaimedOnce) {
  // Another codec under a taken id: refused, the first stays.
  const Codec* toy = FindCodec(kToyId);
  EXPECT_FALSE(RegisterCodec(std::make_unique<ToyCodec>("not_the_toy")));
  EXPECT_FALSE(ClaimCodecId(static_cast<uint16_t>(CodecId::kTopKEf), "not_topk"));
  // The same codec again (a second copy of its library): accepted, the first object kept.
  EXPECT_TRUE(RegisterCodec(std::make_unique<ToyCodec>()));
  EXPECT_EQ(FindCodec(kToyId), toy);
  EXPECT_EQ(CodecName(kToyId), "toy_identity");
  // Ids outside [1, kMaxCodecId].
  EXPECT_FALSE(ClaimCodecId(0, "zero"));
  EXPECT_FALSE(ClaimCodecId(kMaxCodecId + 1, "too_large"));
  EXPECT_FALSE(IsKnownCodec(kMaxCodecId + 1));
}

TEST(CodecRegistryTest, ADeviceTwinAttachesOnce) {
  static DeviceTwin twin, other;
  EXPECT_EQ(FindDeviceTwin(kToyId), nullptr);
  EXPECT_TRUE(AttachDeviceTwin(kToyId, &twin));
  EXPECT_TRUE(AttachDeviceTwin(kToyId, &twin));
  EXPECT_FALSE(AttachDeviceTwin(kToyId, &other));
  EXPECT_EQ(FindDeviceTwin(kToyId), &twin);
  EXPECT_FALSE(AttachDeviceTwin(CodecId{0}, &other));
}

// A device twin's state given to a CPU codec: refused by the codec itself.
class FakeDeviceState final : public CodecState {
 public:
  CodecId codec() const override { return CodecId::kTopKEf; }
  bool has_pending() const override { return false; }
  absl::Status Commit() override { return absl::OkStatus(); }
  absl::Status Abort() override { return absl::OkStatus(); }
  bool is_device() const override { return true; }
  int device() const override { return 0; }
};

TEST(CodecRegistryTest, TheCpuCodecRefusesADeviceState) {
  auto codec = *TopKEfCodec::Create({});
  std::vector<float> delta(64 * 64, 1.0f);
  std::vector<uint8_t> out(*codec->MaxEncodedBytes({64, 64}));
  FakeDeviceState state;
  EXPECT_THAT(codec->Encode(*TensorView::Host(delta.data(), {64, 64}), &state,
                            absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device state")));
  EXPECT_FALSE(codec->NewState()->is_device());
}

}  // namespace
}  // namespace lbcc::codecs
