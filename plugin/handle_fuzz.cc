// Fuzzes the listen-handle decoder: any bytes give a handle or DataLoss, never a crash; an
// accepted handle re-encodes to the same first 104 bytes (everything but the connect stage).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "plugin/handle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<lbcc::plugin::ListenHandle> handle =
      lbcc::plugin::DecodeListenHandle(absl::MakeConstSpan(data, size));
  if (!handle.ok()) {
    if (handle.status().code() != absl::StatusCode::kDataLoss) std::abort();
    return 0;
  }
  uint8_t again[lbcc::plugin::kHandleBytes];
  if (!lbcc::plugin::EncodeListenHandle(*handle, absl::MakeSpan(again)).ok()) std::abort();
  if (std::memcmp(again, data, 104) != 0) std::abort();
  (void)lbcc::plugin::ReadConnectStage(absl::MakeConstSpan(data, size));
  return 0;
}
