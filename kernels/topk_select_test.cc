// The select step (topk_select.h) alone, against a sort: e' bit for bit, the k entries of largest
// |e'| (ties to the lower local position) in ascending order, the adaptive index lengths and the
// first non-finite chunk. The cases are those the radix select treats specially: T's 12-bit bin
// small enough to rank (up to kSelectCandidates entries) or not (a second and third pass), ties
// across the threshold, all-equal and mostly-equal chunks, tiny and odd chunks, k = 1, n - 1 and
// n, zeros of both signs, subnormals, the largest floats, infinities and NaN.
//
// Built twice: topk_select_test on the emulated backend (every build), topk_select_gpu_test
// (LBCC_TEST_ON_GPU, tag gpu) on the CUDA backend, skipping without a device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/device_codec.h"
#include "kernels/hd.h"
#include "kernels/topk_select.h"

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

template <typename T>
DeviceBuffer Upload(const std::vector<T>& host) {
  absl::StatusOr<DeviceBuffer> b =
      DeviceBuffer::Allocate(*TestBackend(), std::max<size_t>(16, sizeof(T) * host.size()), 0);
  LBCC_CHECK(b.ok()) << b.status();
  LBCC_CHECK(b->CopyFromHost({reinterpret_cast<const uint8_t*>(host.data()),
                              sizeof(T) * host.size()})
                 .ok());
  return *std::move(b);
}

template <typename T>
std::vector<T> Download(const DeviceBuffer& b, size_t n) {
  std::vector<T> host(n);
  LBCC_CHECK(b.CopyToHost({reinterpret_cast<uint8_t*>(host.data()), sizeof(T) * n}).ok());
  return host;
}

struct Case {
  std::string name;
  int64_t h = 64, w = 64;    // chunk shape
  int64_t cy = 1, cx = 1;    // chunks down and across
  int64_t k = 64;
  float beta = 1.0f, lr = 1.0f;
  std::vector<float> e, delta;  // rows x cols, row-major
};

int64_t Rows(const Case& c) { return c.h * c.cy; }
int64_t Cols(const Case& c) { return c.w * c.cx; }

