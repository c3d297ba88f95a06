// Link set-up (link_setup.h): the rules parser, the class rule, the set-up's failure handling,
// PeerWatch, and the property the shared set-up exists for: the UCX and loopback backends
// classify the same rules files identically, from both ends of each link.
#include "transport/link_setup.h"

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/loopback.h"
#include "transport/socket_transport.h"
#include "transport/netif.h"
#include "transport/options.h"
#include "transport/test_util.h"
#include "transport/ucx_transport.h"

namespace lbcc::transport {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::lbcc::transport::testing::kWait;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Optional;

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// ---------------------------------------------------------------------------------------------
// The rules parser.

TEST(LinkRulesTest, MostSpecificRuleWins) {
  LBCC_ASSERT_OK_AND_ASSIGN(LinkRules rules, LinkRules::Parse(R"(
      # peer          class
      10.0.0.3        slow   # whole host
      10.0.0.3:5000   fast
      *               slow
  )"));
  EXPECT_THAT(rules.Lookup("10.0.0.3", 5000), Optional(LinkClass::kFast));
  EXPECT_THAT(rules.Lookup("10.0.0.3", 6000), Optional(LinkClass::kSlow));
  EXPECT_THAT(rules.Lookup("10.0.0.3", 0), Optional(LinkClass::kSlow));
  EXPECT_THAT(rules.Lookup("10.0.0.9", 0), Optional(LinkClass::kSlow));
}

TEST(LinkRulesTest, NoRuleNoClass) {
  LBCC_ASSERT_OK_AND_ASSIGN(LinkRules rules, LinkRules::Parse("10.0.0.3 slow\n"));
  EXPECT_EQ(rules.Lookup("10.0.0.4", 1), std::nullopt);
  LBCC_ASSERT_OK_AND_ASSIGN(LinkRules empty, LinkRules::Parse("# nothing\n\n"));
  EXPECT_TRUE(empty.empty());
}

TEST(LinkRulesTest, BadLinesAreInvalidArgumentNamingTheSourceAndLine) {
  EXPECT_THAT(LinkRules::Parse("10.0.0.1 fast\nb medium\n", "r.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("link rules file r.txt line 2"), HasSubstr("medium"))));
  EXPECT_THAT(LinkRules::Parse("a fast extra\n", "r.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("link rules file r.txt line 1: expected")));
  EXPECT_THAT(LinkRules::Parse("\n\nslow\n", "r.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 3")));
  EXPECT_THAT(LinkRules::Parse("a:99999 fast\n", "r.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("r.txt line 1: bad port in 'a:99999'")));
  EXPECT_THAT(LinkRules::Parse("a:0 fast\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("link rules line 1")));
}

TEST(LinkRulesTest, Ipv6PeersBareOrInBrackets) {
  LBCC_ASSERT_OK_AND_ASSIGN(LinkRules rules, LinkRules::Parse(R"(
      fd77::3              slow   # bare: the whole host (its last group is no port)
      [fd77:0::4]          slow   # brackets, written long
      [fd77::4]:5000       fast
      10.0.0.3:5000        fast
  )"));
  EXPECT_THAT(rules.Lookup("fd77::3", 0), Optional(LinkClass::kSlow));
  EXPECT_THAT(rules.Lookup("fd77::3", 5000), Optional(LinkClass::kSlow));
  EXPECT_THAT(rules.Lookup("fd77::4", 6000), Optional(LinkClass::kSlow));
  EXPECT_THAT(rules.Lookup("fd77::4", 5000), Optional(LinkClass::kFast));
  EXPECT_THAT(rules.Lookup("fd77:0:0::4", 5000), Optional(LinkClass::kFast)) << "canonical form";
  EXPECT_EQ(rules.Lookup("fd77::5", 5000), std::nullopt);
  EXPECT_THAT(rules.Lookup("10.0.0.3", 5000), Optional(LinkClass::kFast));
  EXPECT_EQ(rules.Lookup("10.0.0.3", 5001), std::nullopt);
}

TEST(LinkRulesTest, HostNamesStandForTheirAddresses) {
  // localhost resolves everywhere (/etc/hosts): to 127.0.0.1, and to ::1 where that is listed.
  LBCC_ASSERT_OK_AND_ASSIGN(LinkRules rules, LinkRules::Parse("localhost:5000 slow\n"));
  EXPECT_THAT(rules.Lookup("127.0.0.1", 5000), Optional(LinkClass::kSlow));
  EXPECT_THAT(rules.Lookup("localhost", 5000), Optional(LinkClass::kSlow)) << "the name too";
  EXPECT_EQ(rules.Lookup("127.0.0.1", 5001), std::nullopt);
  absl::StatusOr<std::vector<std::string>> addresses = ResolveHost("localhost", "test");
  ASSERT_THAT(addresses, IsOk());
  for (const std::string& address : *addresses) {
    EXPECT_THAT(rules.Lookup(address, 5000), Optional(LinkClass::kSlow)) << address;
  }
}

TEST(LinkRulesTest, BadPeersAreInvalidArgumentNamingThem) {
  EXPECT_THAT(LinkRules::Parse("10.0.0.1 fast\nno-such-host.invalid slow\n", "r.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("r.txt line 2"), HasSubstr("'no-such-host.invalid'"),
                             HasSubstr("does not resolve"))));
  EXPECT_THAT(LinkRules::Parse("[fd77::1 slow\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unclosed bracket")));
  EXPECT_THAT(LinkRules::Parse("[node1]:80 slow\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no IPv6 address")));
  EXPECT_THAT(LinkRules::Parse("[fd77::1]:0 slow\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad port")));
  EXPECT_THAT(LinkRules::Parse("fd77::zz:80 slow\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[addr]:port")));
  EXPECT_THAT(LinkRules::Parse(":80 slow\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no host")));
}

TEST(SplitHostPortTest, BracketedIpv6) {
  HostPort v6 = SplitHostPort("[fd77::2]:4000");
  EXPECT_EQ(v6.host, "fd77::2");
  EXPECT_EQ(v6.port, 4000);
  HostPort v4 = SplitHostPort("10.0.0.2:4000");
  EXPECT_EQ(v4.host, "10.0.0.2");
  EXPECT_EQ(v4.port, 4000);
  EXPECT_EQ(SplitHostPort("rank0").host, "rank0");
}

TEST(LinkRulesTest, LoadNamesTheFileAndLine) {
  const std::string path = WriteFile("bad-rules", "10.0.0.1 slow\n10.0.0.2 sluggish\n");
  EXPECT_THAT(LinkRules::Load(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("link rules file ", path, " line 2"))));
  const std::string good = WriteFile("good-rules", "10.0.0.1 slow\n");
  LBCC_ASSERT_OK_AND_ASSIGN(LinkRules rules, LinkRules::Load(good));
  EXPECT_THAT(rules.Lookup("10.0.0.1", 0), Optional(LinkClass::kSlow));
}

TEST(LinkRulesTest, UnreadableFileSaysSoWithTheReason) {
  EXPECT_THAT(LinkRules::Load("/nonexistent/lbcc-rules"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "cannot read link rules file /nonexistent/lbcc-rules: No such file or "
                       "directory"));
  EXPECT_THAT(LinkRules::Load(::testing::TempDir()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("cannot read link rules file ",
                                              ::testing::TempDir(), ": "))));
}

TEST(SplitHostPortTest, NumericPortOrWholeName) {
  HostPort a = SplitHostPort("10.0.0.3:5000");
  EXPECT_EQ(a.host, "10.0.0.3");
  EXPECT_EQ(a.port, 5000);
  HostPort b = SplitHostPort("rank0");
  EXPECT_EQ(b.host, "rank0");
  EXPECT_EQ(b.port, 0);
  HostPort c = SplitHostPort("name:with:text");
  EXPECT_EQ(c.host, "name:with:text");
  EXPECT_EQ(c.port, 0);
}

TEST(SlowWinsTest, EitherSlowIsSlowEitherFastIsFastNeitherMeasures) {
  constexpr std::optional<LinkClass> kNone, kFast = LinkClass::kFast, kSlow = LinkClass::kSlow;
  EXPECT_EQ(SlowWins(kNone, kNone), kNone);
  EXPECT_EQ(SlowWins(kFast, kNone), kFast);
  EXPECT_EQ(SlowWins(kNone, kFast), kFast);
  EXPECT_EQ(SlowWins(kFast, kFast), kFast);
  EXPECT_EQ(SlowWins(kSlow, kNone), kSlow);
  EXPECT_EQ(SlowWins(kNone, kSlow), kSlow);
  EXPECT_EQ(SlowWins(kFast, kSlow), kSlow);
  EXPECT_EQ(SlowWins(kSlow, kFast), kSlow);
}

// ---------------------------------------------------------------------------------------------
// The set-up's steps, without a backend.

TEST(LinkSetupTest, AStepReturnsTheConnectionFailureAndARetryStartsClean) {
  LinkSetup setup(LinkSetup::Role::kClient, TransportOptions{}, "peer:1", {"peer", 1});
  setup.Fail(absl::UnavailableError("connection refused"));
  setup.Fail(absl::UnavailableError("second failure"));  // The first one is kept.
  EXPECT_THAT(setup.AwaitWelcomes(1, absl::InfiniteFuture()),
              StatusIs(absl::StatusCode::kUnavailable, "connection refused"));
  setup.ClearFailure();
  EXPECT_THAT(setup.AwaitWelcomes(1, absl::Now()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "handshake from peer:1 timed out"));
}

TEST(LinkSetupTest, CancelOutlivesClearFailure) {
  LinkSetup setup(LinkSetup::Role::kClient, TransportOptions{}, "peer:1", {"peer", 1});
  setup.Cancel(absl::CancelledError("transport shut down"));
  setup.ClearFailure();
  EXPECT_THAT(setup.AwaitWelcomes(1, absl::InfiniteFuture()),
              StatusIs(absl::StatusCode::kCancelled, "transport shut down"));
}

TEST(LinkSetupTest, ServerAnswersHelloWithItsConfiguredClassAndTakesReadyOnce) {
  TransportOptions options;
  LBCC_ASSERT_OK_AND_ASSIGN(options.link_rules, LinkRules::Parse("10.0.0.7 slow\n"));
  LinkSetup server(LinkSetup::Role::kServer, options, "10.0.0.7:41000", {"10.0.0.7", 0});
  ProbeScratch scratch;
  LinkSetup::Step welcome = server.OnControl(HelloMessage(42).header, scratch);
  EXPECT_TRUE(welcome.admit);
  ASSERT_TRUE(welcome.reply.has_value());
  EXPECT_EQ(welcome.reply->header.type, static_cast<uint32_t>(Ctl::kWelcome));
  EXPECT_EQ(welcome.reply->header.conn_id, 42u);
  EXPECT_EQ(welcome.reply->header.a, 2u);  // Slow (wire: 0 none, 1 fast, 2 slow).

  LinkParams params;
  params.link_class = LinkClass::kSlow;
  params.probe = {/*send=*/1e6, /*recv=*/2e6, /*rtt=*/0.01};
  LinkSetup::Step ready = server.OnControl(LinkSetup::Ready(42, params).header, scratch);
  ASSERT_TRUE(ready.ready.has_value());
  EXPECT_EQ(ready.ready->link_class, LinkClass::kSlow);
  EXPECT_EQ(ready.ready->probe.send_bytes_per_second, 2e6);  // The client's receive rate.
  EXPECT_EQ(ready.ready->probe.recv_bytes_per_second, 1e6);
  EXPECT_EQ(ready.ready->probe.rtt_seconds, 0.01);
  EXPECT_FALSE(server.OnControl(LinkSetup::Ready(42, params).header, scratch).ready.has_value());
}

TEST(LinkSetupTest, PeerOfAnotherWireVersionIsRefusedAtHelloAndWelcome) {
  ProbeScratch scratch;
  LinkSetup server(LinkSetup::Role::kServer, TransportOptions{}, "10.0.0.7:41000",
                   {"10.0.0.7", 0});
  ControlHeader old_hello = HelloMessage(42).header;
  old_hello.version = kWireVersion - 1;
  LinkSetup::Step refused = server.OnControl(old_hello, scratch);
  EXPECT_TRUE(refused.refuse);
  EXPECT_FALSE(refused.admit);
  EXPECT_FALSE(refused.reply.has_value());

  LinkSetup client(LinkSetup::Role::kClient, TransportOptions{}, "10.0.0.8:41000",
                   {"10.0.0.8", 0});
  ControlHeader welcome = server.OnControl(HelloMessage(43).header, scratch).reply->header;
  EXPECT_EQ(welcome.version, kWireVersion);
  welcome.version = kWireVersion + 1;
  client.OnControl(welcome, scratch);
  EXPECT_THAT(client.AwaitWelcomes(1, absl::Now()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       absl::StrCat("10.0.0.8:41000: it speaks LBCC wire version ",
                                    kWireVersion + 1, ", this build ", kWireVersion,
                                    " (every member of a job must run the same LBCC release)")));
}

// ---------------------------------------------------------------------------------------------
// PeerWatch and WatchClock, with synthetic times.

TEST(PeerWatchTest, HeartbeatsEveryQuarterTimeoutAndFailsASilentPeerWithPendingWork) {
  const absl::Duration timeout = absl::Seconds(4);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  PeerWatch watch;
  EXPECT_FALSE(watch.running());
  watch.Start(t0);
  EXPECT_TRUE(watch.running());
  auto pending = [] { return true; };
  auto idle = [] { return false; };
  PeerWatch::Verdict v = watch.Check(t0 + absl::Milliseconds(500), timeout, false, pending, "p");
  EXPECT_FALSE(v.send_heartbeat);
  EXPECT_THAT(v.failure, IsOk());
  v = watch.Check(t0 + absl::Seconds(1), timeout, false, pending, "p");
  EXPECT_TRUE(v.send_heartbeat);
  v = watch.Check(t0 + absl::Seconds(5), timeout, false, idle, "p");
  EXPECT_THAT(v.failure, IsOk()) << "an idle link may be silent";
  v = watch.Check(t0 + absl::Seconds(5), timeout, false, pending, "10.0.0.3:5000");
  EXPECT_THAT(v.failure, StatusIs(absl::StatusCode::kUnavailable,
                                  AllOf(HasSubstr("no word from 10.0.0.3:5000 for 5s"),
                                        HasSubstr("peer timeout 4s"))));
  watch.HeardFrom(t0 + absl::Seconds(5));
  v = watch.Check(t0 + absl::Seconds(6), timeout, false, pending, "p");
  EXPECT_THAT(v.failure, IsOk());
}

TEST(PeerWatchTest, OurOwnStallRestartsThePeersClock) {
  const absl::Duration timeout = absl::Seconds(4);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  PeerWatch watch;
  watch.Start(t0);
  PeerWatch::Verdict v = watch.Check(t0 + absl::Seconds(9), timeout, /*we_stalled=*/true,
                                     [] { return true; }, "p");
  EXPECT_THAT(v.failure, IsOk());
}

TEST(WatchClockTest, RoundsEveryQuarterTimeoutAtMost100msAndNoticesAStall) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  WatchClock clock(absl::Seconds(4));
  EXPECT_TRUE(clock.Due(t0));
  EXPECT_FALSE(clock.StartRound(t0)) << "the first round is no stall";
  EXPECT_FALSE(clock.Due(t0 + absl::Milliseconds(99)));
  EXPECT_TRUE(clock.Due(t0 + absl::Milliseconds(100)));
  EXPECT_FALSE(clock.StartRound(t0 + absl::Milliseconds(100)));
  EXPECT_TRUE(clock.StartRound(t0 + absl::Milliseconds(1200))) << "> 1 s (a beat) since last";
}

// ---------------------------------------------------------------------------------------------
// Both backends, the same rules files, both ends of each link.

struct Case {
  std::string name;
  // Rules text for each end; "{server}" stands for the server's address.
  std::string client_rules;
  std::string server_rules;
  std::optional<LinkClass> client_link_class;  // LBCC_LINK_CLASS of each end.
  std::optional<LinkClass> server_link_class;
  std::optional<LinkClass> connect_class;  // ConnectOptions.
  LinkClass expected;
};

const std::vector<Case>& Cases() {
  constexpr LinkClass kFast = LinkClass::kFast, kSlow = LinkClass::kSlow;
  static const auto* cases = new std::vector<Case>{
      // The loopback backend used to ignore the server's rules file.
      {"ServerRuleOnly", "", "127.0.0.1 slow", {}, {}, {}, kSlow},
      {"ServerStarRuleOnly", "", "* slow", {}, {}, {}, kSlow},
      {"ClientRuleOnly", "127.0.0.1 slow", "", {}, {}, {}, kSlow},
      {"ClientHostPortRule", "{server} slow\n127.0.0.1 fast", "", {}, {}, {}, kSlow},
      {"ClientHostPortBeatsHost", "{server} fast\n127.0.0.1 slow", "", {}, {}, {}, kFast},
      {"SlowWinsOverFast", "127.0.0.1 fast", "127.0.0.1 slow", {}, {}, {}, kSlow},
      {"SlowWinsOverStarFast", "127.0.0.1 slow", "* fast", {}, {}, {}, kSlow},
      {"BothFast", "127.0.0.1 fast", "* fast", {}, {}, {}, kFast},
      // The server sees the client's host only (its port is ephemeral): a port rule never
      // matches there.
      {"ServerPortRuleNeverMatches", "* fast", "127.0.0.1:1 slow\n* fast", {}, {}, {}, kFast},
      {"ServerRuleBeatsClientLinkClass", "", "127.0.0.1 slow", kFast, {}, {}, kSlow},
      {"ServerLinkClassOnly", "", "", {}, kSlow, {}, kSlow},
      {"RuleBeatsOwnLinkClass", "127.0.0.1 fast", "", kSlow, kFast, {}, kFast},
      {"ConnectOptionBeatsEveryRule", "127.0.0.1 slow", "* slow", kSlow, kSlow, kFast, kFast},
  };
  return *cases;
}

struct Ends {
  LinkClass client_class, server_class;
  int client_stripes, server_stripes;
};

TransportOptions BaseOptions() {
  TransportOptions options;
  options.ucx_tls = "tcp";
  options.ucx_net_devices = "lo";
  options.scheduler.stripes = 2;
  options.probe_max_bytes = 1 << 20;
  return options;
}

// Loads `rules` (with {server} replaced) the way LBCC_LINK_RULES_FILE is loaded.
absl::StatusOr<TransportOptions> OptionsWith(const std::string& file, const std::string& rules,
                                             const std::string& server,
                                             std::optional<LinkClass> link_class) {
  TransportOptions options = BaseOptions();
  options.link_class = link_class;
  const std::string path =
      WriteFile(file, absl::StrReplaceAll(rules, {{"{server}", server}}) + "\n");
  LBCC_ASSIGN_OR_RETURN(options.link_rules, LinkRules::Load(path));
  return options;
}

class SameRulesTest : public ::testing::TestWithParam<Case> {
 protected:
  // Connects a client to a server over `backend`; both listen at `*_address` (UCX: port 0).
  absl::StatusOr<Ends> Classify(const std::string& backend, std::string server_address,
                                std::string client_address, std::string* server_out,
                                std::string* client_out) {
    const Case& c = GetParam();
    auto make = [&](const TransportOptions& o) -> absl::StatusOr<std::unique_ptr<Transport>> {
      if (backend == "ucx") return NewUcxTransport(o);
      if (backend == "socket") return NewSocketTransport(o);
      return NewLoopbackTransport(o);
    };
    // The server's rules cannot name its own port before it listens, so they never use
    // {server}; the client's are written once the server's address is known.
    LBCC_ASSIGN_OR_RETURN(TransportOptions server_options,
                          OptionsWith(backend + "-server-rules", c.server_rules, "",
                                      c.server_link_class));
    LBCC_ASSIGN_OR_RETURN(std::unique_ptr<Transport> server, make(server_options));
    LBCC_ASSIGN_OR_RETURN(*server_out, server->Listen(server_address));
    LBCC_ASSIGN_OR_RETURN(TransportOptions client_options,
                          OptionsWith(backend + "-client-rules", c.client_rules, *server_out,
                                      c.client_link_class));
    LBCC_ASSIGN_OR_RETURN(std::unique_ptr<Transport> client, make(client_options));
    LBCC_ASSIGN_OR_RETURN(*client_out, client->Listen(client_address));
    ConnectOptions connect;
    if (c.connect_class.has_value()) {
      connect.has_link_class = true;
      connect.link_class = *c.connect_class;
    }
    LBCC_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> a,
                          client->Connect(*server_out, kWait, connect));
    LBCC_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> b, server->Accept(kWait));
    return Ends{a->link_class(), b->link_class(), a->counters().stripes, b->counters().stripes};
  }
};

