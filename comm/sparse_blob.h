// SparseAllReduce's messages between ranks (what one rank contributes to one exchange group).
//
// Blob: u8 ok (1), u32 tensor count, then per tensor u64 size + payload bytes; or an error blob:
// u8 0, u32 magic, u32 length and the error message (at most kMaxErrorMessageBytes) that made
// the rank give up. A streamed blob (sparse_allreduce.cc: one large tensor sent while it is
// encoded) travels as piece messages and a final message: u64 prefix, u64
// piece bytes used, then the blob without those bytes, so blob = final[16, 16 + prefix) +
// pieces[0, used) + final[16 + prefix, end). Host byte order (little-endian machines).
//
// The parsers take bytes from the network: anything malformed is DataLoss naming the rank.
// Thread-safety: pure functions.
#ifndef LBCC_COMM_SPARSE_BLOB_H_
#define LBCC_COMM_SPARSE_BLOB_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace lbcc::comm::internal {

inline constexpr size_t kMaxErrorMessageBytes = 4096;
// The blob of a rank that gives up: its error (cut to kMaxErrorMessageBytes), for every rank to
// report.
std::string ErrorBlob(const absl::Status& status);
// Whether `blob` claims to be an error blob (SplitBlob checks that it is a well-formed one).
bool IsErrorBlob(const std::string& blob);
// The payloads of a blob from `rank` that should hold `tensors`: InvalidArgument carrying the
// rank's own error for an error blob or another tensor count, DataLoss when malformed. The
// spans point into `blob`.
absl::StatusOr<std::vector<absl::Span<const uint8_t>>> SplitBlob(const std::string& blob,
                                                                 size_t tensors, int rank);

inline constexpr size_t kStreamFinalHeader = 16;
// The final message for `blob`, of which [prefix, prefix + used) went out as pieces.
std::string StreamFinal(const std::string& blob, size_t prefix, size_t used);
// Rebuilds a blob from its pieces (in order) and final message; DataLoss when they disagree.
absl::StatusOr<std::string> AssembleStreamed(const std::vector<std::string>& pieces,
                                             const std::string& final, int rank);

}  // namespace lbcc::comm::internal

#endif  // LBCC_COMM_SPARSE_BLOB_H_
