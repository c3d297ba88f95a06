// Writing one seed of a fuzz target's corpus: the target's mode byte, then the input. Shared by
// the corpus-writing tools (subspace_fuzz_corpus, table_delta_fuzz_corpus).
#ifndef LBCC_CODECS_FUZZ_SEED_FILE_H_
#define LBCC_CODECS_FUZZ_SEED_FILE_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace lbcc::codecs {

// False when the file cannot be written (the caller names it).
inline bool WriteSeedFile(const std::string& path, uint8_t mode,
                          const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  bool ok = std::fwrite(&mode, 1, 1, f) == 1 &&
            std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_FUZZ_SEED_FILE_H_
