#include "plugin/handle.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace lbcc::plugin {
namespace {

constexpr size_t kMagicOffset = 0;
constexpr size_t kVersionOffset = 4;
constexpr size_t kLengthOffset = 6;
constexpr size_t kCommIdOffset = 8;
constexpr size_t kAddressOffset = 16;
constexpr size_t kChecksumOffset = 96;
constexpr size_t kReservedOffset = 100;
constexpr size_t kStageOffset = 104;
constexpr size_t kStageMagicOffset = kStageOffset;
constexpr size_t kStageInstanceOffset = kStageOffset + 8;
constexpr size_t kStageAttemptOffset = kStageOffset + 16;
constexpr uint32_t kStageMagic = 0x5453424c;  // "LBST".
static_assert(kAddressOffset + kMaxAddressBytes == kChecksumOffset, "handle layout");
static_assert(kStageAttemptOffset + 8 == kHandleBytes, "handle layout");

template <typename T>
void Put(absl::Span<uint8_t> out, size_t offset, T value) {
  std::memcpy(out.data() + offset, &value, sizeof(T));
}

template <typename T>
T Get(absl::Span<const uint8_t> in, size_t offset) {
  T value;
  std::memcpy(&value, in.data() + offset, sizeof(T));
  return value;
}

uint32_t Fnv1a(absl::Span<const uint8_t> bytes) {
  uint32_t hash = 2166136261u;
  for (uint8_t byte : bytes) {
    hash ^= byte;
    hash *= 16777619u;
  }
  return hash;
}

}  // namespace

absl::Status EncodeListenHandle(const ListenHandle& handle, absl::Span<uint8_t> out) {
  if (out.size() < kHandleBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("handle buffer of ", out.size(), " bytes; need ", kHandleBytes));
  }
  if (handle.address.empty() || handle.address.size() > kMaxAddressBytes) {
    return absl::InvalidArgumentError(absl::StrCat("address '", handle.address, "' must have 1 to ",
                                                   kMaxAddressBytes, " characters"));
  }
  std::memset(out.data(), 0, kHandleBytes);
  Put<uint32_t>(out, kMagicOffset, kHandleMagic);
  Put<uint16_t>(out, kVersionOffset, kHandleVersion);
  Put<uint16_t>(out, kLengthOffset, static_cast<uint16_t>(handle.address.size()));
  Put<uint64_t>(out, kCommIdOffset, handle.comm_id);
  std::memcpy(out.data() + kAddressOffset, handle.address.data(), handle.address.size());
  Put<uint32_t>(out, kChecksumOffset, Fnv1a(out.subspan(0, kChecksumOffset)));
  return absl::OkStatus();
}

absl::StatusOr<ListenHandle> DecodeListenHandle(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kHandleBytes) {
    return absl::DataLossError(
        absl::StrCat("listen handle of ", bytes.size(), " bytes; expected ", kHandleBytes));
  }
  const uint32_t magic = Get<uint32_t>(bytes, kMagicOffset);
  if (magic != kHandleMagic) {
    return absl::DataLossError(
        absl::StrCat("not an LBCC listen handle (magic 0x", absl::Hex(magic), ")"));
  }
  const uint16_t version = Get<uint16_t>(bytes, kVersionOffset);
  if (version != kHandleVersion) {
    return absl::DataLossError(absl::StrCat("listen handle version ", version, "; this plugin reads ",
                                            kHandleVersion));
  }
  const uint16_t length = Get<uint16_t>(bytes, kLengthOffset);
  if (length == 0 || length > kMaxAddressBytes) {
    return absl::DataLossError(absl::StrCat("listen handle address length ", length));
  }
  if (Get<uint32_t>(bytes, kChecksumOffset) != Fnv1a(bytes.subspan(0, kChecksumOffset)) ||
      Get<uint32_t>(bytes, kReservedOffset) != 0) {
    return absl::DataLossError("listen handle checksum mismatch (corrupted in transit?)");
  }
  // The address field's padding is zero in every handle EncodeListenHandle writes; a handle
  // with bytes there is not one of ours, even with a matching checksum.
  const uint8_t* pad = bytes.data() + kAddressOffset + length;
  const uint8_t* pad_end = bytes.data() + kAddressOffset + kMaxAddressBytes;
  if (std::any_of(pad, pad_end, [](uint8_t b) { return b != 0; })) {
    return absl::DataLossError(absl::StrCat("listen handle has bytes after its ", length,
                                            "-byte address"));
  }
  ListenHandle handle;
  handle.comm_id = Get<uint64_t>(bytes, kCommIdOffset);
  handle.address.assign(reinterpret_cast<const char*>(bytes.data() + kAddressOffset), length);
  return handle;
}

std::optional<ConnectStage> ReadConnectStage(absl::Span<const uint8_t> handle) {
  if (handle.size() < kHandleBytes || Get<uint32_t>(handle, kStageMagicOffset) != kStageMagic) {
    return std::nullopt;
  }
  ConnectStage stage;
  stage.net_instance = Get<uint64_t>(handle, kStageInstanceOffset);
  stage.attempt_id = Get<uint64_t>(handle, kStageAttemptOffset);
  return stage;
}

void WriteConnectStage(absl::Span<uint8_t> handle, const ConnectStage& stage) {
  Put<uint32_t>(handle, kStageMagicOffset, kStageMagic);
  Put<uint32_t>(handle, kStageMagicOffset + 4, 0);
  Put<uint64_t>(handle, kStageInstanceOffset, stage.net_instance);
  Put<uint64_t>(handle, kStageAttemptOffset, stage.attempt_id);
}

void ClearConnectStage(absl::Span<uint8_t> handle) {
  std::memset(handle.data() + kStageOffset, 0, kHandleBytes - kStageOffset);
}

}  // namespace lbcc::plugin