// Runs the select step on the backend under test and compares everything with a sort.
void CheckSelect(const Case& c) {
  SCOPED_TRACE(c.name);
  Backend& be = *TestBackend();
  const int64_t rows = Rows(c), cols = Cols(c), size = rows * cols;
  ASSERT_EQ(static_cast<int64_t>(c.e.size()), size);
  ASSERT_EQ(static_cast<int64_t>(c.delta.size()), size);
  Geometry g;
  g.rows = rows;
  g.cols = cols;
  g.h = c.h;
  g.w = c.w;
  g.chunk_len = c.h * c.w;
  g.chunks_x = c.cx;
  g.num_chunks = c.cy * c.cx;
  const int64_t n = g.chunk_len, k = std::min(c.k, n);
  ASSERT_GE(k, 1);
  ASSERT_LE(n, kSelectThreads * kSelectPerThread);

  const DeviceBuffer e = Upload(c.e), delta = Upload(c.delta);
  const DeviceBuffer next = Upload(std::vector<float>(size, 0.0f));
  const DeviceBuffer sel_local = Upload(std::vector<uint16_t>(g.num_chunks * k, 0xFFFF));
  const DeviceBuffer sel_value = Upload(std::vector<float>(g.num_chunks * k, -1.0f));
  const DeviceBuffer bits6 = Upload(std::vector<uint32_t>(g.num_chunks, 0));
  const DeviceBuffer bits7 = Upload(std::vector<uint32_t>(g.num_chunks, 0));
  const DeviceBuffer bad = Upload(std::vector<int32_t>{std::numeric_limits<int32_t>::max()});

  SelectArgs a;
  a.g = g;
  a.k = k;
  a.beta = c.beta;
  a.lr = c.lr;
  a.rice6 = 2;
  a.rice7 = 3;
  a.e = static_cast<const float*>(e.data());
  a.delta = static_cast<const float*>(delta.data());
  a.next = static_cast<float*>(next.data());
  a.vec4 = CanLoadVec4(g, a.e, a.delta, a.next);
  a.sel_local = static_cast<uint16_t*>(sel_local.data());
  a.sel_value = static_cast<float*>(sel_value.data());
  a.bits6 = static_cast<uint32_t*>(bits6.data());
  a.bits7 = static_cast<uint32_t*>(bits7.data());
  a.bad_chunk = static_cast<int32_t*>(bad.data());
  ASSERT_TRUE(be.Select(a, nullptr).ok());
  ASSERT_TRUE(be.Synchronize(nullptr).ok());

  const std::vector<float> got_next = Download<float>(next, size);
  const std::vector<uint16_t> got_local = Download<uint16_t>(sel_local, g.num_chunks * k);
  const std::vector<float> got_value = Download<float>(sel_value, g.num_chunks * k);
  const std::vector<uint32_t> got6 = Download<uint32_t>(bits6, g.num_chunks);
  const std::vector<uint32_t> got7 = Download<uint32_t>(bits7, g.num_chunks);
  const int32_t got_bad = Download<int32_t>(bad, 1)[0];

  std::vector<float> want_next(size);
  for (int64_t i = 0; i < size; ++i) {
    want_next[i] = hd::Add(hd::Mul(c.beta, c.e[i]), hd::Mul(c.lr, c.delta[i]));
    // A GPU's NaN results are canonical; any NaN is the CPU's NaN here.
    if (std::isnan(want_next[i])) {
      ASSERT_TRUE(std::isnan(got_next[i])) << "e' at " << i;
    } else {
      ASSERT_EQ(hd::Bits(got_next[i]), hd::Bits(want_next[i])) << "e' at " << i;
    }
  }
  int32_t want_bad = std::numeric_limits<int32_t>::max();
  std::vector<int64_t> order(n);
  for (int64_t ch = 0; ch < g.num_chunks; ++ch) {
    const int64_t corner = ChunkCorner(g, ch);
    std::vector<uint32_t> key(n);
    std::vector<float> value(n);
    for (int64_t l = 0; l < n; ++l) {
      value[l] = got_next[corner + LocalOffset(g, l)];
      key[l] = hd::AbsBits(value[l]);
      if (key[l] > hd::kMaxFiniteAbsBits && want_bad == std::numeric_limits<int32_t>::max()) {
        want_bad = static_cast<int32_t>(ch);
      }
    }
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return key[x] > key[y]; });
    std::vector<int64_t> chosen(order.begin(), order.begin() + k);
    std::sort(chosen.begin(), chosen.end());
    std::vector<uint32_t> sub(64, 0);
    for (int64_t j = 0; j < k; ++j) {
      ASSERT_EQ(got_local[ch * k + j], chosen[j]) << "chunk " << ch << " slot " << j;
      ASSERT_EQ(hd::Bits(got_value[ch * k + j]), hd::Bits(value[chosen[j]]))
          << "chunk " << ch << " slot " << j;
      ++sub[chosen[j] >> 6];
    }
    uint32_t want6 = 0, want7 = 0;
    for (int64_t s = 0; s * 64 < n; ++s) {
      want6 += SubBlockBits(sub[s], static_cast<uint32_t>(std::min<int64_t>(64, n - 64 * s)), 6,
                            a.rice6);
    }
    for (int64_t s = 0; s * 128 < n; ++s) {
      const uint32_t count = sub[2 * s] + (2 * s + 1 < 64 ? sub[2 * s + 1] : 0);
      want7 += SubBlockBits(count, static_cast<uint32_t>(std::min<int64_t>(128, n - 128 * s)), 7,
                            a.rice7);
    }
    EXPECT_EQ(got6[ch], want6) << "chunk " << ch;
    EXPECT_EQ(got7[ch], want7) << "chunk " << ch;
  }
  EXPECT_EQ(got_bad, want_bad);
}

