// The block-model index writers of topk_encode.h, run on HostBlock, against codecs/
// index_coding.h's encoders byte for byte: odd chunk lengths, chunk boundaries anywhere in a
// word, both sub-block sizes, every Rice parameter, bitmaps and offsets, long unary counts.
#include "kernels/topk_encode.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "codecs/index_coding.h"
#include "gtest/gtest.h"
#include "kernels/block.h"

namespace lbcc::kernels {
namespace {

// `num_chunks` chunks of k ascending positions < chunk_len. `pattern` 0: uniform; 1: packed
// into the chunk's first positions (full sub-blocks: bitmaps and long unary counts); 2: the
// last positions (the short last sub-block); 3: a mix per chunk.
std::vector<uint16_t> Selection(int64_t num_chunks, int64_t k, int64_t chunk_len, int pattern,
                                std::mt19937& rng) {
  std::vector<uint16_t> out;
  std::vector<uint16_t> all(static_cast<size_t>(chunk_len));
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int kind = pattern == 3 ? static_cast<int>(c % 3) : pattern;
    for (int64_t l = 0; l < chunk_len; ++l) all[l] = static_cast<uint16_t>(l);
    std::vector<uint16_t> chosen;
    if (kind == 0) {
      std::shuffle(all.begin(), all.end(), rng);
      chosen.assign(all.begin(), all.begin() + k);
    } else if (kind == 1) {
      chosen.assign(all.begin(), all.begin() + k);
    } else {
      chosen.assign(all.end() - k, all.end());
    }
    std::sort(chosen.begin(), chosen.end());
    out.insert(out.end(), chosen.begin(), chosen.end());
  }
  return out;
}

// The device pipeline's adaptive writer: per-chunk lengths (the selection's formula), their
// exclusive scan, then WriteAdaptiveChunk per chunk on one HostBlock.
std::vector<uint8_t> WriteWithBlocks(const std::vector<uint16_t>& local,
                                     const codecs::IndexLayout& layout, int b, int p,
                                     uint64_t* total_bits) {
  const int64_t size = int64_t{1} << b;
  const int64_t num_sub = (layout.chunk_len + size - 1) / size;
  std::vector<uint64_t> first(static_cast<size_t>(layout.num_chunks));
  uint64_t bits = 0;
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    first[c] = bits;
    std::vector<uint32_t> counts(static_cast<size_t>(num_sub), 0u);
    for (int64_t t = 0; t < layout.k; ++t) ++counts[local[c * layout.k + t] >> b];
    for (int64_t j = 0; j < num_sub; ++j) {
      const int64_t s = std::min(size, layout.chunk_len - j * size);
      bits += SubBlockBits(counts[j], static_cast<uint32_t>(s), b, p);
    }
  }
  *total_bits = bits;
  // Room for the stream plus a guard word that must stay zero.
  std::vector<uint32_t> words(static_cast<size_t>(bits / 32 + 2), 0u);
  HostBlock<AdaptiveShared, AdaptiveLocal> block(kAdaptiveThreads);
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    WriteAdaptiveChunk(block, local.data() + c * layout.k, layout.k, layout.chunk_len, b, p,
                       first[c], words.data());
  }
  std::vector<uint8_t> bytes(words.size() * 4);
  std::memcpy(bytes.data(), words.data(), bytes.size());  // little-endian host
  return bytes;
}

TEST(AdaptiveWriterTest, MatchesCpuEncoderOnOddShapesBothSubBlocksEveryRice) {
  std::mt19937 rng(11);
  int cases = 0;
  for (int64_t chunk_len : {1, 2, 5, 31, 63, 64, 65, 100, 127, 128, 129, 1000, 4000, 4095, 4096}) {
    std::vector<int64_t> ks = {1, 2, chunk_len / 64 + 1, chunk_len / 8 + 1, chunk_len / 2 + 1,
                               chunk_len};
    for (int64_t k : ks) {
      k = std::clamp<int64_t>(k, 1, chunk_len);
      for (int64_t num_chunks : {1, 3, 7}) {
        for (int pattern = 0; pattern < 4; ++pattern) {
          const std::vector<uint16_t> local = Selection(num_chunks, k, chunk_len, pattern, rng);
          const codecs::IndexLayout layout{num_chunks, k, chunk_len};
          for (int b : {6, 7}) {
            for (int p = 0; p <= b; ++p) {
              SCOPED_TRACE(::testing::Message() << "chunk_len " << chunk_len << " k " << k
                                                << " chunks " << num_chunks << " pattern "
                                                << pattern << " b " << b << " p " << p);
              const codecs::AdaptiveParams params{b, p};
              const uint64_t bits = codecs::AdaptiveBits(local, layout, params);
              std::vector<uint8_t> want((bits + 7) / 8);
              codecs::EncodeAdaptive(local, layout, params, absl::MakeSpan(want));
              uint64_t got_bits = 0;
              const std::vector<uint8_t> got = WriteWithBlocks(local, layout, b, p, &got_bits);
              ASSERT_EQ(got_bits, bits);
              ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin()));
              // Nothing past the stream (zero padding to the byte, untouched words after).
              for (size_t i = want.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 0) << i;
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 10000);
}

}  // namespace
}  // namespace lbcc::kernels
