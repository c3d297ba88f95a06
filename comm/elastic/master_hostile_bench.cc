// Members' join latency at the membership service, quiet and under 1,000 hostile connections
// (issue 44 item 3; bench/master_hostile.sh writes bench/results/master_hostile.md from its
// output). Two measures, each alternating quiet and hostile blocks in one process:
//   welcome: connect + join + the master's welcome (the service's own part of a join), raw
//            sockets from 127.0.0.1, the connection closed after;
//   group:   ElasticGroup::Join of a member into an empty job (connect, join, welcome and its
//            admission into the first epoch; the communicator is built in the background) and
//            its Leave.
// Hostile load: 1,000 connections held open from 127.0.0.10-29 (50 per address; each one the
// master closes at its handshake timeout is opened again at once), plus a client sending 64
// random bytes every 10 ms and one sending a join a byte every 100 ms, reconnecting when closed.
//
//   master_hostile_bench [--welcome_joins N] [--group_joins N] [--blocks N]
// Prints markdown table rows (measure, load, joins, median, p90, max in ms).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/elastic/elastic.h"
#include "comm/elastic/elastic_testing.h"
#include "comm/elastic/wire.h"
#include "transport/netif.h"

namespace {

using namespace lbcc::comm;
namespace transport = lbcc::transport;

int ConnectFrom(const std::string& source, const transport::HostAndPort& master) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source.c_str(), &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(master.port));
  inet_pton(AF_INET, master.host.c_str(), &to.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string Framed(const elastic::Message& m) {
  const std::string body = elastic::Encode(m);
  std::string out(4, '\0');
  const uint32_t size = static_cast<uint32_t>(body.size());
  std::memcpy(out.data(), &size, 4);
  return out + body;
}

// Keeps `count` silent connections open, plus a random-bytes client and a slow sender, until
// stopped. Each connection the master closes is opened again.
class HostileLoad {
 public:
  HostileLoad(transport::HostAndPort master, int count) : master_(std::move(master)) {
    for (int i = 0; i < count; ++i) fds_.push_back(-1);
    thread_ = std::thread([this] { Run(); });
  }
  ~HostileLoad() {
    stop_ = true;
    thread_.join();
  }
  int64_t reopened() const { return reopened_; }

 private:
  // One epoll set over every hostile connection: the load's own cost does not grow with
  // the connections it holds (it shares the machine with the master it measures).
  void Run() {
    std::mt19937 rng(44);
    elastic::Message join;
    join.type = elastic::MsgType::kJoin;
    join.job_id = "bench";
    join.name = "slow";
    const std::string slow_join = Framed(join);
    const int ep = epoll_create1(EPOLL_CLOEXEC);
    // Slots 0..count-1: silent connections; count: the random-bytes client; count+1: slow.
    const size_t junk = fds_.size(), slow = fds_.size() + 1;
    fds_.resize(fds_.size() + 2, -1);
    size_t slow_at = 0;
    absl::Time next_junk = absl::Now(), next_byte = absl::Now();
    auto open = [&](size_t slot) {
      if (fds_[slot] >= 0) return;
      const std::string source = slot == junk   ? "127.0.0.40"
                                 : slot == slow ? "127.0.0.43"
                                                : absl::StrCat("127.0.0.", 10 + slot % 20);
      fds_[slot] = ConnectFrom(source, master_);
      if (fds_[slot] < 0) return;
      if (slot < junk) ++reopened_;
      if (slot == slow) slow_at = 0;
      epoll_event e{};
      e.events = EPOLLIN | EPOLLRDHUP;
      e.data.u64 = slot;
      epoll_ctl(ep, EPOLL_CTL_ADD, fds_[slot], &e);
    };
    auto closed = [&](size_t slot) {
      epoll_ctl(ep, EPOLL_CTL_DEL, fds_[slot], nullptr);
      close(fds_[slot]);
      fds_[slot] = -1;
    };
    for (size_t slot = 0; slot < fds_.size(); ++slot) open(slot);
    epoll_event events[256];
    char buffer[4096];
    std::vector<size_t> reopen;
    while (!stop_) {
      const absl::Time now = absl::Now();
      if (fds_[junk] >= 0 && now >= next_junk) {
        std::string bytes(64, '\0');
        for (char& c : bytes) c = static_cast<char>(rng());
        if (send(fds_[junk], bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
            errno != EAGAIN) {
          closed(junk);
          reopen.push_back(junk);
        }
        next_junk = now + absl::Milliseconds(10);
      }
      if (fds_[slow] >= 0 && now >= next_byte && slow_at < slow_join.size()) {
        if (send(fds_[slow], slow_join.data() + slow_at, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
          ++slow_at;
        }
        next_byte = now + absl::Milliseconds(100);
      }
      for (size_t slot : reopen) open(slot);
      reopen.clear();
      for (size_t slot = 0; slot < fds_.size(); ++slot) {
        if (fds_[slot] < 0) reopen.push_back(slot);  // a connect that failed: again next round
      }
      const int n = epoll_wait(ep, events, 256, 10);
      for (int i = 0; i < n; ++i) {
        const size_t slot = events[i].data.u64;
        if (fds_[slot] < 0) continue;
        const ssize_t r = recv(fds_[slot], buffer, sizeof(buffer), MSG_DONTWAIT);
        if (r > 0 || (r < 0 && errno == EAGAIN)) continue;
        closed(slot);  // closed by the master: open another
        reopen.push_back(slot);
      }
    }
    for (size_t slot = 0; slot < fds_.size(); ++slot) {
      if (fds_[slot] >= 0) closed(slot);
    }
    close(ep);
  }

  const transport::HostAndPort master_;
  std::vector<int> fds_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> reopened_{0};
  std::thread thread_;
};

// connect + join + welcome, in ms; negative on failure.
double WelcomeMs(const transport::HostAndPort& master) {
  elastic::Message join;
  join.type = elastic::MsgType::kJoin;
  join.job_id = "bench";
  join.name = "member";
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<elastic::Socket>> sock = elastic::Socket::Connect(
      transport::JoinHostPort(master.host, master.port), start + absl::Seconds(30));
  if (!sock.ok() || !(*sock)->Send(join, start + absl::Seconds(30)).ok()) return -1;
  absl::StatusOr<elastic::Message> m = (*sock)->Receive(start + absl::Seconds(30));
  if (!m.ok() || m->type != elastic::MsgType::kWelcome) return -1;
  return absl::ToDoubleMilliseconds(absl::Now() - start);
}

double GroupJoinMs(const std::string& master) {
  elastic_testing::TestMember member;
  const absl::Time start = absl::Now();
  absl::Status s = member.Join(master, "member");
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  if (!s.ok()) {
    std::fprintf(stderr, "group join: %s\n", std::string(s.ToString()).c_str());
    return -1;
  }
  if (!member.Leave().ok()) return -1;
  return ms;
}

void Row(const char* measure, const char* load, std::vector<double> ms, int failed) {
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) { return ms.empty() ? 0.0 : ms[static_cast<size_t>(q * (ms.size() - 1))]; };
  std::printf("| %s | %s | %zu | %d | %.2f | %.2f | %.2f |\n", measure, load, ms.size(), failed,
              at(0.5), at(0.9), ms.empty() ? 0.0 : ms.back());
}

int Flag(int argc, char** argv, const char* name, int fallback) {
  const std::string prefix = absl::StrCat("--", name, "=");
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]).rfind(prefix, 0) == 0) return std::atoi(argv[i] + prefix.size());
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int welcome_joins = Flag(argc, argv, "welcome_joins", 100);
  const int group_joins = Flag(argc, argv, "group_joins", 10);
  const int blocks = Flag(argc, argv, "blocks", 2);
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);

  ElasticMasterOptions o;
  o.job_id = "bench";
  o.min_members = 1 << 20;  // welcome joins only wait: no epoch, no bootstrap root per join
  o.peer_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<ElasticMaster>> master = ElasticMaster::Start(o);
  if (!master.ok()) {
    std::fprintf(stderr, "%s\n", std::string(master.status().ToString()).c_str());
    return 1;
  }
  const std::string address = (*master)->address();
  const transport::HostAndPort hp = *transport::ParseHostPort(address, "master");

  // Group joins need the job id the test members use.
  ElasticMasterOptions g = o;
  g.job_id = "job-1";
  g.min_members = 1;
  absl::StatusOr<std::unique_ptr<ElasticMaster>> group_master = ElasticMaster::Start(g);
  if (!group_master.ok()) return 1;
  const transport::HostAndPort ghp =
      *transport::ParseHostPort((*group_master)->address(), "master");

  std::vector<double> welcome[2], group[2];
  int failed[2][2] = {{0, 0}, {0, 0}};
  int64_t reopened = 0;
  for (int block = 0; block < blocks; ++block) {
    for (int hostile = 0; hostile < 2; ++hostile) {
      std::unique_ptr<HostileLoad> load, gload;
      if (hostile) {
        load = std::make_unique<HostileLoad>(hp, 1000);
        gload = std::make_unique<HostileLoad>(ghp, 1000);
        // Let the load reach its 2 x 1,000 connections before measuring.
        while (load->reopened() < 1000 || gload->reopened() < 1000) {
          absl::SleepFor(absl::Milliseconds(50));  // waiting for the load's set-up, not a sync
        }
      }
      for (int i = 0; i < welcome_joins; ++i) {
        const double ms = WelcomeMs(hp);
        if (ms < 0) ++failed[0][hostile]; else welcome[hostile].push_back(ms);
      }
      for (int i = 0; i < group_joins; ++i) {
        const double ms = GroupJoinMs((*group_master)->address());
        if (ms < 0) ++failed[1][hostile]; else group[hostile].push_back(ms);
      }
      if (load) reopened += load->reopened() + gload->reopened();
    }
  }
  Row("welcome", "quiet", welcome[0], failed[0][0]);
  Row("welcome", "1,000 hostile connections", welcome[1], failed[0][1]);
  Row("group", "quiet", group[0], failed[1][0]);
  Row("group", "1,000 hostile connections", group[1], failed[1][1]);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  std::printf("RATIO welcome %.2f\n", median(welcome[1]) / std::max(median(welcome[0]), 1e-9));
  std::printf("RATIO group %.2f\n", median(group[1]) / std::max(median(group[0]), 1e-9));
  std::printf("HOSTILE_CONNECTIONS_OPENED %lld\n", static_cast<long long>(reopened));
  return failed[0][0] + failed[0][1] + failed[1][0] + failed[1][1] == 0 ? 0 : 1;
}
