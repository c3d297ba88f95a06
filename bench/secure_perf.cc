// secure_perf: what authentication and encryption cost on UCX links (issue 24), two transports in
// this process over UCX tcp on lo (the bytes cross real sockets). One JSON object per line:
//
//   secure_perf [--bytes=4M --count=16 --window=8 --connects=20 --rounds=15]
//
// Three variants, alternating so that the machine's load falls on all alike: plain (no job
// secret), integrity (a secret, LBCC_ENCRYPT=none: every chunk authenticated) and encrypted (a
// secret, LBCC_ENCRYPT=all: AES-256-GCM). Per variant: the times of `connects` fresh links
// (Connect + Accept; no probe: links are fast by configuration; each and their median; with
// several variants in one process their transports' threads share the cores, so
// bench/secure_bench.sh times connects with one variant per process), and the median and best
// throughput of `rounds` runs of `count` messages of `bytes`, `window` in flight, one way.
// Each round also times this CPU's AES-256-GCM limit through the same EVP code the links use
// (SecureChannel::Seal and Open of 1 MiB chunks on one thread, --cipher_ms each; rates and the
// thread's CPU time per byte): the ceiling the encrypted link's work runs against, measured
// under the same load ({"mode": "cipher"}). Each variant also reports the process's CPU time
// (all threads) per byte it moved, the same split by thread name with each name's run-queue wait
// (runnable, no core free; /proc/self/task/*/schedstat), and the fraction of the machine's cores
// that stood idle during its rounds (/proc/stat): where the time goes. --modes runs some of the variants (for profiling one).
// bench/secure_bench.sh writes them to bench/results/secure.md.
#include <dirent.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/env.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "transport/options.h"
#include "transport/secure.h"
#include "transport/transport.h"
#include "transport/ucx_transport.h"

ABSL_FLAG(std::string, bytes, "4M", "message size (K, M, G suffixes)");
ABSL_FLAG(int, count, 16, "messages per timed round");
ABSL_FLAG(int, window, 8, "messages in flight");
ABSL_FLAG(int, connects, 20, "links set up per variant for the connect time");
ABSL_FLAG(int, rounds, 15, "timed rounds per variant (the variants alternate)");
ABSL_FLAG(int, cipher_ms, 100, "milliseconds per round of the one-thread AES-256-GCM loop");
ABSL_FLAG(std::string, modes, "plain,integrity,encrypted", "variants to run (for profiling one)");

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

struct Variant {
  std::string mode;
  std::unique_ptr<Transport> server, client;
  std::string address;
  std::unique_ptr<Endpoint> a, b;
  std::vector<double> connect_us, bytes_per_second;
  std::vector<double> cpu_ns_per_byte;  // This process's CPU time (all threads) per byte moved.
  std::vector<double> idle_fraction;    // Of the machine's cores, idle while the round ran.
  // Per thread name (lbcc-crypto, lbcc-ucx-prog, ...), summed over the rounds: CPU time and time
  // spent runnable but waiting for a core (the scheduler's run-queue delay), in ns.
  std::map<std::string, std::pair<double, double>> threads;
  double bytes_moved = 0;
  double faults = 0;  // Minor page faults during the rounds.
  std::vector<uint8_t> data;
  std::vector<std::vector<uint8_t>> sinks;
};

// Minor page faults of this process so far (fresh buffers being touched).
double ProcessMinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_minflt);
}

