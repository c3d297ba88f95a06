// Fuzzes the bootstrap's network decoders (comm/bootstrap.h, internal): the root's reading of a
// rank's hello and a rank's reading of the root's reply. Any bytes give a value or a clear
// error (DataLoss for a hello that is not a rank's; for a reply Unavailable, or the root's error
// with a real absl::StatusCode that is not OK), never a crash; an accepted hello re-encodes to
// the same bytes and an accepted reply lists exactly `nranks` blobs that re-encode to it. A
// blob's dial-back request (kDialBackRequest) comes off as its whole last line, or not at all.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/bootstrap.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lbcc::comm::internal;
  if (size == 0) return 0;
  // First byte: the rank count a reply is read for (1-16).
  const int nranks = (data[0] & 15) + 1;
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);

  absl::StatusOr<BootstrapHello> hello = DecodeHello(bytes);
  if (hello.ok()) {
    if (EncodeHello(*hello) != bytes) std::abort();
  } else if (hello.status().code() != absl::StatusCode::kDataLoss) {
    std::abort();
  }

  // The root's reading of a dial-back request in a blob: the blob is left as it was, or loses
  // exactly its last line, which is the request; the port is a real one or -1.
  std::string blob = bytes;
  const int port = TakeDialBackRequest(blob, "127.0.0.1");
  if (port == 0) {
    if (blob != bytes) std::abort();
  } else {
    if (port < -1 || port > 65535 || bytes.compare(0, blob.size(), blob) != 0) std::abort();
    const std::string request = bytes.substr(blob.size());
    if (request.compare(0, lbcc::comm::kDialBackRequest.size(),
                        std::string(lbcc::comm::kDialBackRequest)) != 0 ||
        request.find('\n', 1) != std::string::npos) {
      std::abort();
    }
  }

  absl::StatusOr<std::vector<std::string>> reply = DecodeReply(bytes, nranks);
  if (reply.ok()) {
    if (static_cast<int>(reply->size()) != nranks) std::abort();
    // Bytes after the last blob are ignored; what was read re-encodes to the prefix.
    const std::string again = EncodeTable(*reply);
    if (bytes.compare(0, again.size(), again) != 0) std::abort();
  } else {
    const absl::StatusCode code = reply.status().code();
    if (code == absl::StatusCode::kOk || static_cast<int>(code) < 0 ||
        code > absl::StatusCode::kUnauthenticated) {
      std::abort();
    }
  }
  return 0;
}
