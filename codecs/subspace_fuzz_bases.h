// The bases and codecs the subspace fuzz target decodes with, shared with the program that
// writes its seed corpus (subspace_fuzz_corpus.cc) so that seeds match the fuzzer's bases.
//
// Input format of the fuzz target: byte 0 selects the target (low 3 bits, modulo kTargets) and
// whether to rewrite the payload's trailing XXH3 checksum before decoding (bit 7), which lets
// mutations reach the codec's own checks behind the envelope's checksum. The rest is the
// payload (or basis file image).
//
// Thread-safety: the codecs hold scratch buffers; one fuzzing thread.
#ifndef LBCC_CODECS_SUBSPACE_FUZZ_BASES_H_
#define LBCC_CODECS_SUBSPACE_FUZZ_BASES_H_

#include <cstdint>
#include <memory>

#include "base/check.h"
#include "codecs/subspace_basis.h"
#include "codecs/subspace_codec.h"

namespace lbcc::codecs::fuzz {

enum Target : uint8_t {
  kForwardSingle = 0,   // d 16, k 4, V 300 (2-byte ids), with T
  kBackwardSingle = 1,
  kForwardMixture = 2,  // d 16, k 4, M 3, V 300, with T
  kBackwardMixture = 3,
  kForwardNoVocab = 4,  // d 16, k 4, V 0, no T
  kBasisFile = 5,       // SubspaceBasis::Parse
  kTargets = 6,
};
inline constexpr uint8_t kFixChecksum = 0x80;

inline std::shared_ptr<const SubspaceBasis> FuzzBasis(int64_t components, int64_t vocab,
                                                      uint64_t seed) {
  SubspaceSeedSpec spec;
  spec.model_dim = 16;
  spec.rank = 4;
  spec.components = components;
  spec.vocab_size = vocab;
  spec.with_table = vocab > 0;
  spec.seed = seed;
  spec.version = 1;
  auto basis = SubspaceBasis::FromSeed(spec);
  LBCC_CHECK(basis.ok()) << basis.status();
  return *basis;
}

struct FuzzCodecs {
  SubspaceCodec single;
  SubspaceCodec mixture;
  SubspaceCodec no_vocab;
};

// Codecs with the given encoding options (decoding accepts any options).
inline FuzzCodecs MakeFuzzCodecs(const SubspaceCodecOptions& options) {
  auto single = SubspaceCodec::Create(FuzzBasis(1, 300, 1), options);
  auto mixture = SubspaceCodec::Create(FuzzBasis(3, 300, 2), options);
  auto no_vocab = SubspaceCodec::Create(FuzzBasis(1, 0, 3), options);
  LBCC_CHECK(single.ok() && mixture.ok() && no_vocab.ok());
  return {*std::move(single), *std::move(mixture), *std::move(no_vocab)};
}

}  // namespace lbcc::codecs::fuzz

#endif  // LBCC_CODECS_SUBSPACE_FUZZ_BASES_H_
