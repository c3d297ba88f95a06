// Writes the fuzzers' seed corpora: small valid payloads of every coding, each prefixed with the
// fuzzers' mode byte (see topk_ef_fuzz.cc).
//
//   bazel run //codecs:make_fuzz_seeds -- $PWD/codecs/testdata
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "codecs/dense_quant.h"
#include "codecs/topk_ef.h"

namespace {

using namespace lbcc::codecs;

void Write(const std::string& path, uint8_t mode, const std::vector<uint8_t>& payload) {
  FILE* f = std::fopen(path.c_str(), "wb");
  LBCC_CHECK(f != nullptr) << path;
  std::fputc(mode, f);
  std::fwrite(payload.data(), 1, payload.size(), f);
  std::fclose(f);
}

std::vector<float> Normals(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<uint8_t> Encode(const Codec& codec, lbcc::Shape shape, lbcc::codecs::CodecState* state,
                            uint32_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> x = Normals(n, seed);
  std::vector<uint8_t> out(*codec.MaxEncodedBytes(shape));
  const size_t size =
      *codec.Encode(*lbcc::TensorView::Host(x.data(), shape), state, absl::MakeSpan(out));
  out.resize(size);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds <testdata folder>\n");
    return 2;
  }
  const std::string root = argv[1];
  const std::vector<lbcc::Shape> shapes = {{8, 8}, {61, 3}, {130}, {}, {2, 3, 5}, {64, 70}};
  const ValueCoding values[] = {
      ValueCoding::kBinMean2, ValueCoding::kF32,      ValueCoding::kBf16,    ValueCoding::kF16,
      ValueCoding::kBinMean4, ValueCoding::kBinMean8, ValueCoding::kAbsmax8, ValueCoding::kAbsmax4};
  int n = 0;
  for (size_t s = 0; s < shapes.size(); ++s) {
    for (ValueCoding v : values) {
      for (IndexCoding i : {IndexCoding::kPacked12, IndexCoding::kAdaptive}) {
        TopKEfOptions options;
        options.values = v;
        options.indices = i;
        options.top_k = s % 2 ? 64 : 700;
        options.value_block = 5;
        auto codec = *TopKEfCodec::Create(options);
        TopKEfState state;
        const uint8_t mode =
            static_cast<uint8_t>(1 | ((n % 3) << 1) | ((n % 2) << 3) | ((n % 5 == 0) << 4));
        Write(root + "/topk_ef_corpus/seed_" + std::to_string(n++), mode,
              Encode(*codec, shapes[s], &state, static_cast<uint32_t>(n)));
      }
    }
  }
  // templar's options (k per chunk), flat 1-D chunks (payload version 2), and the median-norm
  // clip (mode bit 5), over shapes where the rules differ from the defaults.
  const std::vector<lbcc::Shape> compat_shapes = {{8192}, {5000}, {100, 30}, {130}};
  int c = 0;
  for (const lbcc::Shape& shape : compat_shapes) {
    for (Chunk1D chunk_1d : {Chunk1D::kTemplar, Chunk1D::kFlat4096}) {
      for (IndexCoding i : {IndexCoding::kPacked12, IndexCoding::kAdaptive}) {
        TopKEfOptions options = TopKEfOptions::Templar();
        options.chunk_1d = chunk_1d;
        options.indices = i;
        auto codec = *TopKEfCodec::Create(options);
        TopKEfState state;
        const uint8_t mode = static_cast<uint8_t>(1 | ((c % 3) << 1) | ((c % 2) << 4) | (1 << 5));
        Write(root + "/topk_ef_corpus/compat_" + std::to_string(c++), mode,
              Encode(*codec, shape, &state, static_cast<uint32_t>(c)));
      }
    }
  }
  n = 0;
  for (const lbcc::Shape& shape : {lbcc::Shape{40}, lbcc::Shape{3, 17}, lbcc::Shape{}}) {
    for (DenseFormat f :
         {DenseFormat::kInt8, DenseFormat::kInt4, DenseFormat::kF16, DenseFormat::kBf16}) {
      for (bool stochastic : {false, true}) {
        auto codec = *DenseQuantCodec::Create({f, 16, stochastic, 3});
        const uint8_t mode =
            static_cast<uint8_t>(1 | ((n % 3) << 1) | ((n % 2) << 3) | ((n % 4 == 0) << 4));
        Write(root + "/dense_quant_corpus/seed_" + std::to_string(n++), mode,
              Encode(*codec, shape, nullptr, static_cast<uint32_t>(n)));
      }
    }
  }
  // A payload with a stale checksum (mode 0 keeps it): exercises the rejection path.
  auto codec = *TopKEfCodec::Create({});
  TopKEfState state;
  std::vector<uint8_t> stale = Encode(*codec, {16, 16}, &state, 1);
  stale[stale.size() - 1] ^= 1;
  Write(root + "/topk_ef_corpus/stale_checksum", 0, stale);
  std::printf("wrote seeds under %s\n", root.c_str());
  return 0;
}
