// transport_perf: LBCC's UCX transport between two processes, for measurements and multi-process
// tests. One side serves, the other connects and drives; results are one JSON object per line.
//
//   transport_perf serve --listen=10.77.0.2:0 [--once]
//       prints "listening <address>", then serves connections: a sink for bulk messages (tag 1),
//       an echo for pings (tag 2 -> 8-byte reply on tag 3, high priority) and sync requests
//       (tag 0) answered once the given number of bulk messages has arrived.
//   transport_perf bw --connect=ADDR [--bytes=4M --count=200 --window=8 --priority=bulk]
//       bulk messages, `window` in flight; prints bytes_per_second and the link counters.
//   transport_perf prio --connect=ADDR [--ping_bytes=64K --rounds=20 --bulk_bytes=4M ...]
//       round trips of a high-priority ping, first on an idle link, then with the link saturated
//       by bulk messages; prints both, the chunk time and the budget 1.5 x idle + one chunk.
//   transport_perf classify --connect=ADDR      the link class and probe figures
//   transport_perf hold --connect=ADDR          connects, sends a hello (tag 4), waits forever
//
// Transport settings come from the LBCC_* environment (LBCC_LINK_CLASS, LBCC_SLOW_*, ...) and
// UCX's (UCX_TLS, UCX_NET_DEVICES); --tls and --devices pin UCX here.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/env.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "base/mutex.h"
#include "transport/options.h"
#include "transport/transport.h"
#include "transport/ucx_transport.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "serve: address to listen on (port 0: any)");
ABSL_FLAG(bool, once, false, "serve: exit after the first connection ends");
ABSL_FLAG(std::string, connect, "", "client: address printed by serve");
ABSL_FLAG(std::string, tls, "tcp", "UCX transports (UCX_TLS); empty: UCX's choice");
ABSL_FLAG(std::string, devices, "", "UCX devices (UCX_NET_DEVICES); empty: UCX's choice");
ABSL_FLAG(std::string, link_class, "", "client: fast or slow (skips the probe); empty: auto");
ABSL_FLAG(std::string, bytes, "4M", "bw: message size");
ABSL_FLAG(int, count, 200, "bw: messages");
ABSL_FLAG(int, window, 8, "bw/prio: bulk messages in flight");
ABSL_FLAG(std::string, priority, "bulk", "bw: high, normal or bulk");
ABSL_FLAG(std::string, ping_bytes, "64K", "prio: size of the high-priority message");
ABSL_FLAG(int, rounds, 20, "prio: round trips per phase");
ABSL_FLAG(std::string, bulk_bytes, "4M", "prio: size of the bulk messages that load the link");
ABSL_FLAG(std::string, max_bytes, "16M", "serve: largest message the sink accepts");
ABSL_FLAG(double, timeout_s, 120, "set-up and per-phase timeout in seconds");
ABSL_FLAG(bool, announce, false, "bw: print {\"event\": \"bulk_started\"} before the bulk phase");