TEST_P(SameRulesTest, BothBackendsClassifyAlikeFromBothEnds) {
  const Case& c = GetParam();
  std::string ucx_server, ucx_client;
  absl::StatusOr<Ends> ucx = Classify("ucx", "127.0.0.1:0", "127.0.0.1:0", &ucx_server,
                                      &ucx_client);
  if (ucx.status().code() == absl::StatusCode::kUnavailable && ucx_server.empty()) {
    GTEST_SKIP() << "UCX cannot start here: " << ucx.status();
  }
  ASSERT_THAT(ucx, IsOk());
  // Loopback names spelt like the UCX addresses, so that the same rules apply to them.
  std::string loop_server, loop_client;
  LBCC_ASSERT_OK_AND_ASSIGN(
      Ends loop, Classify("loopback", ucx_server, ucx_client, &loop_server, &loop_client));
  std::string socket_server, socket_client;
  LBCC_ASSERT_OK_AND_ASSIGN(Ends sockets, Classify("socket", "127.0.0.1:0", "127.0.0.1:0",
                                                   &socket_server, &socket_client));
  const int stripes = c.expected == LinkClass::kSlow ? 2 : 1;
  for (const auto& [backend, ends] : {std::pair<const char*, Ends>{"ucx", *ucx},
                                      {"loopback", loop}, {"socket", sockets}}) {
    SCOPED_TRACE(backend);
    EXPECT_EQ(ends.client_class, c.expected);
    EXPECT_EQ(ends.server_class, c.expected);
    EXPECT_EQ(ends.client_stripes, stripes);
    EXPECT_EQ(ends.server_stripes, stripes);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, SameRulesTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace lbcc::transport
