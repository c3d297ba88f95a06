// The membership service against clients that are not members (issue 44 item 3): a thousand
// half-open connections, random bytes, truncated and oversized frames, a slow sender, a client
// that joins and never answers, and one address opening more connections than it may hold,
// while real members (threads over the loopback transport) join, step, leave and rejoin. The
// real members must all complete and never be dropped; every hostile connection must end
// closed by the master (its limits: README, Security). Hostile clients connect from other
// loopback addresses (127.0.0.2 and up) than the members (127.0.0.1), as strangers would.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_matchers.h"
#include "comm/elastic/elastic.h"
#include "comm/elastic/elastic_testing.h"
#include "comm/elastic/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/netif.h"

namespace lbcc::comm {
namespace {

using ::lbcc::testing::IsOk;
using elastic::Message;
using elastic::MsgType;
using elastic_testing::TestMember;

// A raw client socket from `source` (a loopback address) to the master; -1 on failure.
int ConnectFrom(const std::string& source, const std::string& master) {
  absl::StatusOr<transport::HostAndPort> hp = transport::ParseHostPort(master, "master");
  if (!hp.ok()) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source.c_str(), &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(hp->port));
  inet_pton(AF_INET, hp->host.c_str(), &to.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string Framed(const std::string& body) {
  std::string out(4, '\0');
  const uint32_t size = static_cast<uint32_t>(body.size());
  std::memcpy(out.data(), &size, 4);
  return out + body;
}

std::string JoinFrame(const std::string& job, const std::string& name) {
  Message join;
  join.type = MsgType::kJoin;
  join.job_id = job;
  join.name = name;
  return Framed(elastic::Encode(join));
}

bool SendAll(int fd, const std::string& bytes) {
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

// Reads (and discards) until the master closes `fd` or `deadline`; true when it closed. What
// it read is appended to `*got` when given.
bool ClosedByMaster(int fd, absl::Time deadline, std::string* got = nullptr) {
  char buffer[4096];
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p{fd, POLLIN, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(
                                  absl::ToInt64Milliseconds(left) + 1, 1000)));
    if (n <= 0) continue;
    const ssize_t r = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (r == 0) return true;
    if (r < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return true;  // reset by the master
    }
    if (got != nullptr) got->append(buffer, static_cast<size_t>(r));
  }
}

// The decoded frames in `bytes` (stops at the first incomplete or corrupt one).
std::vector<Message> Frames(const std::string& bytes) {
  elastic::FrameReader reader(elastic::kMaxFrame);
  reader.Append(bytes);
  std::vector<Message> out;
  while (true) {
    absl::StatusOr<std::optional<std::string>> body = reader.Next();
    if (!body.ok() || !body->has_value()) return out;
    absl::StatusOr<Message> m = elastic::Decode(**body);
    if (!m.ok()) return out;
    out.push_back(*m);
  }
}

void RaiseFileLimit() {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
}

ElasticMasterOptions HostileMasterOptions(int min_members) {
  ElasticMasterOptions o = elastic_testing::TestMasterOptions(min_members);
  o.peer_timeout = absl::Seconds(3);  // the member that never answers is evicted in 3 s
  o.handshake_timeout = absl::Seconds(2);
  return o;
}

// One address may hold max_connections_per_address connections: the ones past it are closed
// at once, unanswered, while the ones within it are served (a join for another job is refused
// with an answer).
TEST(MasterHostileTest, AnAddressHoldsAtMostItsConnectionLimit) {
  ElasticMasterOptions o = HostileMasterOptions(1);
  o.max_connections_per_address = 4;
  o.handshake_timeout = absl::Hours(1);  // nothing ends by the deadline in this test
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ElasticMaster> master, ElasticMaster::Start(o));
  std::vector<int> fds;
  for (int i = 0; i < 6; ++i) {
    fds.push_back(ConnectFrom("127.0.0.9", master->address()));
    ASSERT_GE(fds.back(), 0);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int i = 4; i < 6; ++i) {
    std::string got;
    EXPECT_TRUE(ClosedByMaster(fds[i], deadline, &got)) << "connection " << i;
    EXPECT_EQ(got, "") << "connection " << i << " past the limit got an answer";
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(SendAll(fds[i], JoinFrame("another-job", "stranger")));
    std::string got;
    EXPECT_TRUE(ClosedByMaster(fds[i], deadline, &got));
    const std::vector<Message> answer = Frames(got);
    ASSERT_EQ(answer.size(), 1u) << "connection " << i;
    EXPECT_EQ(answer[0].type, MsgType::kRefuse);
    EXPECT_EQ(answer[0].code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  }
  for (int fd : fds) close(fd);
  // Closed connections no longer count: the address may connect again and be served.
  const int again = ConnectFrom("127.0.0.9", master->address());
  ASSERT_GE(again, 0);
  ASSERT_TRUE(SendAll(again, JoinFrame("another-job", "stranger")));
  std::string got;
  EXPECT_TRUE(ClosedByMaster(again, absl::Now() + absl::Seconds(60), &got));
  EXPECT_EQ(Frames(got).size(), 1u);
  close(again);
}

// A connection's first message must be a join; anything else is refused with a reason.
TEST(MasterHostileTest, AFirstMessageThatIsNotAJoinIsRefused) {
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ElasticMaster> master,
                            ElasticMaster::Start(HostileMasterOptions(1)));
  const int fd = ConnectFrom("127.0.0.3", master->address());
  ASSERT_GE(fd, 0);
  Message report;
  report.type = MsgType::kReport;
  ASSERT_TRUE(SendAll(fd, Framed(elastic::Encode(report))));
  std::string got;
  EXPECT_TRUE(ClosedByMaster(fd, absl::Now() + absl::Seconds(60), &got));
  const std::vector<Message> answer = Frames(got);
  ASSERT_EQ(answer.size(), 1u);
  EXPECT_EQ(answer[0].type, MsgType::kRefuse);
  EXPECT_EQ(answer[0].code, static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(answer[0].text, ::testing::HasSubstr("first message must be a join"));
  close(fd);
}

TEST(MasterHostileTest, RealMembersCompleteWhileHostileClientsAttack) {
  RaiseFileLimit();
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ElasticMaster> master,
                            ElasticMaster::Start(HostileMasterOptions(2)));
  const std::string address = master->address();
  auto codec = elastic_testing::TestCodec();

