/* A trainer in plain C that links liblbcc through pkg-config: one rank, loopback transport. */
#include <stdio.h>

#include <lbcc.h>

#define CHECK(call)                                                                   \
  do {                                                                                \
    lbccResult_t rc_ = (call);                                                        \
    if (rc_ != lbccSuccess) {                                                         \
      fprintf(stderr, "%s: %s (%s)\n", #call, lbccGetErrorString(rc_), lbccGetLastError(NULL)); \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

int main(void) {
  lbccUniqueId id;
  lbccComm_t comm;
  lbccRequest_t request;
  lbccConfig_t config = LBCC_CONFIG_INITIALIZER;
  float data[3] = {1.0f, 2.0f, 3.0f};
  int version = 0;
  config.transport = "loopback";
  CHECK(lbccGetVersion(&version));
  CHECK(lbccGetUniqueId(&id));
  CHECK(lbccCommInitRank(&comm, 1, id, 0, &config));
  CHECK(lbccAllReduce(data, data, 3, lbccFloat32, lbccSum, comm, &request));
  CHECK(lbccWait(request));
  CHECK(lbccRequestFree(request));
  CHECK(lbccCommDestroy(comm));
  if (data[2] != 3.0f) {
    fprintf(stderr, "wrong result %f\n", data[2]);
    return 1;
  }
  printf("liblbcc %d: ok\n", version);
  return 0;
}
