// Fuzzes the payload envelope parser: any bytes must give ok or DataLoss, never a crash, and an
// accepted payload's views must lie inside the input.
#include <cstdint>
#include <cstdlib>

#include "codecs/payload.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::Span<const uint8_t> bytes(data, size);
  (void)lbcc::codecs::PeekPayloadBytes(bytes);
  absl::StatusOr<lbcc::codecs::PayloadInfo> info = lbcc::codecs::ParsePayload(bytes);
  if (!info.ok()) {
    if (info.status().code() != absl::StatusCode::kDataLoss) std::abort();
    return 0;
  }
  const uint8_t* end = data + size;
  if (info->params.data() < data || info->params.data() + info->params.size() > end) std::abort();
  if (info->body.data() < data || info->body.data() + info->body.size() > end) std::abort();
  if (info->total_bytes != size) std::abort();
  return 0;
}
