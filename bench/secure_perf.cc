// secure_perf: what authentication and encryption cost on UCX links (issue 24), two transports in
// this process over UCX tcp on lo (the bytes cross real sockets). One JSON object per line:
//
//   secure_perf --mode=plain|integrity|encrypted [--bytes=4M --count=64 --window=8 --connects=20]
//
// plain: no job secret; integrity: a secret, LBCC_ENCRYPT=none (every chunk authenticated);
// encrypted: a secret, LBCC_ENCRYPT=all (AES-256-GCM). Reports the median connect time of
// `connects` fresh links (Connect + Accept, no probe: links are fast by configuration) and the
// point-to-point throughput of `count` messages of `bytes`, `window` in flight, one way.
// bench/secure_bench.sh alternates the modes and writes bench/results/secure.md.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/env.h"
#include "base/mutex.h"
#include "transport/options.h"
#include "transport/secure.h"
#include "transport/transport.h"
#include "transport/ucx_transport.h"

ABSL_FLAG(std::string, mode, "plain", "plain, integrity or encrypted");
ABSL_FLAG(std::string, bytes, "4M", "message size (K, M, G suffixes)");
ABSL_FLAG(int, count, 64, "timed messages");
ABSL_FLAG(int, window, 8, "messages in flight");
ABSL_FLAG(int, connects, 20, "links set up for the connect time");

namespace lbcc {
namespace {

using transport::Endpoint;
using transport::Transport;

// Counts completions; Wait(n) returns once n arrived or an error did.
class Counter {
 public:
  void Done(const absl::Status& status) {
    MutexLock lock(&mu_);
    ++done_;
    if (!status.ok() && error_.ok()) error_ = status;
  }
  absl::Status Wait(int n) {
    MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= n || !error_.ok(); };
    if (!mu_.AwaitWithTimeout(ready, absl::Minutes(5))) return absl::DeadlineExceededError("wait");
    return error_;
  }

 private:
  Mutex mu_;
  int done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

int Run() {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  transport::TransportOptions options;
  options.ucx_tls = "tcp";
  options.ucx_net_devices = "lo";
  options.link_class = transport::LinkClass::kFast;
  if (mode != "plain") {
    options.security.secret = transport::JobSecret::Random();
    options.security.encrypt =
        mode == "encrypted" ? transport::EncryptMode::kAll : transport::EncryptMode::kNone;
  }
  absl::StatusOr<int64_t> bytes = env::ParseBytes(absl::GetFlag(FLAGS_bytes));
  if (!bytes.ok() || (mode != "plain" && mode != "integrity" && mode != "encrypted")) {
    std::fprintf(stderr, "secure_perf: bad --bytes or --mode (see --help)\n");
    return 2;
  }
  auto server = transport::NewUcxTransport(options);
  auto client = transport::NewUcxTransport(options);
  if (!server.ok() || !client.ok()) {
    std::fprintf(stderr, "secure_perf: %s\n", std::string((server.ok() ? client : server).status().message()).c_str());
    return 1;
  }
  absl::StatusOr<std::string> address = (*server)->Listen("127.0.0.1:0");
  if (!address.ok()) return 1;

  // Connect time: fresh links, each Connect + Accept.
  std::vector<double> connect_us;
  std::unique_ptr<Endpoint> a, b;
  for (int i = 0; i < absl::GetFlag(FLAGS_connects); ++i) {
    const absl::Time start = absl::Now();
    auto ca = (*client)->Connect(*address, absl::Seconds(60), {});
    auto sb = (*server)->Accept(absl::Seconds(60));
    if (!ca.ok() || !sb.ok()) {
      std::fprintf(stderr, "secure_perf: connect: %s\n",
                   std::string((ca.ok() ? sb.status() : ca.status()).message()).c_str());
      return 1;
    }
    connect_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    a = *std::move(ca);
    b = *std::move(sb);
  }
  std::sort(connect_us.begin(), connect_us.end());

  // Throughput on the last link, a -> b.
  const int count = absl::GetFlag(FLAGS_count);
  const int window = absl::GetFlag(FLAGS_window);
  std::vector<uint8_t> data(*bytes, 7);
  std::vector<std::vector<uint8_t>> sinks(window, std::vector<uint8_t>(*bytes));
  auto round = [&](int messages) -> absl::Status {
    Counter sent, received;
    for (int i = 0; i < messages; ++i) {
      if (i >= window) {
        absl::Status status = received.Wait(i - window + 1);
        if (!status.ok()) return status;
      }
      b->Recv(1, absl::MakeSpan(sinks[i % window]),
              [&received](absl::StatusOr<size_t> r) { received.Done(r.status()); });
      a->Send(1, data, {}, [&sent](absl::Status s) { sent.Done(s); });
    }
    absl::Status status = received.Wait(messages);
    if (!status.ok()) return status;
    return sent.Wait(messages);
  };
  if (absl::Status warm = round(window); !warm.ok()) return 1;
  const absl::Time start = absl::Now();
  if (absl::Status timed = round(count); !timed.ok()) {
    std::fprintf(stderr, "secure_perf: %s\n", std::string(timed.message()).c_str());
    return 1;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const transport::LinkCounters counters = a->counters();
  std::printf(
      "{\"mode\": \"%s\", \"bytes\": %lld, \"count\": %d, \"window\": %d, "
      "\"bytes_per_second\": %.6g, \"connect_us_median\": %.1f, \"connects\": %zu, "
      "\"authenticated\": %s, \"encrypted\": %s}\n",
      mode.c_str(), static_cast<long long>(*bytes), count, window,
      static_cast<double>(*bytes) * count / seconds, connect_us[connect_us.size() / 2],
      connect_us.size(), counters.authenticated ? "true" : "false",
      counters.encrypted ? "true" : "false");
  return 0;
}

}  // namespace
}  // namespace lbcc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return lbcc::Run();
}
