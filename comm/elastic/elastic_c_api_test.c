/* The elastic C API (lbccElastic*, comm/lbcc.h) from C, with members as processes over UCX on
 * 127.0.0.1 and the master in this process: three members step together; one is killed -9
 * while the other two are inside the exchange of step kVictimStep; the survivors' call returns
 * lbccMembershipChanged, their retry over the new epoch succeeds, and every committed step is
 * bit-identical on every member that committed it (the victim's steps before it too). Also the
 * argument checks and a wrong job id. Exit status 0 on success; the failures are printed. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/lbcc.h"

enum { kMembers = 3, kSteps = 7, kVictimStep = 3, kVictim = 2, kElements = 8192 };
static const char* kJob = "capi";

static int failures = 0;
#define EXPECT(cond, ...)                                   \
  do {                                                      \
    if (!(cond)) {                                          \
      fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                         \
      fprintf(stderr, "\n");                                \
      ++failures;                                           \
    }                                                       \
  } while (0)

static uint64_t Fnv(const void* data, size_t n) {
  const unsigned char* p = (const unsigned char*)data;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* A member's pseudo-gradient of a step: a function of (seed, step) only, so a retry feeds the
 * same input. */
static void Delta(int seed, uint64_t step, float* out) {
  uint64_t x = 88172645463325252ull ^ ((uint64_t)seed * 7919u + step * 104729u);
  for (int i = 0; i < kElements; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = (float)((int64_t)(x % 20001) - 10000) / 1000.0f;
  }
}

/* The member program: steps until kSteps are committed; the victim parks after kVictimStep
 * steps (it is killed there). Lines on stdout: ENTER, RETRY, COMMIT <step> <epoch> <out hash>
 * <params hash> <epoch now>, RETRIES <n>, ERROR. */
static int Member(int seed, const char* address) {
  setenv("UCX_MEM_EVENTS", "no", 1);
  static float params[kElements], delta[kElements], out[kElements];
  lbccConfig_t comm = LBCC_CONFIG_INITIALIZER;
  comm.transport = "ucx";
  comm.listenAddr = "127.0.0.1";
  lbccElasticConfig_t config = LBCC_ELASTIC_CONFIG_INITIALIZER;
  config.masterAddr = address;
  config.jobId = kJob;
  config.opTimeoutSeconds = 60;
  config.comm = &comm;
  char name[32];
  snprintf(name, sizeof(name), "c%d", seed);
  config.name = name;
  void* state[1] = {params};
  size_t state_bytes[1] = {sizeof(params)};
  lbccElastic_t group = NULL;
  lbccResult_t rc = lbccElasticJoin(&group, &config, 1, state, state_bytes);
  if (rc != lbccSuccess) {
    printf("ERROR join %s: %s\n", lbccGetErrorString(rc), lbccGetLastError(NULL));
    return 1;
  }
  lbccTopKState_t ef;
  if (lbccTopKStateCreate(&ef) != lbccSuccess) return 1;
  lbccTopKConfig_t topk = LBCC_TOPK_CONFIG_INITIALIZER;
  const int64_t dims[1] = {kElements};
  const int64_t* dims_list[1] = {dims};
  const int ranks[1] = {1};
  const float* deltas[1] = {delta};
  float* outs[1] = {out};
  int retries = 0;
  for (;;) {
    uint64_t step = 0, epoch = 0;
    lbccElasticQuery(group, NULL, NULL, NULL, &step);
    if (step >= kSteps) break;
    if (seed == kVictim && step == kVictimStep) {
      printf("PARKED\n");
      fflush(stdout);
      for (;;) pause();  /* killed here */
    }
    do rc = lbccElasticBoundary(group);
    while (rc == lbccMembershipChanged);
    if (rc != lbccSuccess) break;
    lbccElasticQuery(group, NULL, NULL, NULL, &step);
    Delta(seed, step, delta);
    if (step == kVictimStep) {
      printf("ENTER %llu\n", (unsigned long long)step);
      fflush(stdout);
    }
    for (;;) {
      rc = lbccElasticSparseAllReduce(1, deltas, outs, ranks, dims_list, &ef, &topk,
                                      lbccAggSparseLoCo, group);
      if (rc != lbccMembershipChanged) break;
      ++retries;
      printf("RETRY %s\n", lbccGetLastError(NULL));
      fflush(stdout);
    }
    if (rc != lbccSuccess) break;
    for (int i = 0; i < kElements; ++i) params[i] += out[i];
    lbccElasticQuery(group, &epoch, NULL, NULL, NULL);
    printf("COMMIT %llu %016llx %016llx %llu\n", (unsigned long long)step,
           (unsigned long long)Fnv(out, sizeof(out)),
           (unsigned long long)Fnv(params, sizeof(params)), (unsigned long long)epoch);
    fflush(stdout);
  }
  if (rc != lbccSuccess) {
    printf("ERROR %s: %s\n", lbccGetErrorString(rc), lbccGetLastError(NULL));
  }
  printf("RETRIES %d\n", retries);
  fflush(stdout);
  lbccElasticLeave(group);
  lbccElasticDestroy(group);
  lbccTopKStateDestroy(ef);
  return rc == lbccSuccess ? 0 : 1;
}