namespace lbcc::transport {
namespace {

using json = nlohmann::json;

constexpr Tag kTagSync = 0;
constexpr Tag kTagBulk = 1;
constexpr Tag kTagPing = 2;
constexpr Tag kTagPong = 3;
constexpr Tag kTagHello = 4;

int64_t Bytes(const std::string& text) {
  absl::StatusOr<int64_t> bytes = env::ParseBytes(text);
  if (!bytes.ok()) {
    std::fprintf(stderr, "transport_perf: %s\n", std::string(bytes.status().message()).c_str());
    std::exit(2);
  }
  return *bytes;
}

// Reports the failure on stderr and as a JSON line on stdout (for the tools reading it), then
// exits 1 at once (pending callbacks may still reference this thread's stack).
[[noreturn]] void Die(const absl::Status& status, const std::string& what) {
  std::fprintf(stderr, "transport_perf: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::fflush(stderr);
  std::printf("{\"error\": \"%s\", \"code\": \"%s\"}\n", what.c_str(),
              absl::StatusCodeToString(status.code()).c_str());
  std::fflush(stdout);
  std::_Exit(1);
}

absl::Duration Timeout() { return absl::Seconds(absl::GetFlag(FLAGS_timeout_s)); }

json CountersJson(const LinkCounters& c) {
  return json{{"link_class", std::string(LinkClassName(c.link_class))},
              {"stripes", c.stripes},
              {"probed_send_bytes_per_second", c.probed_send_bytes_per_second},
              {"probed_recv_bytes_per_second", c.probed_recv_bytes_per_second},
              {"probed_rtt_seconds", c.probed_rtt_seconds},
              {"bytes_sent", c.bytes_sent},
              {"bytes_received", c.bytes_received},
              {"messages_sent", c.messages_sent},
              {"messages_received", c.messages_received},
              {"chunks_sent", c.chunks_sent},
              {"chunks_received", c.chunks_received},
              {"send_bytes_per_second", c.send_bytes_per_second},
              {"recv_bytes_per_second", c.recv_bytes_per_second},
              {"queued_messages", c.queued_messages},
              {"queued_bytes", c.queued_bytes},
              {"inflight_bytes", c.inflight_bytes},
              {"max_queued_messages", c.max_queued_messages},
              {"retries", c.retries},
              {"pacing_waits", c.pacing_waits}};
}

void Print(const json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

std::unique_ptr<Transport> MakeTransport() {
  absl::StatusOr<TransportOptions> options = TransportOptions::FromEnv();
  if (!options.ok()) Die(options.status(), "configuration");
  options->ucx_tls = absl::GetFlag(FLAGS_tls);
  options->ucx_net_devices = absl::GetFlag(FLAGS_devices);
  absl::StatusOr<std::unique_ptr<Transport>> transport = NewUcxTransport(*options);
  if (!transport.ok()) Die(transport.status(), "UCX");
  return *std::move(transport);
}

// A countdown the main thread waits on while callbacks run on the transport's thread.
class Waiter {
 public:
  void Add(int n) {
    MutexLock lock(&mu_);
    pending_ += n;
  }
  void Done(absl::Status status) {
    MutexLock lock(&mu_);
    --pending_;
    if (!status.ok() && error_.ok()) error_ = status;
  }
  absl::Status Wait(absl::Duration timeout) {
    MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout([this] { return pending_ == 0 || !error_.ok(); }, timeout)) {
      return absl::DeadlineExceededError("timed out");
    }
    return error_;
  }

 private:
  Mutex mu_;
  int pending_ = 0;
  absl::Status error_;
};

// ---------------------------------------------------------------------------------------------
// serve

class Session : public std::enable_shared_from_this<Session> {
 public:
  explicit Session(std::unique_ptr<Endpoint> endpoint) : endpoint_(std::move(endpoint)) {}

  void Start() {
    const size_t max_bytes = static_cast<size_t>(Bytes(absl::GetFlag(FLAGS_max_bytes)));
    // All buffers first: completions of early receives read bulk_ on the callback thread.
    bulk_.assign(16, std::vector<uint8_t>(max_bytes));
    for (int i = 0; i < 16; ++i) PostBulk(i);
    ping_.resize(max_bytes);
    PostPing();
    PostSync();
    hello_.resize(64);
    endpoint_->Recv(kTagHello, absl::MakeSpan(hello_), [](absl::StatusOr<size_t>) {});
  }

  // Blocks until the peer goes away.
  void Wait() {
    MutexLock lock(&mu_);
    mu_.Await([this] { return !failure_.ok(); });
  }
  LinkCounters counters() const { return endpoint_->counters(); }

 private:
  void Fail(const absl::Status& status) {
    MutexLock lock(&mu_);
    if (failure_.ok()) failure_ = status;
  }
  void PostBulk(int slot) {
    endpoint_->Recv(kTagBulk, absl::MakeSpan(bulk_[slot]),
                    [self = shared_from_this(), slot](absl::StatusOr<size_t> n) {
                      if (!n.ok()) return self->Fail(n.status());
                      {
                        MutexLock lock(&self->mu_);
                        ++self->received_;
                      }
                      self->AnswerSyncs();
                      self->PostBulk(slot);
                    });
  }
  void PostPing() {
    endpoint_->Recv(kTagPing, absl::MakeSpan(ping_), [self = shared_from_this()](
                                                         absl::StatusOr<size_t> n) {
      if (!n.ok()) return self->Fail(n.status());
      self->endpoint_->Send(kTagPong, absl::MakeConstSpan(self->pong_), {Priority::kHigh},
                            [](absl::Status) {});
      self->PostPing();
    });
  }
  void PostSync() {
    endpoint_->Recv(kTagSync, absl::MakeSpan(sync_in_), [self = shared_from_this()](
                                                            absl::StatusOr<size_t> n) {
      if (!n.ok()) return self->Fail(n.status());
      uint64_t want;
      std::memcpy(&want, self->sync_in_.data(), sizeof(want));
      {
        MutexLock lock(&self->mu_);
        self->sync_wanted_.push_back(want);
      }
      self->AnswerSyncs();
      self->PostSync();
    });
  }
  void AnswerSyncs() {
    std::vector<uint64_t> answer;
    {
      MutexLock lock(&mu_);
      while (!sync_wanted_.empty() && received_ >= sync_wanted_.front()) {
        answer.push_back(received_);
        sync_wanted_.pop_front();
      }
    }
    for (uint64_t received : answer) {
      auto reply = std::make_shared<std::vector<uint8_t>>(sizeof(received));
      std::memcpy(reply->data(), &received, sizeof(received));
      endpoint_->Send(kTagSync, *reply, {Priority::kHigh}, [reply](absl::Status) {});
    }
  }

  std::unique_ptr<Endpoint> endpoint_;
  std::vector<std::vector<uint8_t>> bulk_;
  std::vector<uint8_t> ping_;
  std::vector<uint8_t> pong_ = std::vector<uint8_t>(8);
  std::vector<uint8_t> hello_;
  std::vector<uint8_t> sync_in_ = std::vector<uint8_t>(8);
  Mutex mu_;
  uint64_t received_ = 0;
  std::deque<uint64_t> sync_wanted_;
  absl::Status failure_;
};

int Serve() {
  std::unique_ptr<Transport> transport = MakeTransport();
  absl::StatusOr<std::string> address = transport->Listen(absl::GetFlag(FLAGS_listen));
  if (!address.ok()) Die(address.status(), "listen");
  std::printf("listening %s\n", address->c_str());
  std::fflush(stdout);
  do {
    absl::StatusOr<std::unique_ptr<Endpoint>> endpoint = transport->Accept(absl::InfiniteDuration());
    if (!endpoint.ok()) Die(endpoint.status(), "accept");
    auto session = std::make_shared<Session>(*std::move(endpoint));
    session->Start();
    session->Wait();
    Print(json{{"event", "session_end"}, {"counters", CountersJson(session->counters())}});
  } while (!absl::GetFlag(FLAGS_once));
  return 0;
}

// ---------------------------------------------------------------------------------------------
// clients

std::unique_ptr<Endpoint> Connect(Transport& transport) {
  ConnectOptions options;
  const std::string link_class = absl::GetFlag(FLAGS_link_class);
  if (!link_class.empty()) {
    absl::StatusOr<LinkClass> parsed = ParseLinkClass(link_class);
    if (!parsed.ok()) Die(parsed.status(), "--link_class");
    options.has_link_class = true;
    options.link_class = *parsed;
  }
  absl::StatusOr<std::unique_ptr<Endpoint>> endpoint =
      transport.Connect(absl::GetFlag(FLAGS_connect), Timeout(), options);
  if (!endpoint.ok()) Die(endpoint.status(), "connect");
  return *std::move(endpoint);
}

// Asks the server to answer once `messages` bulk messages arrived in total; waits for it.
absl::Status Sync(Endpoint& endpoint, uint64_t messages) {
  std::vector<uint8_t> request(8), reply(8);
  std::memcpy(request.data(), &messages, 8);
  Waiter waiter;
  waiter.Add(2);
  endpoint.Recv(kTagSync, absl::MakeSpan(reply),
                [&waiter](absl::StatusOr<size_t> n) { waiter.Done(n.status()); });
  endpoint.Send(kTagSync, request, {Priority::kHigh},
                [&waiter](absl::Status s) { waiter.Done(s); });
  return waiter.Wait(Timeout());
}

// Keeps `window` bulk messages in flight until Stop(); counts completions.
class BulkStream {
 public:
  BulkStream(Endpoint& endpoint, size_t bytes, int window, Priority priority)
      : endpoint_(endpoint), data_(bytes, 0x5a), window_(window), priority_(priority) {}

  // Sends `count` messages (0: until Stop()).
  void Start(uint64_t count) {
    MutexLock lock(&mu_);
    limit_ = count;
    for (int i = 0; i < window_; ++i) SendLocked();
  }
  void Stop() {
    MutexLock lock(&mu_);
    stopped_ = true;
  }
  // Waits until nothing is in flight; the number of messages sent.
  absl::StatusOr<uint64_t> Drain() {
    MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout([this] { return inflight_ == 0; }, Timeout())) {
      return absl::DeadlineExceededError("bulk stream did not drain");
    }
    if (!error_.ok()) return error_;
    return completed_;
  }

 private:
  void SendLocked() {
    if (stopped_ || (limit_ > 0 && started_ >= limit_) || !error_.ok()) return;
    ++started_;
    ++inflight_;
    endpoint_.Send(kTagBulk, data_, {priority_}, [this](absl::Status status) {
      MutexLock lock(&mu_);
      --inflight_;
      if (!status.ok()) {
        if (error_.ok()) error_ = status;
        return;
      }
      ++completed_;
      SendLocked();
    });
  }

  Endpoint& endpoint_;
  const std::vector<uint8_t> data_;
  const int window_;
  const Priority priority_;
  Mutex mu_;
  uint64_t limit_ = 0;
  uint64_t started_ = 0;
  uint64_t completed_ = 0;
  int inflight_ = 0;
  bool stopped_ = false;
  absl::Status error_;
};

Priority ParsePriority(const std::string& text) {
  if (text == "high") return Priority::kHigh;
  if (text == "normal") return Priority::kNormal;
  if (text == "bulk") return Priority::kBulk;
  Die(absl::InvalidArgumentError(text), "--priority (high, normal, bulk)");
}

int Bandwidth() {
  std::unique_ptr<Transport> transport = MakeTransport();
  std::unique_ptr<Endpoint> endpoint = Connect(*transport);
  const size_t bytes = static_cast<size_t>(Bytes(absl::GetFlag(FLAGS_bytes)));
  const int count = absl::GetFlag(FLAGS_count);
  BulkStream warmup(*endpoint, bytes, 2, ParsePriority(absl::GetFlag(FLAGS_priority)));
  warmup.Start(4);
  absl::StatusOr<uint64_t> warm = warmup.Drain();
  if (!warm.ok()) Die(warm.status(), "warm-up");
  if (absl::Status s = Sync(*endpoint, *warm); !s.ok()) Die(s, "sync");

  BulkStream stream(*endpoint, bytes, absl::GetFlag(FLAGS_window),
                    ParsePriority(absl::GetFlag(FLAGS_priority)));
  if (absl::GetFlag(FLAGS_announce)) Print(json{{"event", "bulk_started"}});
  const absl::Time start = absl::Now();
  stream.Start(count);
  absl::StatusOr<uint64_t> sent = stream.Drain();
  if (!sent.ok()) Die(sent.status(), "bulk");
  if (absl::Status s = Sync(*endpoint, *warm + *sent); !s.ok()) Die(s, "sync");
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  Print(json{{"mode", "bw"},
             {"bytes", bytes},
             {"messages", *sent},
             {"seconds", seconds},
             {"bytes_per_second", static_cast<double>(bytes) * *sent / seconds},
             {"counters", CountersJson(endpoint->counters())}});
  return 0;
}

struct PingSample {
  double seconds = 0;
  uint64_t queued_bytes_at_send = 0;   // Bulk bytes waiting in the scheduler when sent.
  uint64_t bulk_bytes_during = 0;      // Bulk bytes that completed while the ping was out.
};

absl::StatusOr<PingSample> Ping(Endpoint& endpoint, const std::vector<uint8_t>& ping) {
  std::vector<uint8_t> pong(8);
  Waiter waiter;
  waiter.Add(2);
  PingSample sample;
  const LinkCounters before = endpoint.counters();
  sample.queued_bytes_at_send = before.queued_bytes;
  const absl::Time start = absl::Now();
  endpoint.Recv(kTagPong, absl::MakeSpan(pong),
                [&waiter](absl::StatusOr<size_t> n) { waiter.Done(n.status()); });
  endpoint.Send(kTagPing, ping, {Priority::kHigh}, [&waiter](absl::Status s) { waiter.Done(s); });
  LBCC_RETURN_IF_ERROR(waiter.Wait(Timeout()));
  sample.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const uint64_t sent = endpoint.counters().bytes_sent - before.bytes_sent;
  sample.bulk_bytes_during = sent > ping.size() ? sent - ping.size() : 0;
  return sample;
}

json Summary(std::vector<PingSample> samples) {
  std::vector<double> s;
  for (const PingSample& p : samples) s.push_back(p.seconds);
  std::sort(s.begin(), s.end());
  auto at = [&](double q) { return s[std::min(s.size() - 1, static_cast<size_t>(q * s.size()))]; };
  return json{{"p50_seconds", at(0.5)}, {"p90_seconds", at(0.9)}, {"max_seconds", s.back()},
              {"min_seconds", s.front()}};
}

int PriorityLatency() {
  std::unique_ptr<Transport> transport = MakeTransport();
  std::unique_ptr<Endpoint> endpoint = Connect(*transport);
  const std::vector<uint8_t> ping(static_cast<size_t>(Bytes(absl::GetFlag(FLAGS_ping_bytes))), 1);
  const int rounds = absl::GetFlag(FLAGS_rounds);

  std::vector<PingSample> idle;
  for (int i = 0; i < rounds + 2; ++i) {
    absl::StatusOr<PingSample> sample = Ping(*endpoint, ping);
    if (!sample.ok()) Die(sample.status(), "idle ping");
    if (i >= 2) idle.push_back(*sample);  // The first two warm the connection up.
  }

  const size_t bulk_bytes = static_cast<size_t>(Bytes(absl::GetFlag(FLAGS_bulk_bytes)));
  BulkStream bulk(*endpoint, bulk_bytes, absl::GetFlag(FLAGS_window), Priority::kBulk);
  const LinkCounters before_bulk = endpoint->counters();
  const absl::Time bulk_start = absl::Now();
  bulk.Start(0);
  // Saturate first: wait until a few bulk messages have completed.
  while (endpoint->counters().messages_sent < before_bulk.messages_sent + 3) {
    if (absl::Now() - bulk_start > Timeout()) Die(absl::DeadlineExceededError(""), "bulk start");
    absl::SleepFor(absl::Milliseconds(5));  // Polling the counters, not synchronising.
  }
  // Pings start at random points of the bulk chunks in flight (a pipeline's activations do not
  // wait for chunk boundaries): a random pause of up to one chunk's time before each.
  absl::StatusOr<TransportOptions> options = TransportOptions::FromEnv();
  if (!options.ok()) Die(options.status(), "configuration");
  const double chunk = endpoint->link_class() == LinkClass::kSlow
                           ? static_cast<double>(options->scheduler.chunk_bytes)
                           : static_cast<double>(options->fast_chunk_bytes);
  const LinkCounters saturated = endpoint->counters();
  const double early_rate = (saturated.bytes_sent - before_bulk.bytes_sent) /
                            absl::ToDoubleSeconds(absl::Now() - bulk_start);
  std::mt19937 random(12345);
  std::uniform_real_distribution<double> phase(0, chunk / early_rate);
  std::vector<PingSample> loaded;
  for (int i = 0; i < rounds; ++i) {
    absl::SleepFor(absl::Seconds(phase(random)));
    absl::StatusOr<PingSample> sample = Ping(*endpoint, ping);
    if (!sample.ok()) Die(sample.status(), "loaded ping");
    loaded.push_back(*sample);
  }
  const LinkCounters during = endpoint->counters();
  const double bulk_seconds = absl::ToDoubleSeconds(absl::Now() - bulk_start);
  bulk.Stop();
  absl::StatusOr<uint64_t> sent = bulk.Drain();
  if (!sent.ok()) Die(sent.status(), "bulk");
  const double bulk_rate = (during.bytes_sent - before_bulk.bytes_sent) / bulk_seconds;

  const double chunk_seconds = chunk / bulk_rate;
  json idle_summary = Summary(idle);
  json loaded_summary = Summary(loaded);
  const double budget = 1.5 * idle_summary["p50_seconds"].get<double>() + chunk_seconds;
  uint64_t overtaken = 0;
  json samples = json::array();
  for (const PingSample& p : loaded) {
    if (p.bulk_bytes_during < p.queued_bytes_at_send) ++overtaken;
    samples.push_back(json{{"seconds", p.seconds},
                           {"queued_bytes_at_send", p.queued_bytes_at_send},
                           {"bulk_bytes_during", p.bulk_bytes_during}});
  }
  Print(json{{"mode", "prio"},
             {"ping_bytes", ping.size()},
             {"idle", idle_summary},
             {"loaded", loaded_summary},
             {"bulk_bytes_per_second", bulk_rate},
             {"chunk_seconds", chunk_seconds},
             {"budget_seconds", budget},
             {"loaded_p50_over_budget", loaded_summary["p50_seconds"].get<double>() / budget},
             {"loaded_max_over_budget", loaded_summary["max_seconds"].get<double>() / budget},
             {"pings_that_overtook_queued_bulk", overtaken},
             {"samples", samples},
             {"counters", CountersJson(endpoint->counters())}});
  return 0;
}

int Classify() {
  std::unique_ptr<Transport> transport = MakeTransport();
  std::unique_ptr<Endpoint> endpoint = Connect(*transport);
  Print(json{{"mode", "classify"}, {"counters", CountersJson(endpoint->counters())}});
  return 0;
}

int Hold() {
  std::unique_ptr<Transport> transport = MakeTransport();
  std::unique_ptr<Endpoint> endpoint = Connect(*transport);
  static const std::vector<uint8_t> hello = {'h', 'i'};
  endpoint->Send(kTagHello, hello, {}, [](absl::Status) {});
  Print(json{{"mode", "hold"}, {"connected", true}});
  while (true) absl::SleepFor(absl::Hours(1));  // Until killed: the peer's dead-peer tests.
}

}  // namespace
}  // namespace lbcc::transport

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "transport_perf serve|bw|prio|classify|hold [--flags]; see transport/transport_perf.cc");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: transport_perf serve|bw|prio|classify|hold [--flags]\n");
    return 2;
  }
  const std::string mode = args[1];
  using namespace lbcc::transport;  // NOLINT: main only.
  if (mode == "serve") return Serve();
  if (absl::GetFlag(FLAGS_connect).empty()) {
    std::fprintf(stderr, "transport_perf %s: --connect is required\n", mode.c_str());
    return 2;
  }
  if (mode == "bw") return Bandwidth();
  if (mode == "prio") return PriorityLatency();
  if (mode == "classify") return Classify();
  if (mode == "hold") return Hold();
  std::fprintf(stderr, "transport_perf: unknown mode '%s'\n", mode.c_str());
  return 2;
}
