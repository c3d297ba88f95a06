#include "plugin/device.h"

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::plugin {
namespace {

using ::lbcc::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using transport::LinkClass;

const std::vector<Interface> kInterfaces = {
    {"lo", "127.0.0.1", true},
    {"eth1", "10.1.0.2", false},
    {"docker0", "172.17.0.1", false},
    {"eth0", "10.0.0.2", false},
    {"eth0", "fd77::2", false, /*ipv6=*/true},
    {"ib0", "fd88::5", false, /*ipv6=*/true},
};

TEST(DeviceTest, ParsesNamesAddressesAndClasses) {
  LBCC_ASSERT_OK_AND_ASSIGN(std::vector<DeviceConfig> devices,
                            ParseDevices(" eth0 , 10.1.0.2=slow,127.0.0.1=FAST, 192.168.9.9",
                                         kInterfaces));
  ASSERT_EQ(devices.size(), 4u);
  EXPECT_EQ(devices[0].name, "eth0");
  EXPECT_EQ(devices[0].ip, "10.0.0.2");
  EXPECT_EQ(devices[0].ifname, "eth0");
  EXPECT_FALSE(devices[0].link_class.has_value());
  EXPECT_EQ(devices[1].name, "eth1");  // The address names its interface.
  EXPECT_EQ(devices[1].ifname, "eth1");
  EXPECT_EQ(devices[1].link_class, LinkClass::kSlow);
  EXPECT_EQ(devices[2].ifname, "lo");
  EXPECT_EQ(devices[2].link_class, LinkClass::kFast);
  // An address no interface has is kept (the transport reports it if it cannot listen there).
  EXPECT_EQ(devices[3].name, "192.168.9.9");
  EXPECT_EQ(devices[3].ifname, "");
}

TEST(DeviceTest, ParsesIpv6AddressesAndHostNames) {
  LBCC_ASSERT_OK_AND_ASSIGN(
      std::vector<DeviceConfig> devices,
      ParseDevices("fd77::2=slow, [fd88:0::5], fd99::9, localhost=fast", kInterfaces));
  ASSERT_EQ(devices.size(), 4u);
  EXPECT_EQ(devices[0].name, "eth0");  // eth0's IPv6 address.
  EXPECT_EQ(devices[0].ip, "fd77::2");
  EXPECT_TRUE(devices[0].ipv6);
  EXPECT_EQ(devices[0].link_class, LinkClass::kSlow);
  EXPECT_EQ(devices[1].name, "ib0");  // Brackets and the long form: canonical.
  EXPECT_EQ(devices[1].ip, "fd88::5");
  EXPECT_EQ(devices[2].name, "fd99::9");  // No interface has it: kept, named by the address.
  EXPECT_EQ(devices[2].ifname, "");
  EXPECT_TRUE(devices[2].ipv6);
  EXPECT_FALSE(devices[2].link_class.has_value());
  // localhost resolves (/etc/hosts) to 127.0.0.1, lo's address, IPv4 first.
  EXPECT_EQ(devices[3].ip, "127.0.0.1");
  EXPECT_EQ(devices[3].ifname, "lo");
  EXPECT_EQ(devices[3].link_class, LinkClass::kFast);
  EXPECT_THAT(ParseDevices("ib0,fd88::5", kInterfaces),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fd88::5 twice")));
}

TEST(DeviceTest, RejectsBadEntries) {
  EXPECT_THAT(ParseDevices("eth9", kInterfaces),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("eth9")));
  EXPECT_THAT(ParseDevices("eth0,no-such-host.invalid=slow", kInterfaces),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'no-such-host.invalid=slow'"),
                             HasSubstr("does not resolve"),
                             HasSubstr("(lo, eth1, docker0, eth0, ib0)"))));
  EXPECT_THAT(ParseDevices("eth0=medium", kInterfaces),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("eth0=medium")));
  EXPECT_THAT(ParseDevices("eth0=slow=fast", kInterfaces),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseDevices("eth0,10.0.0.2", kInterfaces),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));
  EXPECT_THAT(ParseDevices(" , ", kInterfaces), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseDevices("=slow", kInterfaces), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(DeviceTest, DefaultsSkipLoopbackAndDockerUnlessNothingElse) {
  std::vector<DeviceConfig> devices = DefaultDevices(kInterfaces);
  ASSERT_EQ(devices.size(), 3u);  // One per interface.
  EXPECT_EQ(devices[0].name, "eth0");
  EXPECT_EQ(devices[0].ip, "10.0.0.2") << "IPv4 first";
  EXPECT_EQ(devices[1].name, "eth1");
  EXPECT_EQ(devices[2].name, "ib0");  // IPv6 only.
  EXPECT_EQ(devices[2].ip, "fd88::5");
  EXPECT_TRUE(devices[2].ipv6);

  devices = DefaultDevices({{"lo", "127.0.0.1", true}, {"docker0", "172.17.0.1", false}});
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].ip, "127.0.0.1");

  devices = DefaultDevices({});
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].ip, "127.0.0.1");
}

TEST(DeviceTest, LoopbackHasNoSpeedNorPciPathAndBadNamesAreSafe) {
  EXPECT_EQ(InterfaceSpeedMbits("lo"), 0);
  EXPECT_EQ(InterfacePciPath("lo"), "");
  EXPECT_EQ(InterfaceSpeedMbits("../../etc"), 0);
  EXPECT_EQ(InterfacePciPath(""), "");
}

TEST(DeviceTest, ListsLoopback) {
  bool found = false;
  for (const Interface& interface : ListInterfaces()) {
    if (interface.loopback && interface.ip == "127.0.0.1") found = true;
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace lbcc::plugin