/* Reads `fd` into `buf` (NUL-terminated) until a line starts with `prefix` or the end;
 * returns 1 when found. Keeps what was read. */
static int ReadUntil(int fd, char* buf, size_t cap, size_t* len, const char* prefix) {
  for (;;) {
    for (const char* line = buf; line != NULL && *line; line = strchr(line, '\n')) {
      if (*line == '\n') ++line;
      if (strncmp(line, prefix, strlen(prefix)) == 0 && strchr(line, '\n') != NULL) return 1;
    }
    if (*len + 1 >= cap) return 0;
    const ssize_t n = read(fd, buf + *len, cap - 1 - *len);
    if (n <= 0) return 0;
    *len += (size_t)n;
    buf[*len] = '\0';
  }
}

/* The hashes after "COMMIT <step> " for `step` ("<out> <params>"; *epoch: the epoch after
 * it), or NULL. */
static const char* CommitOf(const char* output, int step, char* line, size_t cap, int* epoch) {
  char prefix[32];
  snprintf(prefix, sizeof(prefix), "COMMIT %d ", step);
  for (const char* at = output; (at = strstr(at, prefix)) != NULL; ++at) {
    if (at != output && at[-1] != '\n') continue;
    const char* end = strchr(at, '\n');
    size_t n = end ? (size_t)(end - at) : strlen(at);
    if (n >= cap) n = cap - 1;
    memcpy(line, at, n);
    line[n] = '\0';
    char* last = strrchr(line, ' ');
    if (last == NULL || last < line + strlen(prefix)) return NULL;
    *last = '\0';
    if (epoch != NULL) *epoch = atoi(last + 1);
    return line + strlen(prefix);
  }
  return NULL;
}

static void ArgumentChecks(const char* address) {
  EXPECT(strstr(lbccGetErrorString(lbccMembershipChanged), "retry") != NULL, "%s",
         lbccGetErrorString(lbccMembershipChanged));
  EXPECT(lbccElasticJoin(NULL, NULL, 0, NULL, NULL) == lbccInvalidArgument, "NULL group");
  EXPECT(lbccElasticBoundary(NULL) == lbccInvalidArgument, "NULL group");
  EXPECT(lbccElasticSparseAllReduce(0, NULL, NULL, NULL, NULL, NULL, NULL, lbccAggSparseLoCo,
                                    NULL) == lbccInvalidArgument,
         "NULL group");
  EXPECT(lbccElasticMasterCreate(NULL, NULL, kJob, 1, 0) == lbccInvalidArgument, "NULL master");
  lbccElastic_t group = NULL;
  lbccElasticConfig_t config = LBCC_ELASTIC_CONFIG_INITIALIZER;
  config.masterAddr = address;
  EXPECT(lbccElasticJoin(&group, &config, 0, NULL, NULL) == lbccInvalidArgument, "no job id");
  EXPECT(strstr(lbccGetLastError(NULL), "jobId is NULL") != NULL, "%s", lbccGetLastError(NULL));
  config.jobId = kJob;
  config.size = 3;
  EXPECT(lbccElasticJoin(&group, &config, 0, NULL, NULL) == lbccInvalidArgument, "bad size");
  EXPECT(strstr(lbccGetLastError(NULL), "LBCC_ELASTIC_CONFIG_INITIALIZER") != NULL, "%s",
         lbccGetLastError(NULL));
  config.size = sizeof(config);
  config.opTimeoutSeconds = -1;
  EXPECT(lbccElasticJoin(&group, &config, 0, NULL, NULL) == lbccInvalidArgument, "bad timeout");
  EXPECT(strstr(lbccGetLastError(NULL), "opTimeoutSeconds") != NULL, "%s", lbccGetLastError(NULL));
  config.opTimeoutSeconds = LBCC_CONFIG_UNDEF_DOUBLE;
  config.jobId = "another-job";
  const lbccResult_t rc = lbccElasticJoin(&group, &config, 0, NULL, NULL);
  EXPECT(rc == lbccInvalidArgument, "wrong job id: %s", lbccGetErrorString(rc));
  EXPECT(strstr(lbccGetLastError(NULL), "another-job") != NULL &&
             strstr(lbccGetLastError(NULL), kJob) != NULL,
         "%s", lbccGetLastError(NULL));
}

