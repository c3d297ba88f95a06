#include "comm/sparse_blob.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace lbcc::comm::internal {

std::string ErrorBlob(const absl::Status& status) {
  std::string blob(1, '\0');
  blob += status.ToString();
  return blob;
}

absl::StatusOr<std::vector<absl::Span<const uint8_t>>> SplitBlob(const std::string& blob,
                                                                 size_t tensors, int rank) {
  auto corrupt = [rank](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("payloads from rank ", rank, ": ", what));
  };
  if (blob.empty()) return corrupt("empty");
  if (blob[0] == '\0') {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " could not encode its input: ", blob.substr(1)));
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