  // The attack, all at once before the members join: every connection below must end closed
  // by the master.
  struct Hostile {
    int fd;
    std::string what;
  };
  std::vector<Hostile> hostile;
  std::mt19937 rng(44);
  // 1000 half-open connections (connected, silent) from 20 addresses, 50 each.
  for (int i = 0; i < 1000; ++i) {
    const int fd = ConnectFrom(absl::StrCat("127.0.0.", 10 + i % 20), address);
    ASSERT_GE(fd, 0) << "half-open connection " << i;
    hostile.push_back({fd, "half-open"});
  }
  // Random bytes, truncated frames, oversized frames (each from its own address).
  for (int i = 0; i < 20; ++i) {
    const int fd = ConnectFrom("127.0.0.40", address);
    ASSERT_GE(fd, 0);
    std::string junk(1 + rng() % 2000, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    ASSERT_TRUE(SendAll(fd, junk));
    hostile.push_back({fd, "random bytes"});
  }
  for (int i = 0; i < 10; ++i) {
    const int fd = ConnectFrom("127.0.0.41", address);
    ASSERT_GE(fd, 0);
    const std::string join = JoinFrame("job-1", "truncated");
    ASSERT_TRUE(SendAll(fd, join.substr(0, join.size() / 2)));
    hostile.push_back({fd, "truncated frame"});
  }
  for (uint32_t size : {elastic::kMaxMemberFrame + 1, 0x7fffffffu, 0xffffffffu}) {
    const int fd = ConnectFrom("127.0.0.42", address);
    ASSERT_GE(fd, 0);
    std::string frame(4, '\0');
    std::memcpy(frame.data(), &size, 4);
    ASSERT_TRUE(SendAll(fd, frame + std::string(1000, 'x')));
    hostile.push_back({fd, "oversized frame"});
  }
  // A slow sender: a valid join, one byte every 100 ms: longer than the handshake timeout.
  std::atomic<bool> slow_done{false};
  std::thread slow([&] {
    const int fd = ConnectFrom("127.0.0.43", address);
    const std::string join = JoinFrame("job-1", "slow");
    size_t sent = 0;
    for (; fd >= 0 && sent < join.size(); ++sent) {
      if (send(fd, join.data() + sent, 1, MSG_NOSIGNAL) != 1) break;
      absl::SleepFor(absl::Milliseconds(100));  // the client's pace, not a synchronisation
    }
    std::string got;
    if (fd >= 0) {
      ClosedByMaster(fd, absl::Now() + absl::Seconds(60), &got);
      for (const Message& m : Frames(got)) {
        EXPECT_NE(m.type, MsgType::kWelcome) << "the slow sender was welcomed";
      }
      close(fd);
    }
    slow_done = true;
  });
  // A client that joins and then never answers (no heartbeat, no report): the master takes it
  // as a member and evicts it after the peer timeout; the real members' epoch that includes it
  // fails and they retry without it.
  const int mute = ConnectFrom("127.0.0.44", address);
  ASSERT_GE(mute, 0);
  ASSERT_TRUE(SendAll(mute, JoinFrame("job-1", "mute")));

  // Real members: m0 and m1 step throughout; m2 joins, steps, leaves and joins again.
  constexpr int kSteps = 6;
  TestMember m[3];
  std::vector<absl::Status> results(3);
  for (int i = 0; i < 3; ++i) m[i].seed = i;
  std::vector<std::thread> members;
  // Both step until the job's step kSteps (one may be admitted a step later than the other).
  for (int i = 0; i < 2; ++i) {
    members.emplace_back([&, i] {
      results[i] = m[i].Join(address, absl::StrCat("m", i), absl::Seconds(3));
      while (results[i].ok() && m[i].group->step() < kSteps) results[i] = m[i].Step(*codec);
    });
  }
  for (auto& t : members) t.join();
  for (int i = 0; i < 2; ++i) ASSERT_THAT(results[i], IsOk()) << "member m" << i;
  // m2 comes and goes twice while m0 and m1 go on stepping.
  for (int round = 0; round < 2; ++round) {
    const uint64_t target = m[0].group->step() + 3;
    auto until = [&](int i) {
      while (results[i].ok() && m[i].group->step() < target) results[i] = m[i].Step(*codec);
    };
    std::thread newcomer([&] {
      results[2] = m[2].Join(address, absl::StrCat("m2-", round), absl::Seconds(3));
      until(2);
    });
    ASSERT_TRUE(master->AwaitWaiting(1, absl::Seconds(60)));
    std::thread other([&] { until(1); });
    until(0);
    other.join();
    newcomer.join();
    for (int i = 0; i < 3; ++i) ASSERT_THAT(results[i], IsOk()) << "member " << i;
    ASSERT_THAT(m[2].Leave(), IsOk());
  }
  const uint64_t done = m[0].group->step();
  EXPECT_EQ(done, static_cast<uint64_t>(kSteps + 6));
  EXPECT_EQ(m[1].group->step(), done);
  EXPECT_TRUE(master->AwaitCommittedSteps(done, absl::Seconds(30)));
  for (int i = 0; i < 2; ++i) {
    ASSERT_THAT(m[i].Leave(), IsOk()) << "member m" << i << " was dropped";
  }

  // Every hostile connection ended closed by the master, none welcomed except the mute one.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  int open = 0;
  for (const Hostile& h : hostile) {
    std::string got;
    if (!ClosedByMaster(h.fd, deadline, &got)) {
      ++open;
      ADD_FAILURE() << h.what << " connection still open";
    }
    for (const Message& msg : Frames(got)) {
      EXPECT_NE(msg.type, MsgType::kWelcome) << h.what << " connection was welcomed";
    }
    close(h.fd);
  }
  EXPECT_EQ(open, 0);
  std::string mute_got;
  EXPECT_TRUE(ClosedByMaster(mute, deadline, &mute_got)) << "the mute member is still connected";
  bool evicted = false;
  for (const Message& msg : Frames(mute_got)) evicted |= msg.type == MsgType::kEvicted;
  EXPECT_TRUE(evicted) << "the mute member was not told it was evicted";
  close(mute);
  slow.join();
  EXPECT_TRUE(slow_done);
}

}  // namespace
}  // namespace lbcc::comm
