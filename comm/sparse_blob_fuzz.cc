// Fuzzes SparseAllReduce's message parsers (comm/sparse_blob.h): any bytes from a peer give ok,
// DataLoss or InvalidArgument (a well-formed error blob or another tensor count), never a
// crash; accepted payload spans lie inside the input; a reassembled streamed blob is parsed too.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/sparse_blob.h"

namespace {

void CheckSplit(const std::string& blob, size_t tensors) {
  auto spans = lbcc::comm::internal::SplitBlob(blob, tensors, 1);
  if (!spans.ok()) {
    const absl::StatusCode code = spans.status().code();
    if (code != absl::StatusCode::kDataLoss && code != absl::StatusCode::kInvalidArgument) {
      std::abort();
    }
    // An error message is bounded, whatever the peer sent.
    if (spans.status().message().size() > lbcc::comm::internal::kMaxErrorMessageBytes + 200) {
      std::abort();
    }
    return;
  }
  if (spans->size() != tensors) std::abort();
  const auto* begin = reinterpret_cast<const uint8_t*>(blob.data());
  for (const absl::Span<const uint8_t>& s : *spans) {
    if (s.data() < begin || s.data() + s.size() > begin + blob.size()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // First byte: tensor count to expect (0-7) and how many leading piece messages to cut off.
  const size_t tensors = data[0] & 7;
  const size_t num_pieces = (data[0] >> 3) & 7;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  CheckSplit(rest, tensors);
  std::vector<std::string> pieces;
  size_t at = 0;
  for (size_t p = 0; p < num_pieces && at < rest.size(); ++p) {
    const size_t n = std::min<size_t>(rest.size() - at, static_cast<uint8_t>(rest[at]));
    pieces.push_back(rest.substr(at, n));
    at += n;
  }
  auto blob = lbcc::comm::internal::AssembleStreamed(pieces, rest.substr(at), 2);
  if (!blob.ok()) {
    if (blob.status().code() != absl::StatusCode::kDataLoss) std::abort();
    return 0;
  }
  CheckSplit(*blob, tensors);
  return 0;
}
