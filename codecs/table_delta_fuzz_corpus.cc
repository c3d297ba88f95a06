// Writes the seed corpus of table_delta_fuzz into a folder: real deltas of both position
// encodings (none, one, some, all elements changed; empty and large tables), each prefixed
// with the fuzzer's mode byte (see table_delta_fuzz.cc: 0x80 rewrites the checksum, 0x40 makes
// the table one element larger), and one garbage input.
//
//   bazel run //codecs:table_delta_fuzz_corpus -- $PWD/codecs/testdata/table_delta_corpus
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "codecs/fuzz_seed_file.h"
#include "codecs/table_delta.h"

namespace {

// The fuzzer's original table (table_delta_fuzz.cc), so that seeds change real elements.
std::vector<float> Original(size_t n) {
  std::vector<float> table(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>((i + 1) * 0x9E3779B1u);
    std::memcpy(&table[i], &bits, sizeof(bits));
  }
  return table;
}

// `before` with every element i where pick(i) set to a new value.
template <typename Pick>
std::vector<float> Changed(const std::vector<float>& before, Pick pick) {
  std::vector<float> after = before;
  for (size_t i = 0; i < after.size(); ++i) {
    if (pick(i)) after[i] = static_cast<float>(i) * 0.25f - 3.0f;
  }
  return after;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <folder>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  struct Seed {
    const char* name;
    uint8_t mode;
    size_t n;
    bool (*pick)(size_t);
  };
  const Seed seeds[] = {
      {"empty_table", 0x80, 0, [](size_t) { return true; }},
      {"one_of_one", 0x80, 1, [](size_t) { return true; }},
      {"none_changed", 0x80, 100, [](size_t) { return false; }},
      {"gaps_5pct", 0x80, 500, [](size_t i) { return (i * 7919) % 100 < 5; }},
      {"gaps_far", 0x80, 70000, [](size_t i) { return i == 3 || i == 69999; }},
      {"bitmap_half", 0x80, 203, [](size_t i) { return (i * 31) % 7 < 4; }},
      {"bitmap_all", 0x80, 67, [](size_t) { return true; }},
      {"size_mismatch", 0xc0, 120, [](size_t i) { return i % 9 == 0; }},
      {"stale_checksum", 0x00, 64, [](size_t i) { return i % 3 == 0; }},
  };
  int written = 0;
  for (const Seed& seed : seeds) {
    const std::vector<float> before = Original(seed.n);
    absl::StatusOr<std::vector<uint8_t>> bytes =
        lbcc::codecs::EncodeTableDelta(before, Changed(before, seed.pick));
    if (!bytes.ok()) {
      std::fprintf(stderr, "%s: %s\n", seed.name, bytes.status().ToString().c_str());
      return 1;
    }
    if (seed.mode == 0x00) (*bytes)[bytes->size() - 1] ^= 0x5a;  // checksum left wrong
    const std::string path = dir + "/" + seed.name;
    if (!lbcc::codecs::WriteSeedFile(path, seed.mode, *bytes)) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
    ++written;
  }
  if (!lbcc::codecs::WriteSeedFile(dir + "/garbage", 0x80,
                                   {'L', 'B', 'C', 'C', 'T', 'B', 'L', 'D', 7, 0, 0})) {
    return 1;
  }
  ++written;
  std::printf("wrote %d seeds to %s\n", written, dir.c_str());
  return 0;
}
