// Writes the seed corpus of socket_frame_fuzz from real links: two socket transports
// (socket_transport.h) on 127.0.0.1 with a recording relay between them. The client dials the
// relay, which dials the server; every byte each connection carried is kept, per connection and
// direction, as what a reactor's frame reader reads. Each link: the set-up (HELLO, WELCOME,
// READY; with a job secret the handshake and AUTH), messages of 1 byte, 3 KiB and 40 KiB each
// way, credits and heartbeats; once without a secret and a fast
// link, once with a secret (sealed chunks) and a slow one, once probed (no class given). Each
// stream is written, without its frames over 64 KiB (the probe's bulk data), after the fuzzer's
// first byte (the seed of its receive sizes): 0 and 255.
//
//   bazel run //transport:socket_frame_fuzz_corpus -- $PWD/transport/testdata
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/mutex.h"
#include "transport/netif.h"
#include "transport/socket_frame.h"
#include "transport/socket_transport.h"

namespace {

using namespace lbcc::transport;

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "socket_frame_fuzz_corpus: %s\n", why.c_str());
  std::exit(1);
}

int ListenTcp(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    Die("cannot listen");
  }
  *port = ntohs(a.sin_port);
  return fd;
}

// Accepts connections until stopped; each is joined to a new connection to `server`, and both
// directions are pumped and recorded.
class Relay {
 public:
  explicit Relay(std::string server) : server_(std::move(server)) {
    listener_ = ListenTcp(&port_);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~Relay() { Stop(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  void Stop() {
    if (!acceptor_.joinable()) return;
    shutdown(listener_, SHUT_RDWR);
    acceptor_.join();
    close(listener_);
    for (std::thread& t : pumps_) t.join();
  }
  // Per connection: what the client sent, what the server sent.
  std::vector<std::pair<std::string, std::string>> streams() {
    lbcc::MutexLock lock(&mu_);
    return streams_;
  }

 private:
  void Accept() {
    while (true) {
      const int client = accept(listener_, nullptr, nullptr);
      if (client < 0) return;
      absl::StatusOr<SocketAddress> to = ParseSocketAddress(server_, "server");
      const int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (!to.ok() || ConnectBefore(server, to->get(), to->length, absl::Now() + absl::Seconds(10)) != 0) {
        Die("the relay cannot reach the server");
      }
      size_t index;
      {
        lbcc::MutexLock lock(&mu_);
        index = streams_.size();
        streams_.emplace_back();
      }
      pumps_.emplace_back([this, client, server, index] { Pump(client, server, index, true); });
      pumps_.emplace_back([this, client, server, index] { Pump(server, client, index, false); });
    }
  }
  void Pump(int from, int to, size_t index, bool client_side) {
    char buffer[1 << 16];
    while (true) {
      const ssize_t n = read(from, buffer, sizeof(buffer));
      if (n <= 0) break;
      {
        lbcc::MutexLock lock(&mu_);
        std::string& s = client_side ? streams_[index].first : streams_[index].second;
        s.append(buffer, static_cast<size_t>(n));
      }
      if (write(to, buffer, static_cast<size_t>(n)) != n) break;
    }
    shutdown(to, SHUT_WR);
    shutdown(from, SHUT_RD);
  }

  const std::string server_;
  int listener_ = -1, port_ = 0;
  std::thread acceptor_;
  std::vector<std::thread> pumps_;
  lbcc::Mutex mu_;
  std::vector<std::pair<std::string, std::string>> streams_ ABSL_GUARDED_BY(mu_);
};

// A callback's result, awaited.
template <typename T>
class Wait {
 public:
  absl::AnyInvocable<void(T)> Callback() {
    return [this](T v) {
      lbcc::MutexLock lock(&mu_);
      value_.emplace(std::move(v));
    };
  }
  T Get() {
    lbcc::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return value_.has_value(); },
                              absl::Seconds(60))) {
      Die("a transfer did not complete");
    }
    return *value_;
  }