int main(void) {
  int addr_pipe[kMembers][2], out_pipe[kMembers][2];
  pid_t pids[kMembers];
  /* The members are forked before this process starts any thread (the master's). */
  for (int i = 0; i < kMembers; ++i) {
    if (pipe(addr_pipe[i]) != 0 || pipe(out_pipe[i]) != 0) return 2;
    pids[i] = fork();
    if (pids[i] < 0) return 2;
    if (pids[i] == 0) {
      for (int j = 0; j < i; ++j) {
        close(addr_pipe[j][1]);
        close(out_pipe[j][0]);
      }
      close(addr_pipe[i][1]);
      close(out_pipe[i][0]);
      dup2(out_pipe[i][1], 1);
      char address[128] = {0};
      ssize_t n = read(addr_pipe[i][0], address, sizeof(address) - 1);
      if (n <= 0) _exit(2);
      _exit(Member(i, address));
    }
    close(addr_pipe[i][0]);
    close(out_pipe[i][1]);
  }
  lbccElasticMaster_t master = NULL;
  lbccResult_t rc = lbccElasticMasterCreate(&master, "127.0.0.1:0", kJob, kMembers, 5.0);
  if (rc != lbccSuccess) {
    fprintf(stderr, "master: %s\n", lbccGetLastError(NULL));
    for (int i = 0; i < kMembers; ++i) kill(pids[i], SIGKILL);
    return 1;
  }
  const char* address = lbccElasticMasterAddress(master);
  for (int i = 0; i < kMembers; ++i) {
    if (write(addr_pipe[i][1], address, strlen(address)) < 0) return 2;
    close(addr_pipe[i][1]);
  }
  ArgumentChecks(address);

  static char output[kMembers][1 << 16];
  size_t len[kMembers] = {0};
  /* The survivors are inside step kVictimStep's exchange (which waits for the victim): kill. */
  int entered = 1;
  for (int i = 0; i < kMembers; ++i) {
    if (i == kVictim) continue;
    entered &= ReadUntil(out_pipe[i][0], output[i], sizeof(output[i]), &len[i], "ENTER");
  }
  EXPECT(ReadUntil(out_pipe[kVictim][0], output[kVictim], sizeof(output[kVictim]),
                   &len[kVictim], "PARKED"),
         "the victim did not park:\n%s", output[kVictim]);
  EXPECT(entered, "a survivor did not reach step %d:\n%s\n%s", kVictimStep, output[0], output[1]);
  kill(pids[kVictim], SIGKILL);
  int exit_code[kMembers];
  for (int i = 0; i < kMembers; ++i) {
    ReadUntil(out_pipe[i][0], output[i], sizeof(output[i]), &len[i], "\x01never");
    int status = 0;
    waitpid(pids[i], &status, 0);
    exit_code[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    close(out_pipe[i][0]);
  }
  EXPECT(exit_code[kVictim] == 128 + SIGKILL, "victim exit %d", exit_code[kVictim]);
  int retries = 0;
  for (int i = 0; i < kMembers; ++i) {
    if (i == kVictim) continue;
    EXPECT(exit_code[i] == 0, "member %d exit %d:\n%s", i, exit_code[i], output[i]);
    int n = 0;
    const char* r = strstr(output[i], "RETRIES ");
    if (r != NULL) n = atoi(r + 8);
    retries += n;
    if (n > 0) {
      EXPECT(strstr(output[i], "RETRY membership changed") != NULL ||
                 strstr(output[i], "RETRY ABORTED: membership changed") != NULL,
             "member %d:\n%s", i, output[i]);
    }
  }
  /* Killed inside the step: at least one survivor's call failed as retryable (both, unless
   * one's epoch moved on before it posted). */
  EXPECT(retries >= 1, "no survivor saw lbccMembershipChanged:\n%s\n%s", output[0], output[1]);
  char a[256], b[256];
  for (int step = 0; step < kSteps; ++step) {
    int epoch_after = 0;
    const char* first = CommitOf(output[0], step, a, sizeof(a), &epoch_after);
    const char* second = CommitOf(output[1], step, b, sizeof(b), NULL);
    EXPECT(first != NULL && second != NULL, "step %d missing", step);
    if (first == NULL || second == NULL) continue;
    EXPECT(strcmp(first, second) == 0, "step %d differs: %s / %s", step, first, second);
    char c[256];
    const char* victim = CommitOf(output[kVictim], step, c, sizeof(c), NULL);
    if (step < kVictimStep) {
      EXPECT(victim != NULL && strcmp(victim, first) == 0, "step %d on the victim: %s / %s", step,
             victim ? victim : "(none)", first);
    } else {
      EXPECT(victim == NULL, "the victim committed step %d", step);
      /* Committed over the survivors' epoch, a newer one than the first. */
      EXPECT(epoch_after > 1, "step %d, then epoch %d", step, epoch_after);
    }
  }
  uint64_t epoch = 0, steps = 0;
  int members = -1;
  EXPECT(lbccElasticMasterQuery(master, &epoch, &members, &steps) == lbccSuccess, "query");
  EXPECT(steps == kSteps && epoch >= 2, "master at epoch %llu, %llu steps",
         (unsigned long long)epoch, (unsigned long long)steps);
  EXPECT(lbccElasticMasterDestroy(master) == lbccSuccess, "destroy");
  if (failures) {
    for (int i = 0; i < kMembers; ++i) fprintf(stderr, "--- member %d:\n%s", i, output[i]);
  }
  printf("%s (%d retried calls)\n", failures ? "FAIL" : "PASS", retries);
  return failures ? 1 : 0;
}
