// The C API's dense block: lbccAllReduce on integers with lbccMax, lbccReduce, lbccReduceScatter
// and lbccAllToAll on 2 ranks as threads over loopback.
#include <cstdint>
#include <thread>
#include <vector>

#include "comm/lbcc.h"
#include "gtest/gtest.h"

namespace {

// `req` is read after the posting call (an argument of it) has set it.
lbccResult_t WaitFree(lbccResult_t rc, lbccRequest_t* req) {
  if (rc == lbccSuccess) rc = lbccWait(*req);
  if (*req != nullptr) lbccRequestFree(*req);
  *req = nullptr;
  return rc;
}

lbccResult_t Body(int r, lbccComm_t comm) {
  lbccRequest_t req = nullptr;
  int32_t value = 10 * (r + 1);
  lbccResult_t rc = WaitFree(lbccAllReduce(&value, &value, 1, lbccInt32, lbccMax, comm, &req), &req);
  if (rc != lbccSuccess) return rc;
  if (value != 20) return lbccInternalError;
  int64_t mine[2] = {r + 1, r + 2}, sum[2] = {0, 0};
  req = nullptr;
  rc = WaitFree(lbccReduce(mine, sum, 2, lbccInt64, lbccProd, 1, comm, &req), &req);
  if (rc != lbccSuccess) return rc;
  if (r == 1 && (sum[0] != 2 || sum[1] != 6)) return lbccInternalError;
  float blocks[4] = {1.0f + r, 2.0f + r, 3.0f + r, 4.0f + r}, out[2] = {};
  req = nullptr;
  rc = WaitFree(lbccReduceScatter(blocks, out, 2, lbccFloat32, lbccMin, comm, &req), &req);
  if (rc != lbccSuccess) return rc;
  if (out[0] != 1.0f + 2 * r || out[1] != 2.0f + 2 * r) return lbccInternalError;
  uint8_t send[4] = {uint8_t(r * 10), uint8_t(r * 10), uint8_t(r * 10 + 1), uint8_t(r * 10 + 1)};
  uint8_t recv[4] = {};
  req = nullptr;
  rc = WaitFree(lbccAllToAll(send, recv, 2, lbccUint8, comm, &req), &req);
  if (rc != lbccSuccess) return rc;
  if (recv[0] != r || recv[2] != 10 + r) return lbccInternalError;
  // Bad input is refused by the posting call.
  req = nullptr;
  if (lbccReduce(mine, sum, 2, lbccInt64, lbccAvg, 0, comm, &req) != lbccInvalidArgument) {
    return lbccInternalError;
  }
  return lbccSuccess;
}

TEST(DenseCApiTest, TwoRanks) {
  lbccUniqueId id;
  ASSERT_EQ(lbccGetUniqueId(&id), lbccSuccess);
  std::vector<lbccResult_t> results(2, lbccInternalError);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      lbccConfig_t config = LBCC_CONFIG_INITIALIZER;
      config.transport = "loopback";
      lbccComm_t comm = nullptr;
      results[r] = lbccCommInitRank(&comm, 2, id, r, &config);
      if (results[r] != lbccSuccess) return;
      results[r] = Body(r, comm);
      if (results[r] != lbccSuccess) ADD_FAILURE() << "rank " << r << ": " << lbccGetLastError(comm);
      lbccCommDestroy(comm);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(results[0], lbccSuccess) << lbccGetErrorString(results[0]);
  EXPECT_EQ(results[1], lbccSuccess) << lbccGetErrorString(results[1]);
}

}  // namespace
