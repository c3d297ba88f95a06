// Table deltas: "the elements of a float32 table whose bits changed", as a self-describing,
// checksummed message. The lossy pipeline boundary (docs: codecs/README.md, "Table deltas")
// uses the synced token-embedding table T as the subspace basis' table; a later pipeline stage
// holds no embedding, so after every SparseLoCo outer step it rebuilds T from such a delta (the
// union of the positions the outer step changed) instead of a dense broadcast.
//
// Wire format, version 1 (little-endian):
//   "LBCCTBLD" | u32 format version (1) | u8 position encoding | 3 bytes zero |
//   u64 n (table elements) | u64 m (changed elements, m <= n) |
//   positions | m x f32 (the new values, bit-exact, in ascending position order) |
//   u64 XXH3-64 of every byte before it.
// Positions, chosen per message as the smaller of the two (the bitmap on a tie):
//   kBitmap  ceil(n / 8) bytes, bit i (bit i % 8 of byte i / 8) set when element i changed;
//            the padding bits of the last byte are zero, exactly m bits are set.
//   kGaps    m unsigned LEB128 values (minimal length, at most 10 bytes each): the first
//            position, then p[j] - p[j-1] - 1 (so positions strictly ascend).
// "Changed" compares bits, so -0.0 vs +0.0 and NaN payloads count; values are copied as bits
// (no finiteness check: the table is data, not parameters).
//
// Thread-safety: stateless functions; the caller must not modify a table while it is read or
// written here.
#ifndef LBCC_CODECS_TABLE_DELTA_H_
#define LBCC_CODECS_TABLE_DELTA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lbcc::codecs {

inline constexpr char kTableDeltaMagic[8] = {'L', 'B', 'C', 'C', 'T', 'B', 'L', 'D'};
inline constexpr uint32_t kTableDeltaVersion = 1;
// Magic, version, encoding byte and 3 reserved bytes, n, m.
inline constexpr size_t kTableDeltaHeaderBytes = 32;
inline constexpr size_t kTableDeltaChecksumBytes = 8;

// Wire values of the position encoding byte; never renumber.
enum class TableDeltaEncoding : uint8_t {
  kBitmap = 0,
  kGaps = 1,
};
absl::string_view TableDeltaEncodingName(TableDeltaEncoding encoding);  // "bitmap", "gaps"

struct TableDeltaInfo {
  uint64_t elements = 0;  // n
  uint64_t changed = 0;   // m
  TableDeltaEncoding encoding = TableDeltaEncoding::kBitmap;
  size_t position_bytes = 0;  // the positions section
  size_t total_bytes = 0;     // the whole message
};

// The message that turns `before` into `after` (bit for bit). Both spans need only live for the
// call. InvalidArgument when their sizes differ.
absl::StatusOr<std::vector<uint8_t>> EncodeTableDelta(absl::Span<const float> before,
                                                      absl::Span<const float> after);

// Writes the message's values into `table` at its positions. The message is validated in full
// before anything is written, so on any error `table` is untouched. `bytes` need only live for
// the call. Errors: DataLoss for anything malformed (magic, format version, encoding, reserved
// bytes, checksum, truncation or trailing bytes, m > n, positions out of range or not
// ascending, a bitmap's padding or popcount, an overlong LEB128); InvalidArgument when the
// message is intact but its n differs from table.size().
absl::Status ApplyTableDelta(absl::Span<const uint8_t> bytes, absl::Span<float> table);

// Validates the message as ApplyTableDelta does (DataLoss) and describes it.
absl::StatusOr<TableDeltaInfo> InspectTableDelta(absl::Span<const uint8_t> bytes);

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_TABLE_DELTA_H_