 private:
  lbcc::Mutex mu_;
  std::optional<T> value_ ABSL_GUARDED_BY(mu_);
};

void Transfer(Endpoint& from, Endpoint& to, size_t bytes, Tag tag) {
  std::vector<uint8_t> out(bytes), in(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(i * 131 + tag);
  Wait<absl::Status> sent;
  Wait<absl::StatusOr<size_t>> got;
  from.Send(tag, out, {}, sent.Callback());
  to.Recv(tag, absl::MakeSpan(in), got.Callback());
  if (!sent.Get().ok() || !got.Get().ok() || in != out) Die("a transfer failed");
}

// The stream's frames, without those over 64 KiB (the probe's bulk data): small seeds, and
// every frame in them as it crossed.
std::string SmallFrames(const std::string& stream) {
  SocketFrameReader reader;
  std::string out;
  size_t at = 0, start = 0;
  while (at < stream.size()) {
    const absl::Span<uint8_t> space = reader.Space();
    const size_t n = std::min(space.size(), stream.size() - at);
    std::memcpy(space.data(), stream.data() + at, n);
    at += n;
    if (!reader.Received(n, kMaxSocketFrameBytes).ok()) Die("a recorded frame does not parse");
    if (!reader.ready()) continue;
    if (at - start <= (64 << 10)) out.append(stream, start, at - start);
    reader.Next();
    start = at;
  }
  return out;
}

struct Case {
  std::string name;
  bool secret;
  bool has_class;
  LinkClass link_class;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) Die("usage: socket_frame_fuzz_corpus OUTPUT_DIR (transport/testdata)");
  const std::string dir = absl::StrCat(argv[1], "/socket_frame_corpus");
  mkdir(dir.c_str(), 0755);
  int written = 0;
  for (const Case& c : {Case{"plain_fast", false, true, LinkClass::kFast},
                        Case{"secret_slow", true, true, LinkClass::kSlow},
                        Case{"probed", false, false, LinkClass::kFast}}) {
    TransportOptions options;
    if (c.secret) options.security.secret = JobSecret::Random();
    std::unique_ptr<Transport> server = NewSocketTransport(options);
    std::unique_ptr<Transport> client = NewSocketTransport(options);
    absl::StatusOr<std::string> address = server->Listen("127.0.0.1:0");
    if (!address.ok()) Die(address.status().ToString());
    Relay relay(*address);
    ConnectOptions connect;
    connect.has_link_class = c.has_class;
    connect.link_class = c.link_class;
    absl::StatusOr<std::unique_ptr<Endpoint>> a =
        client->Connect(relay.address(), absl::Seconds(60), connect);
    if (!a.ok()) Die(a.status().ToString());
    absl::StatusOr<std::unique_ptr<Endpoint>> b = server->Accept(absl::Seconds(60));
    if (!b.ok()) Die(b.status().ToString());
    Tag tag = 1;
    for (size_t bytes : {size_t{1}, size_t{3} << 10, size_t{40} << 10}) {
      Transfer(**a, **b, bytes, tag++);
      Transfer(**b, **a, bytes, tag++);
    }
    (*a)->Close();
    (*b)->Close();
    client->Shutdown();
    server->Shutdown();
    relay.Stop();
    const auto streams = relay.streams();
    for (size_t i = 0; i < streams.size(); ++i) {
      for (const auto& [side, bytes] : {std::make_pair("client", SmallFrames(streams[i].first)),
                                        std::make_pair("server", SmallFrames(streams[i].second))}) {
        if (bytes.empty()) continue;
        for (const unsigned char seed : {0, 255}) {
          const std::string path =
              absl::StrCat(dir, "/", c.name, "_conn", i, "_", side, "_cut", int{seed});
          std::ofstream out(path, std::ios::binary);
          out.put(static_cast<char>(seed));
          out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
          if (!out) Die(absl::StrCat("cannot write ", path));
          ++written;
        }
      }
    }
  }
  std::printf("wrote %d seed files to %s\n", written, dir.c_str());
  return 0;
}
