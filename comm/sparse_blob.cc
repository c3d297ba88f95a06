#include "comm/sparse_blob.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace lbcc::comm::internal {

namespace {

// An error blob: u8 0, u32 kErrorMagic, u32 message length, the message. The magic and the
// exact length keep a corrupt or foreign message that happens to start with byte 0 from being
// read as some rank's error (and its bytes from being reported as text).
constexpr uint32_t kErrorMagic = 0x72454c42;  // "BLEr"
constexpr size_t kErrorHeader = 1 + 4 + 4;

}  // namespace

std::string ErrorBlob(const absl::Status& status) {
  std::string message = status.ToString();
  if (message.size() > kMaxErrorMessageBytes) message.resize(kMaxErrorMessageBytes);
  const uint32_t header[2] = {kErrorMagic, static_cast<uint32_t>(message.size())};
  std::string blob(1, '\0');
  blob.append(reinterpret_cast<const char*>(header), sizeof(header));
  blob += message;
  return blob;
}

bool IsErrorBlob(const std::string& blob) { return !blob.empty() && blob[0] == '\0'; }

absl::StatusOr<std::vector<absl::Span<const uint8_t>>> SplitBlob(const std::string& blob,
                                                                 size_t tensors, int rank) {
  auto corrupt = [rank](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("payloads from rank ", rank, ": ", what));
  };
  if (blob.empty()) return corrupt("empty");
  if (IsErrorBlob(blob)) {
    uint32_t header[2] = {0, 0};
    if (blob.size() < kErrorHeader) return corrupt("truncated error message");
    std::memcpy(header, blob.data() + 1, sizeof(header));
    if (header[0] != kErrorMagic) return corrupt("neither payloads nor an error message");
    if (header[1] > kMaxErrorMessageBytes || header[1] != blob.size() - kErrorHeader) {
      return corrupt(absl::StrCat("error message of ", blob.size() - kErrorHeader,
                                  " bytes, its header says ", header[1]));
    }
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " could not encode its input: ",
                                                   absl::string_view(blob).substr(kErrorHeader)));
  }
  size_t offset = 1;
  uint32_t count = 0;
  if (blob.size() < offset + 4) return corrupt("truncated");
  std::memcpy(&count, blob.data() + offset, 4);
  offset += 4;
  if (count != tensors) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " sent ", count,
                                                   " tensors, this rank has ", tensors));
  }
  std::vector<absl::Span<const uint8_t>> spans;
  for (uint32_t t = 0; t < count; ++t) {
    uint64_t size = 0;
    if (blob.size() - offset < 8) return corrupt("truncated");
    std::memcpy(&size, blob.data() + offset, 8);
    offset += 8;
    if (blob.size() - offset < size) return corrupt("truncated");
    spans.emplace_back(reinterpret_cast<const uint8_t*>(blob.data()) + offset, size);
    offset += size;
  }
  if (offset != blob.size()) return corrupt("trailing bytes");
  return spans;
}

std::string StreamFinal(const std::string& blob, size_t prefix, size_t used) {
  std::string final(kStreamFinalHeader, '\0');
  const uint64_t header[2] = {prefix, used};
  std::memcpy(final.data(), header, sizeof(header));
  final.append(blob, 0, prefix);
  final.append(blob, prefix + used, std::string::npos);
  return final;
}

absl::StatusOr<std::string> AssembleStreamed(const std::vector<std::string>& pieces,
                                             const std::string& final, int rank) {
  uint64_t header[2] = {0, 0};
  size_t available = 0;
  for (const std::string& piece : pieces) available += piece.size();
  if (final.size() >= kStreamFinalHeader) std::memcpy(header, final.data(), sizeof(header));
  if (final.size() < kStreamFinalHeader || header[0] > final.size() - kStreamFinalHeader ||
      header[1] > available) {
    return absl::DataLossError(absl::StrCat("streamed payloads from rank ", rank,
                                            ": bad final message of ", final.size(), " bytes"));
  }
  std::string blob = final.substr(kStreamFinalHeader, header[0]);
  size_t need = header[1];
  for (const std::string& piece : pieces) {
    const size_t take = std::min<size_t>(need, piece.size());
    blob.append(piece, 0, take);
    need -= take;
  }
  blob.append(final, kStreamFinalHeader + header[0], std::string::npos);
  return blob;
}

}  // namespace lbcc::comm::internal
