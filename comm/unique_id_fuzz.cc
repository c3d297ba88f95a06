// Fuzzes the unique id's decoder (comm/bootstrap.h): an id travels from rank 0 to the others
// through the launcher (torch's store, MPI_Bcast, a file), so its 128 bytes are untrusted. Any
// bytes give an id's fields or InvalidArgument, never a crash; the address UniqueIdAddress
// reads stays inside the id (NUL-terminated or not) and parses as host:port or fails with a
// status; a decoded secret is the one UniqueIdSecret reads. No name is resolved (no traffic).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/bootstrap.h"
#include "transport/netif.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lbcc::comm;
  UniqueId id{};
  std::memcpy(id.internal, data, std::min<size_t>(size, kUniqueIdBytes));
  const std::string address = UniqueIdAddress(id);
  if (address.size() >= kUniqueIdBytes) std::abort();
  if (address.find('\0') != std::string::npos) std::abort();
  const std::optional<lbcc::transport::JobSecret> secret = UniqueIdSecret(id);
  absl::StatusOr<internal::DecodedUniqueId> decoded = internal::DecodeUniqueId(id);
  if (!decoded.ok()) {
    if (decoded.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  if (decoded->address != address) std::abort();
  if (decoded->secret.has_value() != secret.has_value()) std::abort();
  if (secret.has_value() && decoded->version != 2) std::abort();
  // The host:port syntax check BootstrapExchange and ChooseListenAddress start with.
  absl::StatusOr<lbcc::transport::HostAndPort> hp =
      lbcc::transport::ParseHostPort(address, "bootstrap: root");
  if (hp.ok() && (hp->port < 0 || hp->port > 65535)) std::abort();
  return 0;
}
