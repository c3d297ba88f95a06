// Writes the seed corpora of link_setup_fuzz and link_rules_fuzz:
//   link_setup_corpus/: the 64-byte control headers of real link set-ups, in the order they
//     crossed (a client's and a server's LinkSetup over an in-memory wire, as the loopback
//     backend runs them): HELLO, WELCOME, the probe's PING/PONG/PROBE_REQUEST/PROBE_DATA/
//     PROBE_ACK, READY; the same with a job secret (HELLO and WELCOME carry the handshake, then
//     AUTH); a HELLO of another wire version and a heartbeat;
//   link_rules_corpus/: the documented rules file (transport/options.h) and one line forms.
//
//   bazel run //transport:link_setup_fuzz_corpus -- $PWD/transport/testdata
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/time/clock.h"
#include "transport/link_setup.h"
#include "transport/options.h"

namespace {

using namespace lbcc::transport;

int written = 0;

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  ++written;
}

std::string Bytes(const ControlHeader& h) {
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

// loopback.cc's MemoryWire, recording every header both ways.
class RecordingWire final : public SetupWire {
 public:
  RecordingWire(LinkSetup* server, LinkSetup* client) : server_(server), client_(client) {}
  void Send(ControlMessage message) override {
    record += Bytes(message.header);
    LinkSetup::Step step = server_->OnControl(message.header, scratch_);
    if (step.reply.has_value()) {
      record += Bytes(step.reply->header);
      client_->OnControl(step.reply->header, scratch_);
    }
  }
  std::string record;

 private:
  LinkSetup* const server_;
  LinkSetup* const client_;
  ProbeScratch scratch_;
};

std::string Session(const TransportOptions& options, bool measure) {
  LinkSetup client(LinkSetup::Role::kClient, options, "server", HostPort{"127.0.0.1", 1});
  LinkSetup server(LinkSetup::Role::kServer, options, "client", HostPort{"127.0.0.1", 0});
  RecordingWire wire(&server, &client);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  wire.Send(client.Hello(7, 0));
  if (!client.AwaitWelcomes(1, deadline).ok()) std::exit(1);
  absl::StatusOr<LinkParams> params = client.Negotiate(wire, ConnectOptions(), deadline, measure);
  if (!params.ok()) {
    std::fprintf(stderr, "%s\n", std::string(params.status().ToString()).c_str());
    std::exit(1);
  }
  wire.Send(LinkSetup::Ready(7, *params));
  return wire.record;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: link_setup_fuzz_corpus <transport/testdata>\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::string s = dir + "/link_setup_corpus/";
  TransportOptions plain;
  plain.probe_max_bytes = 256 << 10;
  plain.probe_min_time = absl::Milliseconds(1);
  Write(s + "probed", Session(plain, /*measure=*/true));
  Write(s + "unmeasured", Session(plain, /*measure=*/false));
  TransportOptions secure = plain;
  secure.security.secret = *JobSecret::FromHex(
      "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
  secure.security.identity = 3;
  Write(s + "authenticated", Session(secure, /*measure=*/false));
  ControlHeader other = HelloMessage(9).header;
  other.version = kWireVersion + 1;
  Write(s + "other_version", Bytes(other));
  Write(s + "heartbeat", Bytes(HeartbeatMessage().header));

  const std::string r = dir + "/link_rules_corpus/";
  Write(r + "documented", R"(# peer            class
10.77.0.3         slow      # any port on that host
10.77.0.4:5000    fast
fd77::5           slow      # IPv6: bare, or [fd77::5] / [fd77::5]:5000 with a port
[fd77::6]:5000    fast
node6             slow      # a host name: the name and every address it resolves to
*                 slow      # everyone else
)");
  Write(r + "one_line", "10.0.0.3 slow\n");
  Write(r + "comments_only", "# nothing\n\n");
  Write(r + "named_with_port", "node3:5000 FAST\r\n");
  std::printf("wrote %d seed files\n", written);
  return 0;
}
