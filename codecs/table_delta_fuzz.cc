// Fuzzes ApplyTableDelta and InspectTableDelta. Any input must give ok or a documented error
// code, never a crash; a rejected message must leave the table untouched; an accepted one must
// be reproducible: re-encoding (before = the original table, after = the result) gives a
// message that applies to the same result and lists no more positions.
//
// Input format: byte 0 is a mode: bit 7 rewrites the message's trailing XXH3 checksum before
// decoding (so mutations reach the checks behind it), bit 6 gives the table one element more
// than the message's n (InvalidArgument). The rest is the message. The original table holds
// arbitrary bits (NaNs included), a function of the position.
// table_delta_fuzz_corpus.cc writes the seeds.
#include <xxhash.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "codecs/table_delta.h"

namespace {

using lbcc::codecs::ApplyTableDelta;
using lbcc::codecs::EncodeTableDelta;
using lbcc::codecs::InspectTableDelta;
using lbcc::codecs::TableDeltaInfo;

constexpr uint8_t kFixChecksum = 0x80;
constexpr uint8_t kOneMore = 0x40;
// Tables the fuzzer allocates; a message naming more elements meets a small table instead.
constexpr uint64_t kMaxElements = uint64_t{1} << 20;

void Check(bool condition) {
  if (!condition) std::abort();
}

std::vector<float> Original(uint64_t n) {
  std::vector<float> table(n);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>((i + 1) * 0x9E3779B1u);
    std::memcpy(&table[i], &bits, sizeof(bits));
  }
  return table;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::vector<uint8_t> message(data + 1, data + size);
  if ((mode & kFixChecksum) != 0 && message.size() >= 8) {
    const uint64_t sum = XXH3_64bits(message.data(), message.size() - 8);
    std::memcpy(message.data() + message.size() - 8, &sum, 8);
  }
  const absl::StatusOr<TableDeltaInfo> info = InspectTableDelta(message);
  uint64_t n = 16;
  if (info.ok()) {
    Check(info->changed <= info->elements && info->total_bytes == message.size());
    if (info->elements <= kMaxElements) n = info->elements + ((mode & kOneMore) != 0 ? 1 : 0);
  } else {
    Check(info.status().code() == absl::StatusCode::kDataLoss);
  }
  const std::vector<float> original = Original(n);
  std::vector<float> result = original;
  const absl::Status status = ApplyTableDelta(message, absl::MakeSpan(result));
  if (!status.ok()) {
    // Inspect and Apply agree: DataLoss for a malformed message, InvalidArgument for a size.
    Check(status.code() == (info.ok() ? absl::StatusCode::kInvalidArgument
                                      : absl::StatusCode::kDataLoss));
    Check(SameBits(result, original));
    return 0;
  }
  Check(info.ok() && info->elements == n);
  absl::StatusOr<std::vector<uint8_t>> again = EncodeTableDelta(original, result);
  Check(again.ok());
  const absl::StatusOr<TableDeltaInfo> again_info = InspectTableDelta(*again);
  Check(again_info.ok() && again_info->elements == n && again_info->changed <= info->changed);
  std::vector<float> replay = original;
  Check(ApplyTableDelta(*again, absl::MakeSpan(replay)).ok());
  Check(SameBits(replay, result));
  return 0;
}
