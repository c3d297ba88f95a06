// The plugin ABI declarations in nccl_net.h: sizes and offsets as NCCL 2.28 lays them out on
// x86-64 (worked out by hand from its headers), and the result codes against the installed
// nccl.h when there is one. nccl.h is read as text: it includes cuda_runtime.h, which a test
// without CUDA cannot compile against.
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "plugin/nccl_net.h"

namespace {

TEST(AbiTest, PropertiesLayout) {
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, guid), 16u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, speed), 32u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, latency), 40u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, netDeviceVersion), 56u);
  EXPECT_EQ(sizeof(ncclNetProperties_v8_t), 64u);

  EXPECT_EQ(offsetof(ncclNetProperties_v9_t, forceFlush), 32u);
  EXPECT_EQ(offsetof(ncclNetProperties_v9_t, speed), 36u);
  EXPECT_EQ(offsetof(ncclNetProperties_v9_t, vProps), 64u);
  EXPECT_EQ(offsetof(ncclNetProperties_v9_t, maxP2pBytes), 88u);
  EXPECT_EQ(offsetof(ncclNetProperties_v9_t, maxCollBytes), 96u);
  EXPECT_EQ(sizeof(ncclNetProperties_v9_t), 104u);

  EXPECT_EQ(sizeof(ncclNetProperties_v10_t), sizeof(ncclNetProperties_v9_t));
  EXPECT_EQ(offsetof(ncclNetProperties_v11_t, maxCollBytes), 96u);
  EXPECT_EQ(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize), 104u);
  EXPECT_EQ(sizeof(ncclNetProperties_v11_t), 112u);

  EXPECT_EQ(sizeof(ncclNetVDeviceProps_v9_t), 20u);
  EXPECT_EQ(sizeof(ncclNetAttr_v11_t), 44u);
  EXPECT_EQ(sizeof(lbccNcclNetDeviceHandle_t), 32u);
}

TEST(AbiTest, FunctionTablesHaveOneSlotPerFunction) {
  const size_t slot = sizeof(void*);
  EXPECT_EQ(sizeof(ncclNet_v8_t), 19 * slot);  // name + 18 functions.
  EXPECT_EQ(sizeof(ncclNet_v9_t), 20 * slot);  // + makeVDevice.
  EXPECT_EQ(sizeof(ncclNet_v10_t), 20 * slot);
  EXPECT_EQ(sizeof(ncclNet_v11_t), 22 * slot);  // + finalize, setNetAttr.
  EXPECT_EQ(offsetof(ncclNet_v8_t, isend), 10 * slot);
  EXPECT_EQ(offsetof(ncclNet_v8_t, irecvConsumed), 18 * slot);
  EXPECT_EQ(offsetof(ncclNet_v9_t, makeVDevice), 19 * slot);
  EXPECT_EQ(offsetof(ncclNet_v11_t, finalize), 20 * slot);
  EXPECT_EQ(offsetof(ncclNet_v11_t, setNetAttr), 21 * slot);
}

TEST(AbiTest, ResultCodesMatchInstalledNcclHeader) {
  EXPECT_EQ(LBCC_NCCL_NET_HANDLE_MAXSIZE, 128);
  EXPECT_EQ(LBCC_NCCL_NET_MAX_REQUESTS, 32);
  const char* cuda = std::getenv("CUDA_PATH");
  const std::string path = std::string(cuda != nullptr ? cuda : "/usr/local/cuda") +
                           "/include/nccl.h";
  std::ifstream in(path);
  if (!in) GTEST_SKIP() << path << " is not installed";
  std::stringstream text;
  text << in.rdbuf();
  const std::string header = text.str();
  std::map<std::string, int> values;
  const std::regex entry(R"((nccl[A-Za-z]+)\s*=\s*(\d+))");
  for (std::sregex_iterator it(header.begin(), header.end(), entry), end; it != end; ++it) {
    values.emplace((*it)[1].str(), std::stoi((*it)[2].str()));
  }
  const std::map<std::string, int> ours = {
      {"ncclSuccess", lbccNcclSuccess},
      {"ncclUnhandledCudaError", lbccNcclUnhandledCudaError},
      {"ncclSystemError", lbccNcclSystemError},
      {"ncclInternalError", lbccNcclInternalError},
      {"ncclInvalidArgument", lbccNcclInvalidArgument},
      {"ncclInvalidUsage", lbccNcclInvalidUsage},
      {"ncclRemoteError", lbccNcclRemoteError},
      {"ncclInProgress", lbccNcclInProgress},
  };
  for (const auto& [name, value] : ours) {
    ASSERT_TRUE(values.count(name)) << name << " not found in " << path;
    EXPECT_EQ(values[name], value) << name;
  }
}

}  // namespace
