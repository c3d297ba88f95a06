// Writes the seed corpus of subspace_fuzz into a folder: valid forward and backward payloads of
// every coefficient dtype for each fuzz basis, and a basis file image, each prefixed with its
// mode byte (see subspace_fuzz_bases.h).
//
//   bazel run //codecs:subspace_fuzz_corpus -- $PWD/codecs/testdata/subspace_corpus
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/fuzz_seed_file.h"
#include "codecs/subspace_fuzz_bases.h"

namespace {

using namespace lbcc::codecs;  // NOLINT: a small tool

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <folder>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t tokens = 5, d = 16;
  std::vector<float> h(tokens * d);
  for (int64_t i = 0; i < tokens * d; ++i) {
    h[i] = static_cast<float>(subspace_internal::Gaussian(5, 0, static_cast<uint64_t>(i)));
  }
  auto view = lbcc::TensorView::Host(h.data(), {tokens, d});
  const std::vector<int32_t> ids = {0, 299, 17, 256, 3};
  int written = 0;
  for (lbcc::DType dtype :
       {lbcc::DType::kF32, lbcc::DType::kBF16, lbcc::DType::kF16, lbcc::DType::kI8}) {
    SubspaceCodecOptions options;
    options.coefficient_dtype = dtype;
    options.int8_block = 3;
    options.mixture_block = 2;
    fuzz::FuzzCodecs codecs = fuzz::MakeFuzzCodecs(options);
    const std::string name(lbcc::DTypeName(dtype));
    SubspaceSelectors selectors;
    auto f1 = codecs.single.EncodeForward(*view, ids);
    auto b1 = codecs.single.EncodeBackward(*view);
    auto f2 = codecs.mixture.EncodeForward(*view, ids, &selectors);
    auto b2 = codecs.mixture.EncodeBackward(*view, selectors);
    auto f3 = codecs.no_vocab.EncodeForward(*view, {});
    if (!f1.ok() || !b1.ok() || !f2.ok() || !b2.ok() || !f3.ok()) {
      std::fprintf(stderr, "encoding failed\n");
      return 1;
    }
    const struct {
      const char* what;
      uint8_t target;
      const std::vector<uint8_t>* bytes;
    } seeds[] = {
        {"forward_single", fuzz::kForwardSingle, &*f1},
        {"backward_single", fuzz::kBackwardSingle, &*b1},
        {"forward_mixture", fuzz::kForwardMixture, &*f2},
        {"backward_mixture", fuzz::kBackwardMixture, &*b2},
        {"forward_novocab", fuzz::kForwardNoVocab, &*f3},
    };
    for (const auto& seed : seeds) {
      const std::string path = absl::StrCat(dir, "/", seed.what, "_", name);
      if (!WriteSeedFile(path, seed.target | fuzz::kFixChecksum, *seed.bytes)) {
        std::fprintf(stderr, "cannot write %s\n", path.c_str());
        return 1;
      }
      ++written;
    }
  }
  // A payload handed to the wrong decoder, and the basis file image.
  const std::vector<uint8_t> file = fuzz::FuzzBasis(1, 0, 3)->Serialize();
  if (!WriteSeedFile(dir + "/basis_file", fuzz::kBasisFile | fuzz::kFixChecksum, file)) {
    return 1;
  }
  ++written;
  std::printf("wrote %d seeds to %s\n", written, dir.c_str());
  return 0;
}