// A case whose e is zero and delta = f(chunk, local position).
Case Make(std::string name, int64_t h, int64_t w, int64_t cy, int64_t cx, int64_t k,
          const std::function<float(int64_t, int64_t)>& f) {
  Case c;
  c.name = std::move(name);
  c.h = h;
  c.w = w;
  c.cy = cy;
  c.cx = cx;
  c.k = k;
  const int64_t cols = Cols(c);
  c.e.assign(Rows(c) * cols, 0.0f);
  c.delta.assign(Rows(c) * cols, 0.0f);
  for (int64_t y = 0; y < cy; ++y) {
    for (int64_t x = 0; x < cx; ++x) {
      for (int64_t l = 0; l < h * w; ++l) {
        const int64_t r = y * h + l / w, col = x * w + l % w;
        c.delta[r * cols + col] = f(y * cx + x, l);
      }
    }
  }
  return c;
}

TEST(SelectTest, GaussianChunksAtEveryScale) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // 32 chunks whose scales step through an octave in sixteenths, so T's bin sits anywhere in
  // its exponent; a second run with nonzero e exercises the EF update.
  Case c = Make("gaussian", 64, 64, 4, 8, 64, [&](int64_t ch, int64_t) {
    return normal(rng) * std::ldexp(1.0f + static_cast<float>(ch % 16) / 16.0f,
                                    static_cast<int>(ch / 16) * 7 - 3);
  });
  CheckSelect(c);
  for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{300}, int64_t{4095}, int64_t{4096}}) {
    c.k = k;
    c.name = absl::StrCat("gaussian k=", k);
    CheckSelect(c);
  }
  for (float& x : c.e) x = normal(rng) * 0.3f;
  c.beta = 0.9f;
  c.lr = 0.37f;
  c.k = 64;
  c.name = "gaussian with error feedback";
  CheckSelect(c);
}

TEST(SelectTest, AllEqualAndAllZeroChunks) {
  LBCC_SKIP_WITHOUT_BACKEND();
  for (int64_t k : {int64_t{1}, int64_t{64}, int64_t{255}, int64_t{256}, int64_t{257},
                    int64_t{4095}}) {
    CheckSelect(Make(absl::StrCat("equal k=", k), 64, 64, 1, 2, k, [](int64_t ch, int64_t) {
      return ch == 0 ? 1.5f : -1.5f;
    }));
    // Zeros of both signs have the same key.
    CheckSelect(Make(absl::StrCat("zero k=", k), 64, 64, 1, 2, k, [](int64_t ch, int64_t l) {
      return ch == 1 && l % 3 == 0 ? -0.0f : 0.0f;
    }));
  }
}

TEST(SelectTest, TiesAcrossTheThreshold) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(2);
  // Few distinct magnitudes: T is shared by tens (64 values) or hundreds (8 values) of entries
  // in one bin, so the rank finish and the later passes both break ties.
  for (int distinct : {8, 64, 1000}) {
    std::uniform_int_distribution<int> pick(0, distinct - 1);
    for (int64_t k : {int64_t{1}, int64_t{64}, int64_t{500}, int64_t{2048}}) {
      CheckSelect(Make(absl::StrCat("ties ", distinct, " k=", k), 64, 64, 2, 2, k,
                       [&](int64_t, int64_t) {
                         const float v = static_cast<float>(pick(rng) + 1) / 16.0f;
                         return rng() & 1 ? v : -v;
                       }));
    }
  }
}

// T's 12-bit bin (keys sharing their top 12 bits) holds `in_bin` entries, `above` of
// the chunk's entries lie above it and the rest below; k picks T at several depths in the bin.
Case BinCase(int in_bin, int above, int64_t k, bool equal_low_bits, std::mt19937& rng) {
  const uint32_t base = hd::AbsBits(1.0f) | (5u << 19);  // one 12-bit bin
  std::vector<float> chunk(4096);
  for (int l = 0; l < 4096; ++l) {
    uint32_t bits;
    if (l < above) {
      bits = hd::AbsBits(4.0f) + static_cast<uint32_t>(l);
    } else if (l < above + in_bin) {
      // Scattered low 19 bits (or only the low 7 differ: the third pass decides).
      const uint32_t low = equal_low_bits ? static_cast<uint32_t>(l % 100)
                                          : static_cast<uint32_t>((l * 2654435761u) & 0x7FFFFu);
      bits = base | low;
    } else {
      bits = hd::AbsBits(0.25f) + static_cast<uint32_t>(l);
    }
    chunk[l] = hd::Float(bits);
  }
  std::shuffle(chunk.begin(), chunk.end(), rng);
  return Make(absl::StrCat("bin ", in_bin, " above ", above, " k=", k,
                           equal_low_bits ? " low 7 bits" : ""),
              64, 64, 1, 1, k, [&](int64_t, int64_t l) { return chunk[l]; });
}

