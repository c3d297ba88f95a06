// Steady-state calls do not allocate: counts every operator new in this binary around the
// second and later Encode / EncodeStreamed / Commit / DecodeAccumulate calls.
#include <atomic>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>

#include "base/status_matchers.h"
#include "codecs/codec.h"
#include "codecs/dense_quant.h"
#include "codecs/topk_ef.h"
#include "gtest/gtest.h"

namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace

void* operator new(size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace lbcc::codecs {
namespace {

using ::lbcc::testing::IsOk;

std::vector<float> Normals(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

struct CountingObserver : EncodeObserver {
  void Append(absl::Span<const uint8_t> b) override { bytes += b.size(); }
  void Discard() override { bytes = 0; }
  size_t bytes = 0;
};

TEST(CodecAllocTest, SteadyStateEncodeCommitAndDecodeDoNotAllocate) {
  const Shape shape = {256, 320};
  const int64_t n = 256 * 320;
  for (IndexCoding indices : {IndexCoding::kPacked12, IndexCoding::kAdaptive, IndexCoding::kAuto}) {
    TopKEfOptions options;
    options.indices = indices;
    auto codec = *TopKEfCodec::Create(options);
    auto dense = *DenseQuantCodec::Create({});
    TopKEfState state;
    DecodeScratch scratch;
    std::vector<float> delta = Normals(n, 1), out(n);
    const TensorView view = *TensorView::Host(delta.data(), shape);
    const TensorView out_view = *TensorView::Host(out.data(), shape);
    std::vector<std::vector<uint8_t>> payloads(
        3, std::vector<uint8_t>(*codec->MaxEncodedBytes(shape)));
    std::vector<uint8_t> dense_payload(*dense->MaxEncodedBytes(shape));
    std::vector<absl::Span<const uint8_t>> spans(3);
    CountingObserver counter;
    for (int round = 0; round < 3; ++round) {
      const int64_t before = g_allocations.load();
      for (int r = 0; r < 3; ++r) {
        // The third replica's encode is streamed (the observer only counts).
        absl::StatusOr<size_t> size =
            r == 2 ? codec->EncodeStreamed(view, &state, absl::MakeSpan(payloads[r]), &counter)
                   : codec->Encode(view, &state, absl::MakeSpan(payloads[r]));
        ASSERT_TRUE(size.ok());
        ASSERT_TRUE(state.Commit().ok());
        spans[r] = absl::MakeConstSpan(payloads[r]).subspan(0, *size);
      }
      ASSERT_TRUE(DecodeAccumulate(spans, {}, out_view, &scratch).ok());
      ASSERT_TRUE(DecodeAccumulate(spans, {Aggregation::kSum, true}, out_view, &scratch).ok());
      absl::StatusOr<size_t> dense_size =
          dense->Encode(view, nullptr, absl::MakeSpan(dense_payload));
      ASSERT_TRUE(dense_size.ok());
      const absl::Span<const uint8_t> dense_span(dense_payload.data(), *dense_size);
      ASSERT_TRUE(
          DecodeAccumulate(absl::MakeConstSpan(&dense_span, 1), {}, out_view, &scratch).ok());
      const int64_t allocations = g_allocations.load() - before;
      if (round > 0) EXPECT_EQ(allocations, 0) << "round " << round;
      EXPECT_GT(counter.bytes, 0u);
    }
  }
}

}  // namespace
}  // namespace lbcc::codecs
