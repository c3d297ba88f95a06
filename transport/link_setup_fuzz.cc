// Fuzzes the link set-up's control messages (transport/link_setup.h) as a backend hands them
// over: 64-byte ControlHeaders (HELLO, WELCOME, AUTH, READY, the probe's, heartbeats, unknown
// types, other wire versions) from a peer into a server's and a client's LinkSetup without a
// job secret (secure_fuzz.cc covers the ones holding a secret), and into a server that has
// none while the peer claims one (reserved != 0). Never a crash; a server is made ready at
// most once; a plain server admits every HELLO of this wire version and refuses one of another
// version; a reply is a set-up message of this version.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "transport/link_setup.h"
#include "transport/options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lbcc::transport;
  TransportOptions options;  // no secret, no rules: the class comes from the peer or the probe
  ProbeScratch scratch;
  LinkSetup server(LinkSetup::Role::kServer, options, "fuzz-client", HostPort{"fuzz", 0});
  LinkSetup client(LinkSetup::Role::kClient, options, "fuzz-server", HostPort{"fuzz", 1});
  (void)client.Hello(1, 0);
  int ready = 0;
  for (size_t at = 0; at + sizeof(ControlHeader) <= size; at += sizeof(ControlHeader)) {
    ControlHeader h;
    std::memcpy(&h, data + at, sizeof(h));
    // A PING announces and a PROBE_REQUEST asks for probe buffers of up to 1 GiB (by design:
    // the probe measures the link); kept small here so that executions stay fast.
    if (h.type == static_cast<uint32_t>(Ctl::kPing) ||
        h.type == static_cast<uint32_t>(Ctl::kProbeRequest)) {
      h.b = std::min<uint64_t>(h.b, 1 << 16);
    }
    LinkSetup::Step step = server.OnControl(h, scratch);
    if (step.ready.has_value()) ++ready;
    if (ready > 1) std::abort();
    if (h.type == static_cast<uint32_t>(Ctl::kHello) && h.reserved == 0) {
      if ((h.version == kWireVersion) != step.admit) std::abort();
    }
    if (step.reply.has_value()) {
      if (!IsSetupMessage(step.reply->header.type)) std::abort();
      if (step.reply->header.version != kWireVersion) std::abort();
    }
    step = client.OnControl(h, scratch);
    if (step.ready.has_value()) std::abort();  // only a server is made ready
  }
  return 0;
}
