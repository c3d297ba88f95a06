// The listen handle: what listen() writes into NCCL's 128-byte handle buffer, NCCL carries to the
// peer through its bootstrap, and connect() reads there.
//
// Layout (little-endian; LBCC runs on little-endian machines):
//   [0, 4)     magic "LBCH"
//   [4, 6)     format version (kHandleVersion)
//   [6, 8)     address length
//   [8, 16)    comm id: which listen comm on the listening process the connection is for
//   [16, 96)   transport address of the listening device ("10.0.0.2:41234"), not NUL-terminated
//   [96, 100)  FNV-1a 32 of bytes [0, 96)
//   [100, 104) zero
//   [104, 128) connect stage: written by the connecting process only (never on the wire), so that
//              repeated connect() calls with the same handle find their connection attempt, as
//              NCCL's own plugins keep theirs in the handle.
//
// Decoding takes untrusted bytes: anything that is not a handle of this version is rejected with
// DataLoss, never read past 128 bytes (handle_fuzz.cc).
//
// Thread-safety: pure functions.
#ifndef LBCC_PLUGIN_HANDLE_H_
#define LBCC_PLUGIN_HANDLE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace lbcc::plugin {

inline constexpr size_t kHandleBytes = 128;  // NCCL_NET_HANDLE_MAXSIZE.
inline constexpr uint32_t kHandleMagic = 0x4843424c;  // "LBCH".
inline constexpr uint16_t kHandleVersion = 1;
inline constexpr size_t kMaxAddressBytes = 80;

struct ListenHandle {
  std::string address;
  uint64_t comm_id = 0;
};

// Writes `handle` into out[0, 128) with an empty connect stage. InvalidArgument when the address
// is empty or longer than kMaxAddressBytes, or `out` is shorter than kHandleBytes.
absl::Status EncodeListenHandle(const ListenHandle& handle, absl::Span<uint8_t> out);

// Reads a handle. DataLoss for a buffer that is not a version-1 LBCC handle (short, wrong magic,
// version, length or checksum).
absl::StatusOr<ListenHandle> DecodeListenHandle(absl::Span<const uint8_t> bytes);

// The connecting process's note of its attempt, kept in the handle between connect() calls.
struct ConnectStage {
  uint64_t net_instance = 0;  // Which plugin instance wrote it (a finalize/init pair changes it).
  uint64_t attempt_id = 0;
};
// Empty when the stage bytes hold no stage (a fresh handle). `handle` must hold kHandleBytes.
std::optional<ConnectStage> ReadConnectStage(absl::Span<const uint8_t> handle);
void WriteConnectStage(absl::Span<uint8_t> handle, const ConnectStage& stage);
void ClearConnectStage(absl::Span<uint8_t> handle);

}  // namespace lbcc::plugin

#endif  // LBCC_PLUGIN_HANDLE_H_
