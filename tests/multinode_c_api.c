/* The C API across hosts: lbccCommInitFromEnv under whichever launcher started this process
 * (mpirun: the unique id by MPI_Bcast; Slurm; torchrun), one all-reduce checked exactly, one
 * line of JSON on stdout: rank, ranks, init seconds, bytes by link class. */
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "comm/lbcc.h"

#define CHECK(call)                                                                   \
  do {                                                                                \
    lbccResult_t rc_ = (call);                                                        \
    if (rc_ != lbccSuccess) {                                                         \
      fprintf(stderr, "%s: %s (%s)\n", #call, lbccGetErrorString(rc_), lbccGetLastError(NULL)); \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

static double Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
  lbccComm_t comm;
  lbccRequest_t request;
  int rank = 0, nranks = 0;
  enum { kCount = 1 << 16 };
  static float data[kCount];
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const double start = Now();
  CHECK(lbccCommInitFromEnv(&comm, NULL));
  const double init_s = Now() - start;
  CHECK(lbccCommUserRank(comm, &rank));
  CHECK(lbccCommCount(comm, &nranks));
  for (int i = 0; i < kCount; ++i) data[i] = (float)(rank + 1) + (float)(i % 7);
  CHECK(lbccAllReduce(data, data, kCount, lbccFloat32, lbccSum, comm, &request));
  CHECK(lbccWait(request));
  CHECK(lbccRequestFree(request));
  for (int i = 0; i < kCount; ++i) {
    const float expected = (float)(nranks * (nranks + 1) / 2) + (float)(nranks * (i % 7));
    if (data[i] != expected) {
      fprintf(stderr, "rank %d: element %d is %f, expected %f\n", rank, i, data[i], expected);
      return 1;
    }
  }
  uint64_t fast_sent = 0, fast_received = 0, slow_sent = 0, slow_received = 0;
  CHECK(lbccCommLinkBytes(comm, &fast_sent, &fast_received, &slow_sent, &slow_received));
  CHECK(lbccCommDestroy(comm));
  printf("{\"rank\": %d, \"ranks\": %d, \"host\": \"%s\", \"init_s\": %.3f, \"fast_sent\": %llu, "
         "\"slow_sent\": %llu, \"ok\": true}\n",
         rank, nranks, host, init_s, (unsigned long long)fast_sent,
         (unsigned long long)slow_sent);
  return 0;
}