double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Every thread of this process: name -> (CPU ns, run-queue wait ns), from /proc/self/task/*/
// schedstat (nanoseconds, unlike stat's clock ticks). Threads of one name are summed.
using ThreadTimes = std::map<std::string, std::pair<double, double>>;
ThreadTimes ReadThreadTimes() {
  ThreadTimes times;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return times;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const std::string task = absl::StrCat("/proc/self/task/", entry->d_name);
    std::ifstream comm(task + "/comm"), sched(task + "/schedstat");
    std::string name;
    double run = 0, wait = 0;
    if (!std::getline(comm, name) || !(sched >> run >> wait)) continue;
    if (absl::StartsWith(name, "secure_perf")) name = "main";
    times[name].first += run;
    times[name].second += wait;
  }
  closedir(dir);
  return times;
}

// The machine's (idle, total) jiffies from /proc/stat's "cpu" line.
std::pair<double, double> ReadCpuJiffies() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  stat >> cpu;
  double idle = 0, total = 0, value;
  for (int field = 0; field < 8 && stat >> value; ++field) {
    total += value;
    if (field == 3 || field == 4) idle += value;  // idle, iowait
  }
  return {idle, total};
}

absl::Status Setup(Variant& v) {
  transport::TransportOptions options;
  options.ucx_tls = "tcp";
  options.ucx_net_devices = "lo";
  options.link_class = transport::LinkClass::kFast;
  if (v.mode != "plain") {
    options.security.secret = transport::JobSecret::Random();
    options.security.encrypt =
        v.mode == "encrypted" ? transport::EncryptMode::kAll : transport::EncryptMode::kNone;
  }
  LBCC_ASSIGN_OR_RETURN(v.server, transport::NewUcxTransport(options));
  LBCC_ASSIGN_OR_RETURN(v.client, transport::NewUcxTransport(options));
  LBCC_ASSIGN_OR_RETURN(v.address, v.server->Listen("127.0.0.1:0"));
  return absl::OkStatus();
}

// A fresh link (Connect + Accept), timed; it replaces the variant's link.
absl::Status Connect(Variant& v) {
  const absl::Time start = absl::Now();
  LBCC_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> a, v.client->Connect(v.address, absl::Seconds(60), {}));
  LBCC_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> b, v.server->Accept(absl::Seconds(60)));
  v.connect_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  v.a = std::move(a);
  v.b = std::move(b);
  return absl::OkStatus();
}

// `messages` of `bytes`, `window` in flight, a -> b; returns bytes per second.
absl::StatusOr<double> Stream(Variant& v, int64_t bytes, int messages, int window) {
  // Allocated (and faulted in) once per variant, so that rounds time the link, not the heap.
  std::vector<uint8_t>& data = v.data;
  std::vector<std::vector<uint8_t>>& sinks = v.sinks;
  if (data.size() != static_cast<size_t>(bytes) || sinks.size() != static_cast<size_t>(window)) {
    data.assign(bytes, 7);
    sinks.assign(window, std::vector<uint8_t>(bytes));
  }
  Counter sent, received;
  const ThreadTimes threads_start = ReadThreadTimes();
  const std::pair<double, double> jiffies_start = ReadCpuJiffies();
  const double cpu_start = ProcessCpuSeconds();
  const double faults_start = ProcessMinorFaults();
  const absl::Time start = absl::Now();
  for (int i = 0; i < messages; ++i) {
    if (i >= window) LBCC_RETURN_IF_ERROR(received.Wait(i - window + 1));
    v.b->Recv(1, absl::MakeSpan(sinks[i % window]),
              [&received](absl::StatusOr<size_t> r) { received.Done(r.status()); });
    v.a->Send(1, data, {}, [&sent](absl::Status s) { sent.Done(s); });
  }
  LBCC_RETURN_IF_ERROR(received.Wait(messages));
  LBCC_RETURN_IF_ERROR(sent.Wait(messages));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  v.cpu_ns_per_byte.push_back((ProcessCpuSeconds() - cpu_start) * 1e9 /
                              (static_cast<double>(bytes) * messages));
  const std::pair<double, double> jiffies_end = ReadCpuJiffies();
  if (jiffies_end.second > jiffies_start.second) {
    v.idle_fraction.push_back((jiffies_end.first - jiffies_start.first) /
                              (jiffies_end.second - jiffies_start.second));
  }
  for (const auto& [name, times] : ReadThreadTimes()) {
    auto it = threads_start.find(name);
    const std::pair<double, double> before =
        it != threads_start.end() ? it->second : std::pair<double, double>{0, 0};
    v.threads[name].first += times.first - before.first;
    v.threads[name].second += times.second - before.second;
  }
  v.bytes_moved += static_cast<double>(bytes) * messages;
  v.faults += ProcessMinorFaults() - faults_start;
  return static_cast<double>(bytes) * messages / seconds;
}

// One thread sealing (then opening) 1 MiB chunks for `duration` each: bytes per second.
struct CipherRate {
  double seal = 0, open = 0;
  double seal_cpu_ns = 0, open_cpu_ns = 0;  // This thread's CPU time per byte.
};

double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
absl::StatusOr<CipherRate> Cipher(bool encrypt, absl::Duration duration) {
  transport::HandshakeTranscript t;
  t.client_nonce = transport::NewNonce();
  t.server_nonce = transport::NewNonce();
  const transport::JobSecret secret = transport::JobSecret::Random();
  LBCC_ASSIGN_OR_RETURN(auto sender, transport::SecureChannel::Create(
                                         secret, t, transport::HandshakeRole::kClient, encrypt,
                                         "cipher"));
  LBCC_ASSIGN_OR_RETURN(auto receiver, transport::SecureChannel::Create(
                                           secret, t, transport::HandshakeRole::kServer, encrypt,
                                           "cipher"));
  constexpr size_t kChunk = 1 << 20;
  constexpr int kBatch = 8;
  const uint8_t aad[48] = {};
  std::vector<uint8_t> plain(kChunk, 3), opened(kChunk);
  std::vector<std::vector<uint8_t>> sealed(
      kBatch, std::vector<uint8_t>(kChunk + transport::SecureChannel::kOverhead));
  CipherRate rate;
  absl::Duration seal_time, open_time;
  double seal_cpu = 0, open_cpu = 0;
  int64_t n = 0;
  // Batches of kBatch chunks: sealed by one channel, opened by a fresh peer (each counter opens
  // once); only the Seal and Open calls are timed.
  while (seal_time < duration || open_time < duration) {
    LBCC_ASSIGN_OR_RETURN(receiver, transport::SecureChannel::Create(
                                        secret, t, transport::HandshakeRole::kServer, encrypt,
                                        "cipher"));
    LBCC_ASSIGN_OR_RETURN(sender, transport::SecureChannel::Create(
                                      secret, t, transport::HandshakeRole::kClient, encrypt,
                                      "cipher"));
    absl::Time start = absl::Now();
    double cpu = ThreadCpuSeconds();
    for (auto& chunk : sealed) {
      LBCC_RETURN_IF_ERROR(sender->Seal(aad, plain.data(), kChunk, chunk.data()));
    }
    seal_time += absl::Now() - start;
    seal_cpu += ThreadCpuSeconds() - cpu;
    start = absl::Now();
    cpu = ThreadCpuSeconds();
    for (const auto& chunk : sealed) {
      LBCC_RETURN_IF_ERROR(receiver->Open(aad, encrypt, chunk.data(), chunk.size(), opened.data()));
    }
    open_time += absl::Now() - start;
    open_cpu += ThreadCpuSeconds() - cpu;
    n += kBatch;
  }
  rate.seal = static_cast<double>(n) * kChunk / absl::ToDoubleSeconds(seal_time);
  rate.open = static_cast<double>(n) * kChunk / absl::ToDoubleSeconds(open_time);
  rate.seal_cpu_ns = seal_cpu * 1e9 / (static_cast<double>(n) * kChunk);
  rate.open_cpu_ns = open_cpu * 1e9 / (static_cast<double>(n) * kChunk);
  return rate;
}

// The handshake's own cryptography for one link, both ends (what a connect adds beyond the AUTH
// message's round trip): two nonces, the server's and the client's proof, each checked by the
// other end, and both ends' HKDF key derivations. Median of `n` in microseconds.
absl::StatusOr<double> HandshakeCryptoUs(int n) {
  const transport::JobSecret secret = transport::JobSecret::Random();
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    const absl::Time start = absl::Now();
    transport::HandshakeTranscript t;
    t.job_id = "job";
    t.client_nonce = transport::NewNonce();
    t.server_nonce = transport::NewNonce();
    for (int side = 0; side < 2; ++side) {  // Each end computes both proofs (one to send, one to check).
      const transport::Mac server = transport::HandshakeMac(secret, t, transport::HandshakeRole::kServer);
      const transport::Mac client = transport::HandshakeMac(secret, t, transport::HandshakeRole::kClient);
      if (!transport::MacEqual(server, server) || !transport::MacEqual(client, client)) {
        return absl::InternalError("MAC");
      }
    }
    LBCC_RETURN_IF_ERROR(transport::SecureChannel::Create(
                             secret, t, transport::HandshakeRole::kClient, true, "a")
                             .status());
    LBCC_RETURN_IF_ERROR(transport::SecureChannel::Create(
                             secret, t, transport::HandshakeRole::kServer, true, "b")
                             .status());
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "secure_perf: %s\n", std::string(status.message()).c_str());
  return 1;
}

int Run() {
  absl::StatusOr<int64_t> bytes = env::ParseBytes(absl::GetFlag(FLAGS_bytes));
  if (!bytes.ok()) return Fail(bytes.status());
  std::vector<Variant> variants;
  for (absl::string_view mode : absl::StrSplit(absl::GetFlag(FLAGS_modes), ',')) {
    if (mode != "plain" && mode != "integrity" && mode != "encrypted") {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--modes: unknown variant '", mode, "'")));
    }
    variants.push_back({std::string(mode)});
  }
  for (Variant& v : variants) {
    if (absl::Status s = Setup(v); !s.ok()) return Fail(s);
  }
  // The variants alternate, so that the machine's load drifts over all of them alike.
  for (int i = 0; i < absl::GetFlag(FLAGS_connects); ++i) {
    for (Variant& v : variants) {
      if (absl::Status s = Connect(v); !s.ok()) return Fail(s);
    }
  }
  const int window = absl::GetFlag(FLAGS_window);
  for (Variant& v : variants) {
    if (absl::StatusOr<double> warm = Stream(v, *bytes, window, window); !warm.ok()) {
      return Fail(warm.status());
    }
    v.cpu_ns_per_byte.clear();
    v.idle_fraction.clear();
    v.threads.clear();
    v.bytes_moved = 0;
    v.faults = 0;
  }
  std::vector<double> seal[2], open[2], seal_cpu[2], open_cpu[2];  // [encrypt]
  const absl::Duration cipher_time = absl::Milliseconds(absl::GetFlag(FLAGS_cipher_ms));
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (Variant& v : variants) {
      absl::StatusOr<double> rate = Stream(v, *bytes, absl::GetFlag(FLAGS_count), window);
      if (!rate.ok()) return Fail(rate.status());
      v.bytes_per_second.push_back(*rate);
    }
    for (const bool encrypt : {false, true}) {
      absl::StatusOr<CipherRate> rate = Cipher(encrypt, cipher_time);
      if (!rate.ok()) return Fail(rate.status());
      seal[encrypt].push_back(rate->seal);
      open[encrypt].push_back(rate->open);
      seal_cpu[encrypt].push_back(rate->seal_cpu_ns);
      open_cpu[encrypt].push_back(rate->open_cpu_ns);
    }
  }
  absl::StatusOr<double> handshake_us = HandshakeCryptoUs(200);
  if (!handshake_us.ok()) return Fail(handshake_us.status());
  std::printf(
      "{\"mode\": \"cipher\", \"handshake_crypto_us_median\": %.1f, \"chunk\": %d, \"rounds\": %zu, "
      "\"gcm_seal_bytes_per_second_median\": %.6g, \"gcm_open_bytes_per_second_median\": %.6g, "
      "\"mac_seal_bytes_per_second_median\": %.6g, \"mac_open_bytes_per_second_median\": %.6g, "
      "\"gcm_seal_cpu_ns_per_byte_median\": %.4f, \"gcm_open_cpu_ns_per_byte_median\": %.4f, "
      "\"mac_seal_cpu_ns_per_byte_median\": %.4f, \"mac_open_cpu_ns_per_byte_median\": %.4f}\n",
      *handshake_us, 1 << 20, seal[1].size(), Median(seal[1]), Median(open[1]), Median(seal[0]),
      Median(open[0]), Median(seal_cpu[1]), Median(open_cpu[1]), Median(seal_cpu[0]),
      Median(open_cpu[0]));
  for (Variant& v : variants) {
    const transport::LinkCounters counters = v.a->counters();
    std::string threads;
    for (const auto& [name, times] : v.threads) {
      absl::StrAppend(&threads, threads.empty() ? "" : ", ",
                      absl::StrFormat("\"%s\": [%.4f, %.4f]", name, times.first / v.bytes_moved,
                                      times.second / v.bytes_moved));
    }
    std::printf(
        "{\"mode\": \"%s\", \"bytes\": %lld, \"count\": %d, \"window\": %d, "
        "\"rounds\": %zu, \"bytes_per_second_median\": %.6g, \"bytes_per_second_max\": %.6g, "
        "\"connect_us_median\": %.1f, \"connects\": %zu, \"connect_us\": [%s], "
        "\"cpu_ns_per_byte_median\": %.4f, "
        "\"idle_fraction_median\": %.3f, \"threads_ns_per_byte\": {%s}, "
        "\"chunks_per_message\": %.2f, \"minor_faults_per_mib\": %.2f, "
        "\"authenticated\": %s, "
        "\"encrypted\": %s}\n",
        v.mode.c_str(), static_cast<long long>(*bytes), absl::GetFlag(FLAGS_count), window,
        v.bytes_per_second.size(), Median(v.bytes_per_second),
        *std::max_element(v.bytes_per_second.begin(), v.bytes_per_second.end()),
        Median(v.connect_us), v.connect_us.size(),
        absl::StrJoin(v.connect_us, ", ",
                      [](std::string* out, double us) { absl::StrAppendFormat(out, "%.1f", us); })
            .c_str(),
        Median(v.cpu_ns_per_byte),
        v.idle_fraction.empty() ? 0.0 : Median(v.idle_fraction), threads.c_str(),
        counters.messages_sent > 0
            ? static_cast<double>(counters.chunks_sent) / counters.messages_sent
            : 0.0,
        v.bytes_moved > 0 ? v.faults * (1 << 20) / v.bytes_moved : 0.0,
        counters.authenticated ? "true" : "false",
        counters.encrypted ? "true" : "false");
  }
  return 0;
}

}  // namespace
}  // namespace lbcc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return lbcc::Run();
}