TEST(SelectTest, ThresholdBinAroundTheRankLimit) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(3);
  for (int in_bin : {kSelectCandidates - 1, kSelectCandidates, kSelectCandidates + 1, 1000}) {
    for (int64_t k : {int64_t{11}, int64_t{12}, int64_t{100}, int64_t{10} + in_bin}) {
      CheckSelect(BinCase(in_bin, 10, k, false, rng));
      CheckSelect(BinCase(in_bin, 10, k, true, rng));
    }
  }
}

TEST(SelectTest, MostlyZeroChunks) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // 40 nonzero entries: k above that takes zeros, the first ones by position.
  for (int64_t k : {int64_t{39}, int64_t{40}, int64_t{41}, int64_t{64}, int64_t{3000}}) {
    CheckSelect(Make(absl::StrCat("mostly zero k=", k), 64, 64, 1, 2, k,
                     [&](int64_t ch, int64_t l) {
                       return (l * 97 + ch) % 4096 < 40 ? normal(rng) : 0.0f;
                     }));
  }
}

TEST(SelectTest, TinyAndOddChunks) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Chunk lengths that are not multiples of a thread's 16 positions or of 4 (no vector loads).
  const int64_t shapes[][2] = {{1, 1}, {1, 2}, {2, 2}, {1, 4}, {3, 7}, {4, 4}, {5, 13}, {17, 3},
                               {8, 8}, {31, 33}, {64, 63}, {63, 65}};
  for (const auto& s : shapes) {
    const int64_t n = s[0] * s[1];
    for (int64_t k : {int64_t{1}, n / 2, n - 1, n}) {
      if (k < 1) continue;
      CheckSelect(Make(absl::StrCat(s[0], "x", s[1], " k=", k), s[0], s[1], 2, 3, k,
                       [&](int64_t, int64_t) { return normal(rng); }));
      // Many ties in small chunks.
      CheckSelect(Make(absl::StrCat(s[0], "x", s[1], " ties k=", k), s[0], s[1], 2, 3, k,
                       [&](int64_t, int64_t) { return static_cast<float>(rng() % 3); }));
    }
  }
}

TEST(SelectTest, ExtremeMagnitudes) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(6);
  const float special[] = {0.0f,
                           -0.0f,
                           std::numeric_limits<float>::denorm_min(),
                           -std::numeric_limits<float>::denorm_min() * 3,
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(),
                           1.0f};
  for (int64_t k : {int64_t{1}, int64_t{64}, int64_t{2000}}) {
    CheckSelect(Make(absl::StrCat("extremes k=", k), 64, 64, 1, 2, k,
                     [&](int64_t, int64_t) { return special[rng() % 8]; }));
    // Subnormals only: keys below 2^23, the first pass puts them all in a few bins.
    CheckSelect(Make(absl::StrCat("subnormal k=", k), 64, 64, 1, 2, k, [&](int64_t, int64_t) {
      return hd::Float(static_cast<uint32_t>(rng() % 5000));
    }));
  }
}

// Non-finite e' marks the first such chunk; the selection treats the keys like any other (the
// encode then fails and commits nothing), but must still be a valid selection.
TEST(SelectTest, NonFiniteValuesMarkTheFirstChunk) {
  LBCC_SKIP_WITHOUT_BACKEND();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CheckSelect(Make("non-finite", 64, 64, 2, 2, 64, [&](int64_t ch, int64_t l) {
    if (ch == 1 && l == 77) return nan;
    if (ch == 2 && l % 500 == 0) return -inf;
    if (ch == 3 && l < 100) return l % 2 ? inf : -nan;
    return normal(rng);
  }));
}

}  // namespace
}  // namespace lbcc::kernels
