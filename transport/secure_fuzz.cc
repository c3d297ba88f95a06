// Fuzzes the handshake parsers with untrusted bytes: the socket handshake's frames
// (ParseAuthFrame: a frame or DataLoss, and an accepted frame re-encodes to the same bytes), a
// sequence of set-up messages into a server's and a client's LinkSetup holding a secret (never a
// crash, never authenticated without the secret), and SecureChannel::Open (DataLoss, never OK
// for bytes no member sealed).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "transport/link_setup.h"
#include "transport/options.h"
#include "transport/secure.h"

namespace {

using lbcc::transport::ControlHeader;

const lbcc::transport::JobSecret& Secret() {
  static const auto* secret = new lbcc::transport::JobSecret(*lbcc::transport::JobSecret::FromHex(
      "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"));
  return *secret;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lbcc::transport;
  const auto bytes = absl::MakeConstSpan(data, size);
  for (uint8_t kind = 1; kind <= 3; ++kind) {
    absl::StatusOr<AuthFrame> frame = ParseAuthFrame(bytes, kind);
    if (!frame.ok()) {
      if (frame.status().code() != absl::StatusCode::kDataLoss) std::abort();
      continue;
    }
    const std::string again = EncodeAuthFrame(*frame);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) std::abort();
  }

  TransportOptions options;
  options.security.secret = Secret();
  options.security.identity = 5;
  ProbeScratch scratch;
  LinkSetup server(LinkSetup::Role::kServer, options, "fuzz-client", HostPort{"fuzz", 0});
  LinkSetup client(LinkSetup::Role::kClient, options, "fuzz-server", HostPort{"fuzz", 1});
  (void)client.Hello(1, 0);
  for (size_t at = 0; at + sizeof(ControlHeader) <= size; at += sizeof(ControlHeader)) {
    ControlHeader h;
    std::memcpy(&h, data + at, sizeof(h));
    h.b = std::min<uint64_t>(h.b, 1 << 20);  // Probe requests allocate what they are asked.
    if (h.type == static_cast<uint32_t>(Ctl::kPing) || h.type == static_cast<uint32_t>(Ctl::kProbeRequest)) {
      h.b = std::min<uint64_t>(h.b, 1 << 16);
    }
    LinkSetup::Step step = server.OnControl(h, scratch);
    // Without the secret the fuzzer cannot forge a proof, so nothing past the handshake is
    // ever answered or made ready.
    if (step.ready.has_value()) std::abort();
    (void)client.OnControl(h, scratch);
  }

  const HandshakeTranscript transcript;
  auto channel = *SecureChannel::Create(Secret(), transcript, HandshakeRole::kServer,
                                        size % 2 == 0, "fuzz");
  if (size >= SecureChannel::kOverhead) {
    std::vector<uint8_t> out(size - SecureChannel::kOverhead);
    if (channel->Open({}, size % 2 == 0, data, size, out.data()).ok()) std::abort();
  }
  return 0;
}
