// Prints the id of a seeded subspace basis and the XXH3 of its file image, so that a test can
// compare what separate processes (or machines) regenerate.
//
//   subspace_seed_hash d k M V with_table seed version
//   -> "<hash>/v<version> <file hash>"
#include <xxhash.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "codecs/subspace_basis.h"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s d k M V with_table seed version\n", argv[0]);
    return 2;
  }
  lbcc::codecs::SubspaceSeedSpec spec;
  spec.model_dim = std::strtoll(argv[1], nullptr, 10);
  spec.rank = std::strtoll(argv[2], nullptr, 10);
  spec.components = std::strtoll(argv[3], nullptr, 10);
  spec.vocab_size = std::strtoll(argv[4], nullptr, 10);
  spec.with_table = std::atoi(argv[5]) != 0;
  spec.seed = std::strtoull(argv[6], nullptr, 10);
  spec.version = static_cast<uint32_t>(std::strtoul(argv[7], nullptr, 10));
  auto basis = lbcc::codecs::SubspaceBasis::FromSeed(spec);
  if (!basis.ok()) {
    std::fprintf(stderr, "%s\n", basis.status().ToString().c_str());
    return 1;
  }
  const std::vector<uint8_t> file = (*basis)->Serialize();
  std::printf("%s %016" PRIx64 "\n", (*basis)->id().ToString().c_str(),
              static_cast<uint64_t>(XXH3_64bits(file.data(), file.size())));
  return 0;
}
