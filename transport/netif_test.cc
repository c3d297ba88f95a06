#include "transport/netif.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/options.h"

namespace lbcc::transport {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::IsOkAndHolds;
using ::lbcc::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A machine with loopback, two Ethernet ports, docker's bridge and an IPv6-only port.
std::vector<NetInterface> Machine() {
  return {{"lo", "127.0.0.1", false, true},     {"eth0", "10.77.0.2", false, false},
          {"eth1", "192.168.5.2", false, false}, {"docker0", "172.17.0.1", false, false},
          {"ib0", "fd00::2", true, false}};
}

TEST(InterfaceFilterTest, NcclSyntax) {
  LBCC_ASSERT_OK_AND_ASSIGN(InterfaceFilter prefixes, InterfaceFilter::Parse("eth,ib"));
  EXPECT_TRUE(prefixes.Matches("eth0"));
  EXPECT_TRUE(prefixes.Matches("ib1"));
  EXPECT_FALSE(prefixes.Matches("docker0"));
  LBCC_ASSERT_OK_AND_ASSIGN(InterfaceFilter exact, InterfaceFilter::Parse("=eth1"));
  EXPECT_TRUE(exact.Matches("eth1"));
  EXPECT_FALSE(exact.Matches("eth10"));
  LBCC_ASSERT_OK_AND_ASSIGN(InterfaceFilter exclude, InterfaceFilter::Parse("^docker,lo"));
  EXPECT_FALSE(exclude.Matches("docker0"));
  EXPECT_FALSE(exclude.Matches("lo"));
  EXPECT_TRUE(exclude.Matches("eth0"));
  LBCC_ASSERT_OK_AND_ASSIGN(InterfaceFilter exclude_exact, InterfaceFilter::Parse("^=eth0"));
  EXPECT_FALSE(exclude_exact.Matches("eth0"));
  EXPECT_TRUE(exclude_exact.Matches("eth01"));
  LBCC_ASSERT_OK_AND_ASSIGN(InterfaceFilter by_default, InterfaceFilter::Parse(""));
  EXPECT_TRUE(by_default.is_default());
  EXPECT_FALSE(by_default.Matches("lo"));
  EXPECT_FALSE(by_default.Matches("docker0"));
  EXPECT_TRUE(by_default.Matches("eth0"));
}

TEST(InterfaceFilterTest, BadSpecsNameTheValue) {
  EXPECT_THAT(InterfaceFilter::Parse("^"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("LBCC_SOCKET_IFNAME='^'")));
  EXPECT_THAT(InterfaceFilter::Parse("eth0,^lo"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'^lo'")));
}

TEST(SelectListenAddressTest, RootOnLoopbackMeansLoopback) {
  EXPECT_THAT(SelectListenAddress("", "", "127.0.0.1", Machine()),
              IsOkAndHolds(::testing::Field(&NetChoice::interface, "lo")));
}

TEST(SelectListenAddressTest, TheRootItselfTakesTheFirstAllowedInterface) {
  LBCC_ASSERT_OK_AND_ASSIGN(NetChoice c, SelectListenAddress("", "", "", Machine()));
  EXPECT_EQ(c.interface, "eth0");
  EXPECT_EQ(c.address, "10.77.0.2");
  LBCC_ASSERT_OK_AND_ASSIGN(c, SelectListenAddress("", "=eth1", "", Machine()));
  EXPECT_EQ(c.address, "192.168.5.2");
  LBCC_ASSERT_OK_AND_ASSIGN(c, SelectListenAddress("", "ib", "", Machine()));
  EXPECT_EQ(c.address, "fd00::2");
  EXPECT_TRUE(c.ipv6);
}

TEST(SelectListenAddressTest, OnlyLoopbackIsUpMeansLoopback) {
  const std::vector<NetInterface> lonely = {{"lo", "127.0.0.1", false, true}};
  EXPECT_THAT(SelectListenAddress("", "", "", lonely),
              IsOkAndHolds(::testing::Field(&NetChoice::loopback, true)));
}

TEST(SelectListenAddressTest, AFilterMatchingNothingNamesItAndTheInterfaces) {
  EXPECT_THAT(SelectListenAddress("", "wlan", "", Machine()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("LBCC_SOCKET_IFNAME='wlan'"),
                                        HasSubstr("eth0 10.77.0.2"))));
}

TEST(SelectListenAddressTest, ListenAddrOverridesByAddressOrInterface) {
  LBCC_ASSERT_OK_AND_ASSIGN(NetChoice c, SelectListenAddress("eth1", "", "", Machine()));
  EXPECT_EQ(c.address, "192.168.5.2");
  LBCC_ASSERT_OK_AND_ASSIGN(c, SelectListenAddress("10.77.0.2", "", "", Machine()));
  EXPECT_EQ(c.interface, "eth0");
  LBCC_ASSERT_OK_AND_ASSIGN(c, SelectListenAddress("::1", "", "", Machine()));
  EXPECT_TRUE(c.ipv6);
  EXPECT_TRUE(c.loopback);
  EXPECT_THAT(SelectListenAddress("wlan7", "", "", Machine()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("LBCC_LISTEN_ADDR='wlan7'")));
}

TEST(SelectListenAddressTest, UnresolvableRootIsNamed) {
  EXPECT_THAT(SelectListenAddress("", "", "no-such-host.invalid", Machine()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'no-such-host.invalid'")));
}

TEST(SelectListenAddressTest, RealInterfacesRouteToLoopback) {
  // This machine: a root on 127.0.0.1 is reached over lo, whatever else is up.
  EXPECT_THAT(SelectListenAddress("", "127.0.0.1"),
              IsOkAndHolds(::testing::Field(&NetChoice::address, "127.0.0.1")));
}

TEST(HostPortTest, SplitsNamesIpv4AndBracketedIpv6) {
  LBCC_ASSERT_OK_AND_ASSIGN(HostAndPort a, ParseHostPort("node01:29500", "x"));
  EXPECT_EQ(a.host, "node01");
  EXPECT_EQ(a.port, 29500);
  LBCC_ASSERT_OK_AND_ASSIGN(HostAndPort b, ParseHostPort("[fd00::1]:80", "x"));
  EXPECT_EQ(b.host, "fd00::1");
  EXPECT_EQ(b.port, 80);
  EXPECT_EQ(JoinHostPort("fd00::1", 80), "[fd00::1]:80");
  EXPECT_EQ(JoinHostPort("10.0.0.1", 80), "10.0.0.1:80");
  EXPECT_THAT(ParseHostPort("fd00::1:80", "LBCC_BOOTSTRAP_ADDR"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("LBCC_BOOTSTRAP_ADDR 'fd00::1:80'")));
  EXPECT_THAT(ParseHostPort("node:99999", "x"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseHostPort("node", "x"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseHostPort("[::1:80", "x"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ResolveHostTest, NamesAndLiterals) {
  EXPECT_THAT(ResolveHost("localhost", "x"),
              IsOkAndHolds(::testing::Contains("127.0.0.1")));
  EXPECT_THAT(ResolveHost("::1", "x"), IsOkAndHolds(ElementsAre("::1")));
  EXPECT_THAT(ResolveHost("no-such-host.invalid", "MASTER_ADDR"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("MASTER_ADDR: host 'no-such-host.invalid' does not resolve")));
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.5"));
  EXPECT_TRUE(IsLoopbackAddress("::1"));
  EXPECT_FALSE(IsLoopbackAddress("10.77.0.1"));
}

TEST(PinUcxDeviceTest, PinsTheChosenDeviceUnlessTheUserSetOne) {
  const char* user = std::getenv("UCX_NET_DEVICES");
  if (user != nullptr) GTEST_SKIP() << "UCX_NET_DEVICES is set here: " << user;
  TransportOptions options;
  PinUcxDevice("eth0", &options);
  EXPECT_EQ(options.ucx_net_devices, "eth0");
  PinUcxDevice("eth1", &options);  // Set already: kept.
  EXPECT_EQ(options.ucx_net_devices, "eth0");
  TransportOptions none;
  PinUcxDevice("", &none);  // Loopback or an address of no interface: UCX's own choice.
  EXPECT_EQ(none.ucx_net_devices, "");
}

}  // namespace
}  // namespace lbcc::transport
