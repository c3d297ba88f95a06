// Elastic membership with members as processes over UCX (127.0.0.1) and the master in this
// process: churn (a random member killed -9 at a random moment, restarted, rejoining), a
// SIGSTOP'd member evicted and told so when it resumes, two members killed at once. Every
// committed step must be bit-identical on every member that committed it, and every surviving
// member's error feedback must equal a replay of exactly the steps it committed (nothing lost,
// nothing applied twice).
//
// The test binary is also the member program (ELASTIC_ROLE=member): it steps until its stdin
// closes, printing "COMMIT <step> <epoch> <out hash> <params hash>" per committed step, then
// "EF OK" or "EF MISMATCH", and "TIMES <join ms> <first commit ms>".
// ELASTIC_CHURN_EVENTS (default 6) sets the number of churn events; ELASTIC_CHURN_STATS=FILE
// writes the measured times (bench/elastic.sh reads them).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "codecs/topk_ef.h"
#include "comm/elastic/elastic.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

constexpr int64_t kElements = 1 << 16;
constexpr int kPeerTimeoutMs = 5000;
// Each member's inner steps between two exchanges (the work a trainer does there).
constexpr absl::Duration kInnerSteps = absl::Milliseconds(20);

std::vector<float> Delta(int seed, uint64_t step) {
  std::mt19937 rng(static_cast<uint32_t>(seed * 7919 + step));
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> v(kElements);
  for (float& x : v) x = normal(rng);
  return v;
}

uint64_t Hash(const std::vector<float>& v) { return XXH3_64bits(v.data(), v.size() * 4); }

// A member program runs until the driver closes its stdin: then *stop is set (from a detached
// thread; `stop` must outlive the process's use of it, as a member's main-scope flag does).
void StopWhenStdinCloses(std::atomic<bool>* stop) {
  std::thread([stop] {
    char c;
    while (read(0, &c, 1) > 0) {
    }
    *stop = true;
  }).detach();
}

double Median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Bench mode: the same exchange alternately over the epoch's plain communicator and through
// the elastic group (same processes, same layout), then the highest seed leaves cleanly and the
// others time their next step. Prints a BENCH line (below).
int RunBench(ElasticGroup& group, const codecs::Codec& codec, codecs::TopKEfState& state,
             int seed, int steps) {
  codecs::TopKEfState plain_state;
  std::vector<float> out(kElements);
  std::vector<double> plain, elastic;
  // The pseudo-gradient is made before the clock starts, as for the plain step (a step that
  // is retried or moved makes its own).
  std::vector<float> next_delta;
  uint64_t next_step = ~0ull;
  auto prepare = [&] {
    next_step = group.step();
    next_delta = Delta(seed, next_step);
  };
  auto elastic_step = [&] {
    absl::Status s;
    do {
      s = group.Boundary();
      if (s.ok()) {
        if (group.step() != next_step) prepare();
        s = group.SparseAllReduce({{*TensorView::Host(next_delta.data(), {kElements}),
                                    *TensorView::Host(out.data(), {kElements}), &state}},
                                  &codec);
      }
    } while (IsRetryable(s));
    return s;
  };
  prepare();
  if (!elastic_step().ok()) return 1;  // the first boundary and step: every member is set up
  const ElasticStats before = group.stats();
  for (int i = 0; i < steps; ++i) {
    std::shared_ptr<Communicator> comm = group.communicator();
    if (comm == nullptr) return 1;
    std::vector<float> delta = Delta(seed, 100000 + i);
    prepare();
    absl::Time t0 = absl::Now();
    absl::Status s = comm->SparseAllReduce({{*TensorView::Host(delta.data(), {kElements}),
                                             *TensorView::Host(out.data(), {kElements}),
                                             &plain_state}},
                                           &codec)
                         ->Wait();
    plain.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    t0 = absl::Now();
    absl::Status e = elastic_step();
    elastic.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    if (!s.ok() || !e.ok()) {
      std::printf("ERROR bench %s %s\n", s.ToString().c_str(), e.ToString().c_str());
      return 1;
    }
  }
  const int last_seed = std::atoi(std::getenv("ELASTIC_BENCH_LEAVER"));
  double after_leave = -1, adopt = -1;
  if (seed == last_seed) {
    // Right after its own last step, as a trainer that stops: the others may still be inside
    // that step's exchange.
    (void)group.Leave();
  } else {
    // The leave announced (as during a trainer's inner steps), then the next step, Boundary()
    // (adopting the new epoch: its communicator derived from this one's connections) and
    // SparseAllReduce over the survivors, timed from the moment this member sees the
    // announcement.
    if (!group.AwaitEpoch(before.committed_epoch + 1, absl::Seconds(60))) return 1;
    prepare();
    const absl::Time t0 = absl::Now();
    absl::Status s = group.Boundary();
    adopt = absl::ToDoubleMilliseconds(absl::Now() - t0);
    if (s.ok()) {
      if (group.step() != next_step) prepare();
      s = group.SparseAllReduce({{*TensorView::Host(next_delta.data(), {kElements}),
                                  *TensorView::Host(out.data(), {kElements}), &state}},
                                &codec);
    }
    if (IsRetryable(s)) s = elastic_step();  // counted below: the step is timed whole
    if (!s.ok()) return 1;
    after_leave = absl::ToDoubleMilliseconds(absl::Now() - t0);
  }
  const ElasticStats after = group.stats();
  // BENCH <plain ms> <elastic ms> <step after the leave ms> <its Boundary ms> <retries>
  //       <epochs made anew> <epochs derived>   (the last three since the first step: the loop
  //       above runs in one epoch, so they are the leave's, whenever this member adopted it)
  std::printf("BENCH %.3f %.3f %.3f %.3f %llu %llu %llu\n", Median(plain), Median(elastic),
              after_leave, adopt,
              static_cast<unsigned long long>(after.aborted_calls - before.aborted_calls),
              static_cast<unsigned long long>(after.fresh_epochs - before.fresh_epochs),
              static_cast<unsigned long long>(after.derived_epochs - before.derived_epochs));
  std::fflush(stdout);
  if (seed != last_seed) (void)group.Leave();
  return 0;
}

// Testbed bench mode (ELASTIC_ROLE=bench, bench/elastic.sh): the comm_testbed_perf layout, one
// member per emulated host. ELASTIC_BENCH_ELEMENTS floats, top_k 64 (lbcc_perf's sparse
// defaults); ELASTIC_BENCH_ROUNDS rounds of ELASTIC_BENCH_STEPS plain steps (the epoch's
// Communicator::SparseAllReduce) and as many elastic steps (Boundary() + SparseAllReduce),
// the two blocks' order alternating by round; ELASTIC_BENCH_INNER_MS of "inner steps" (a sleep,
// untimed) before every step. Prints "STEP <plain|elastic> <round> <ms> <cpu ms>" per step (cpu:
// this process's threads),
// "WAIT <ms> <waits>" (the elastic steps' waits for the master's decision) and "LOAD" lines.
// CPU time of this process (every thread), ms.
double CpuMs() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

int RunTestbedBench() {
  auto env_int = [](const char* name, int64_t fallback) {
    const char* v = std::getenv(name);
    int64_t n = fallback;
    if (v != nullptr && !absl::SimpleAtoi(v, &n)) n = fallback;
    return n;
  };
  const int seed = static_cast<int>(env_int("ELASTIC_SEED", 0));
  const int64_t elements = env_int("ELASTIC_BENCH_ELEMENTS", 1 << 22);
  const int rounds = static_cast<int>(env_int("ELASTIC_BENCH_ROUNDS", 6));
  const int steps = static_cast<int>(env_int("ELASTIC_BENCH_STEPS", 5));
  const absl::Duration inner = absl::Milliseconds(env_int("ELASTIC_BENCH_INNER_MS", 0));
  auto codec = *codecs::TopKEfCodec::Create(codecs::TopKEfOptions());
  std::vector<float> params(elements, 0.f), out(elements);
  codecs::TopKEfState state, plain_state;
  ElasticOptions o;
  o.master_address = std::getenv("ELASTIC_MASTER");
  o.job_id = "bench";
  o.name = std::getenv("ELASTIC_NAME");
  o.comm_config.backend = "ucx";
  o.op_timeout = absl::Seconds(120);
  absl::StatusOr<std::unique_ptr<ElasticGroup>> joined =
      ElasticGroup::Join(o, {*TensorView::Host(params.data(), {elements})});
  if (!joined.ok()) {
    std::printf("ERROR join %s\n", joined.status().ToString().c_str());
    return 1;
  }
  ElasticGroup& group = **joined;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> delta(elements);
  auto fresh_delta = [&] {
    for (float& x : delta) x = normal(rng);
  };
  int retries = 0;
  auto elastic_step = [&] {
    absl::Status s;
    do {
      s = group.Boundary();
      if (s.ok()) {
        s = group.SparseAllReduce({{*TensorView::Host(delta.data(), {elements}),
                                    *TensorView::Host(out.data(), {elements}), &state}},
                                  codec.get());
      }
      retries += IsRetryable(s);
    } while (IsRetryable(s));
    return s;
  };
  auto plain_step = [&] {
    std::shared_ptr<Communicator> comm = group.communicator();
    if (comm == nullptr) return absl::FailedPreconditionError("no communicator");
    return comm
        ->SparseAllReduce({{*TensorView::Host(delta.data(), {elements}),
                            *TensorView::Host(out.data(), {elements}), &plain_state}},
                          codec.get())
        ->Wait();
  };
  // Warm-up: the first boundary moves the state; both paths once more.
  for (int i = 0; i < 2; ++i) {
    fresh_delta();
    if (absl::Status s = elastic_step(); !s.ok()) {
      std::printf("ERROR warm-up %s\n", s.ToString().c_str());
      return 1;
    }
    fresh_delta();
    if (absl::Status s = plain_step(); !s.ok()) {
      std::printf("ERROR warm-up %s\n", s.ToString().c_str());
      return 1;
    }
  }
  const ElasticStats before = group.stats();
  for (int r = 0; r < rounds; ++r) {
    if (seed == 0) {
      std::ifstream load("/proc/loadavg");
      std::string l1;
      load >> l1;
      std::printf("LOAD %d %s\n", r, l1.c_str());
    }
    for (int half = 0; half < 2; ++half) {
      const bool elastic = (half == 0) == (r % 2 == 1);
      for (int i = 0; i < steps; ++i) {
        fresh_delta();
        absl::SleepFor(inner);
        const double cpu0 = CpuMs();
        const absl::Time t0 = absl::Now();
        const absl::Status s = elastic ? elastic_step() : plain_step();
        const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
        const double cpu = CpuMs() - cpu0;
        if (!s.ok()) {
          std::printf("ERROR %s step %s\n", elastic ? "elastic" : "plain", s.ToString().c_str());
          return 1;
        }
        std::printf("STEP %s %d %.3f %.3f\n", elastic ? "elastic" : "plain", r, ms, cpu);
      }
    }
  }
  const ElasticStats after = group.stats();
  std::printf("WAIT %.3f %llu\nRETRIES %d\n",
              absl::ToDoubleMilliseconds(after.decision_wait - before.decision_wait),
              static_cast<unsigned long long>(after.decision_waits - before.decision_waits),
              retries);
  std::fflush(stdout);
  (void)group.Leave();
  return 0;
}

// Pipeline-replica mode (ELASTIC_ROLE=unit): a member of the shard jobs in ELASTIC_SHARDS
// (comma-separated indices into ELASTIC_MASTERS), each outer step exchanging shard 0 first,
// then shard 1 (as a trainer steps its model's shards). ELASTIC_REPLICA / ELASTIC_STAGE /
// ELASTIC_STAGES make it a pipeline stage. Prints "ADMITTED <shard> <step>" when admitted,
// "COMMIT <shard> <step> <out hash>" per committed exchange and "REPLICA_LEFT <shard> <message>"
// when its pipeline replica left (it then joins again, as a trainer would once its other
// stages are back), "REJOIN <shard> <message>" when it left the group for want of a decision.
// Runs until stdin closes; exits 3 when it was evicted itself (as the member program does), 1 on
// another error.
int RunUnitMember() {
  const int seed = std::atoi(std::getenv("ELASTIC_SEED"));
  std::atomic<bool> stop{false};
  StopWhenStdinCloses(&stop);
  const std::vector<std::string> masters = absl::StrSplit(std::getenv("ELASTIC_MASTERS"), ',');
  std::vector<int> shards;
  for (absl::string_view v : absl::StrSplit(std::getenv("ELASTIC_SHARDS"), ',')) {
    int s = 0;
    if (!absl::SimpleAtoi(v, &s)) return 2;
    shards.push_back(s);
  }
  auto codec = *codecs::TopKEfCodec::Create(codecs::TopKEfOptions());
  struct Shard {
    int index = 0;
    std::vector<float> params = std::vector<float>(kElements, 0.f);
    std::vector<float> out = std::vector<float>(kElements);
    std::unique_ptr<codecs::TopKEfState> state;
    std::unique_ptr<ElasticGroup> group;
  };
  std::vector<Shard> held(shards.size());
  int code = 1;  // the exit code of a failed join
  auto join = [&](Shard& sh) {
    ElasticOptions o;
    o.master_address = masters[sh.index];
    o.job_id = absl::StrCat("shard", sh.index);
    o.name = absl::StrCat(std::getenv("ELASTIC_NAME"), "/shard", sh.index);
    o.comm_config.backend = "ucx";
    o.op_timeout = absl::Seconds(60);
    if (const char* r = std::getenv("ELASTIC_REPLICA"); r != nullptr) {
      o.replica = r;
      o.stage = std::atoi(std::getenv("ELASTIC_STAGE"));
      o.replica_stages = std::atoi(std::getenv("ELASTIC_STAGES"));
    }
    // Short tries, so that a member told to stop while it waits for its other stages ends.
    o.join_timeout = absl::Seconds(20);
    sh.state = std::make_unique<codecs::TopKEfState>();  // a newcomer's starts at zero
    absl::StatusOr<std::unique_ptr<ElasticGroup>> g;
    do {
      g = ElasticGroup::Join(o, {*TensorView::Host(sh.params.data(), {kElements})});
    } while (absl::IsDeadlineExceeded(g.status()) && !stop);
    if (!g.ok()) {
      std::printf("ERROR join %s\n", g.status().ToString().c_str());
      std::fflush(stdout);
      code = stop ? 0 : absl::IsFailedPrecondition(g.status()) ? 3 : 1;
      return false;
    }
    sh.group = std::move(*g);
    std::printf("ADMITTED %d %llu\n", sh.index,
                static_cast<unsigned long long>(sh.group->step()));
    std::fflush(stdout);
    return true;
  };
  for (size_t i = 0; i < shards.size(); ++i) {
    held[i].index = shards[i];
    if (!join(held[i])) return code;
  }
  while (!stop) {
    absl::SleepFor(kInnerSteps);
    for (Shard& sh : held) {
      absl::Status s;
      uint64_t step = 0;
      do {
        s = sh.group->Boundary();
        if (s.ok()) {
          step = sh.group->step();
          std::vector<float> delta = Delta(seed * 10 + sh.index, step);
          s = sh.group->SparseAllReduce({{*TensorView::Host(delta.data(), {kElements}),
                                          *TensorView::Host(sh.out.data(), {kElements}),
                                          sh.state.get()}},
                                        codec.get());
        }
      } while (IsRetryable(s) && !stop);
      if (s.ok()) {
        for (int64_t i = 0; i < kElements; ++i) sh.params[i] += sh.out[i];
        std::printf("COMMIT %d %llu %016llx\n", sh.index, static_cast<unsigned long long>(step),
                    static_cast<unsigned long long>(Hash(sh.out)));
        std::fflush(stdout);
      } else if (IsReplicaLeft(s) || absl::IsDeadlineExceeded(s)) {
        // Its replica left, or it left the group itself (no decision within the timeouts: it
        // was held in its other shard's call): it joins again, as the status says.
        std::printf("%s %d %s\n", IsReplicaLeft(s) ? "REPLICA_LEFT" : "REJOIN", sh.index,
                    s.ToString().c_str());
        std::fflush(stdout);
        (void)sh.group->Leave();
        if (stop) break;
        if (!join(sh)) return stop ? 0 : code;
      } else if (!stop) {
        std::printf("ERROR %d %s\n", sh.index, s.ToString().c_str());
        std::fflush(stdout);
        return absl::IsFailedPrecondition(s) ? 3 : 1;  // 3: evicted
      }
    }
  }
  for (Shard& sh : held) (void)sh.group->Leave();
  return 0;
}

// Master mode (ELASTIC_ROLE=master, elastic_cut_test.sh, bench/elastic_soak.py): an
// ElasticMaster per address in ELASTIC_LISTEN (comma-separated; bootstrap roots on its host,
// ELASTIC_MIN_MEMBERS to form), for job "churn", or for the jobs in ELASTIC_JOBS (as many, in
// order; several share one ElasticUnits, as a model's shard jobs do), until stdin closes.
int RunMasterRole() {
  const std::vector<std::string> listen = absl::StrSplit(std::getenv("ELASTIC_LISTEN"), ',');
  const char* jobs_env = std::getenv("ELASTIC_JOBS");
  const std::vector<std::string> jobs =
      absl::StrSplit(jobs_env != nullptr ? jobs_env : "churn", ',');
  if (jobs.size() != listen.size()) {
    std::printf("ERROR master: %zu jobs for %zu addresses\n", jobs.size(), listen.size());
    return 2;
  }
  std::shared_ptr<ElasticUnits> units = jobs.size() > 1 ? NewElasticUnits() : nullptr;
  std::vector<std::unique_ptr<ElasticMaster>> masters;
  for (size_t i = 0; i < jobs.size(); ++i) {
    ElasticMasterOptions mo;
    mo.job_id = jobs[i];
    mo.listen_address = listen[i];
    mo.min_members = std::atoi(std::getenv("ELASTIC_MIN_MEMBERS"));
    mo.units = units;
    absl::StatusOr<std::unique_ptr<ElasticMaster>> master = ElasticMaster::Start(mo);
    if (!master.ok()) {
      std::printf("ERROR master %s\n", master.status().ToString().c_str());
      return 1;
    }
    std::printf("MASTER %s\n", (*master)->address().c_str());
    std::fflush(stdout);
    masters.push_back(std::move(*master));
  }
  char c;
  while (read(0, &c, 1) > 0) {
  }
  for (auto& m : masters) m->Stop();
  return 0;
}

// --- The member program. ---
int RunMember() {
  const int seed = std::atoi(std::getenv("ELASTIC_SEED"));
  std::atomic<bool> stop{false};
  StopWhenStdinCloses(&stop);
  auto codec = *codecs::TopKEfCodec::Create(codecs::TopKEfOptions());
  std::vector<float> params(kElements, 0.f);
  codecs::TopKEfState state;
  ElasticOptions o;
  o.master_address = std::getenv("ELASTIC_MASTER");
  o.job_id = "churn";
  o.name = std::getenv("ELASTIC_NAME");
  const char* backend = std::getenv("ELASTIC_BACKEND");  // bench/elastic_soak.py --transport
  o.comm_config.backend = backend != nullptr ? backend : "ucx";
  o.op_timeout = absl::Seconds(60);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<ElasticGroup>> group =
      ElasticGroup::Join(o, {*TensorView::Host(params.data(), {kElements})});
  if (!group.ok()) {
    std::printf("ERROR join %s\n", group.status().ToString().c_str());
    return absl::IsFailedPrecondition(group.status()) ? 3 : 1;
  }
  const double join_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  if (const char* bench = std::getenv("ELASTIC_BENCH_STEPS")) {
    return RunBench(**group, *codec, state, seed, std::atoi(bench));
  }
  double first_ms = -1;
  std::vector<uint64_t> committed;
  std::vector<float> out(kElements);
  int code = 0;
  while (!stop) {
    absl::SleepFor(kInnerSteps);
    absl::Status s = (*group)->Boundary();
    if (IsRetryable(s)) continue;
    if (s.ok()) {
      const uint64_t step = (*group)->step();
      std::vector<float> delta = Delta(seed, step);
      s = (*group)->SparseAllReduce({{*TensorView::Host(delta.data(), {kElements}),
                                      *TensorView::Host(out.data(), {kElements}), &state}},
                                    codec.get());
      if (IsRetryable(s)) continue;
      if (s.ok()) {
        for (int64_t i = 0; i < kElements; ++i) params[i] += out[i];
        committed.push_back(step);
        if (first_ms < 0) first_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
        std::printf("COMMIT %llu %llu %016llx %016llx\n", static_cast<unsigned long long>(step),
                    static_cast<unsigned long long>((*group)->stats().committed_epoch),
                    static_cast<unsigned long long>(Hash(out)),
                    static_cast<unsigned long long>(Hash(params)));
        std::fflush(stdout);
        continue;
      }
    }
    std::printf("ERROR %d %s\n", static_cast<int>(s.code()), s.ToString().c_str());
    code = absl::IsFailedPrecondition(s) ? 3 : 1;  // 3: evicted
    break;
  }
  // Replay exactly the committed steps on a fresh state: must give the same error feedback.
  codecs::TopKEfState replay;
  std::vector<uint8_t> buf(*codec->MaxEncodedBytes({kElements}));
  for (uint64_t step : committed) {
    std::vector<float> delta = Delta(seed, step);
    (void)codec->Encode(*TensorView::Host(delta.data(), {kElements}), &replay,
                        absl::MakeSpan(buf));
    (void)replay.Commit();
  }
  const bool same = committed.empty() ||
                    (!state.has_pending() && std::equal(state.error().begin(), state.error().end(),
                                                        replay.error().begin(),
                                                        replay.error().end()));
  std::printf("EF %s\nTIMES %.1f %.1f\n", same ? "OK" : "MISMATCH", join_ms, first_ms);
  std::fflush(stdout);
  (void)(*group)->Leave();
  return code;
}

// --- The test side. ---
struct Child {
  pid_t pid = -1;
  int in_fd = -1;   // closing it stops the member
  int out_fd = -1;
  std::string name;
  Mutex mu;
  std::string output;  // written by `drain` (under mu) until the child's stdout closes
  std::thread drain;
  std::atomic<bool> committed{false};  // it printed a COMMIT line (it is a member)
  int exit_code = -1;
};
using ChildPtr = std::shared_ptr<Child>;

ChildPtr Spawn(const std::string& master, int seed, const std::string& name,
               const std::vector<std::pair<std::string, std::string>>& env = {}) {
  int in[2], out[2];
  // Close-on-exec: no child may hold another's stdin open (its end would never come).
  EXPECT_EQ(pipe2(in, O_CLOEXEC), 0);
  EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[1]);
    close(out[0]);
    setenv("ELASTIC_ROLE", "member", 1);
    setenv("ELASTIC_MASTER", master.c_str(), 1);
    setenv("ELASTIC_SEED", absl::StrCat(seed).c_str(), 1);
    setenv("ELASTIC_NAME", name.c_str(), 1);
    setenv("LBCC_PEER_TIMEOUT_MS", absl::StrCat(kPeerTimeoutMs).c_str(), 1);
    setenv("UCX_MEM_EVENTS", "no", 1);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    execl("/proc/self/exe", "elastic_churn_test", nullptr);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  auto c = std::make_shared<Child>();
  c->pid = pid;
  c->in_fd = in[1];
  c->out_fd = out[0];
  c->name = name;
  c->drain = std::thread([c = c.get()] {
    char buf[4096];
    ssize_t n;
    while ((n = read(c->out_fd, buf, sizeof(buf))) > 0) {
      MutexLock lock(&c->mu);
      c->output.append(buf, n);
      if (!c->committed && c->output.find("COMMIT") != std::string::npos) c->committed = true;
    }
    close(c->out_fd);
  });
  return c;
}

// Waits until the child printed `text`; true if it did within `timeout`.
bool AwaitOutput(Child* c, absl::string_view text, absl::Duration timeout) {
  MutexLock lock(&c->mu);
  return c->mu.AwaitWithTimeout(
      [&] { return c->output.find(std::string(text)) != std::string::npos; }, timeout);
}

std::string OutputOf(Child* c) {
  MutexLock lock(&c->mu);
  return c->output;
}

// Collects a child's output and exit code (after it was killed or told to stop).
void Reap(Child* c, bool stop = true) {
  if (stop && c->in_fd >= 0) close(c->in_fd);
  if (stop) c->in_fd = -1;
  c->drain.join();
  int status = 0;
  waitpid(c->pid, &status, 0);
  c->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (c->in_fd >= 0) close(c->in_fd);
  c->in_fd = -1;
}

int Events() {
  const char* e = std::getenv("ELASTIC_CHURN_EVENTS");
  int n = 6;
  if (e != nullptr && !absl::SimpleAtoi(e, &n)) n = 6;
  return n;
}

// The master, in this process; members inherit LBCC_PEER_TIMEOUT_MS (Spawn sets it too).
absl::StatusOr<std::unique_ptr<ElasticMaster>> StartMaster(int members) {
  setenv("LBCC_PEER_TIMEOUT_MS", absl::StrCat(kPeerTimeoutMs).c_str(), 1);
  ElasticMasterOptions mo;
  mo.job_id = "churn";
  mo.min_members = members;
  mo.peer_timeout = absl::Milliseconds(kPeerTimeoutMs);
  return ElasticMaster::Start(mo);
}

TEST(ElasticChurnTest, MembersKilledStoppedAndRestartedNeverBreakTheJob) {
  constexpr int kMembers = 4;
  absl::StatusOr<std::unique_ptr<ElasticMaster>> master = StartMaster(kMembers);
  ASSERT_THAT(master.status(), lbcc::testing::IsOk());
  const std::string address = (*master)->address();

  std::vector<ChildPtr> live, done;
  // On a failed assertion: no child outlives the test, no drain thread is left running.
  struct Cleanup {
    std::vector<ChildPtr>* live;
    ~Cleanup() {
      for (ChildPtr& c : *live) {
        if (c->drain.joinable()) {
          kill(c->pid, SIGKILL);
          Reap(c.get());
        }
      }
    }
  } cleanup{&live};
  int incarnation = 0;
  for (int i = 0; i < kMembers; ++i) {
    live.push_back(Spawn(address, i, absl::StrCat("w", i, ".", incarnation++)));
  }
  std::vector<int> seeds = {0, 1, 2, 3};
  ASSERT_TRUE((*master)->AwaitCommittedSteps(2, absl::Seconds(60))) << "the job never started";

  std::mt19937 rng(12345);
  std::vector<double> recover_ms;
  const int events = Events();
  int stopped_events = 0, double_events = 0;
  // Waits until every live member committed a step (the restarted ones rejoined).
  auto all_members = [&] {
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    while (absl::Now() < deadline) {
      bool all = true;
      for (const ChildPtr& c : live) all &= c->committed.load();
      if (all) return true;
      (*master)->AwaitCommittedSteps((*master)->committed_steps() + 1, absl::Seconds(1));
    }
    return false;
  };
  for (int e = 0; e < events; ++e) {
    ASSERT_TRUE(all_members()) << "event " << e << ": a restarted member did not rejoin";
    // A random moment: somewhere within the next steps (placement, not synchronisation).
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(0, 300)(rng)));
    const int kind = e % 6 == 2 ? 1 : e % 6 == 4 ? 2 : 0;  // 0 kill, 1 SIGSTOP, 2 two killed
    std::vector<int> victims = {std::uniform_int_distribution<int>(0, kMembers - 1)(rng)};
    if (kind == 2) victims.push_back((victims[0] + 1) % kMembers);
    const uint64_t epoch = (*master)->epoch();
    const absl::Time t0 = absl::Now();
    for (int v : victims) kill(live[v]->pid, kind == 1 ? SIGSTOP : SIGKILL);
    // The master drops the victims (a new epoch), and the survivors commit a step without them
    // (exchanged in a newer epoch: a step of the old one decided meanwhile does not count).
    ASSERT_TRUE((*master)->AwaitEpoch(epoch + 1, absl::Seconds(120))) << "event " << e;
    ASSERT_TRUE((*master)->AwaitCommitInEpoch(epoch + 1, absl::Seconds(120)))
        << "event " << e << ": no step committed after the event";
    recover_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    for (int v : victims) {
      ChildPtr c = live[v];
      if (kind == 1) {
        ++stopped_events;
        kill(c->pid, SIGCONT);  // it was evicted by now: it must say so and exit
        Reap(c.get(), /*stop=*/false);  // it must exit by itself
        EXPECT_EQ(c->exit_code, 3) << c->name << " after SIGSTOP/SIGCONT:\n" << c->output;
        EXPECT_NE(c->output.find("evicted"), std::string::npos) << c->output;
      } else {
        Reap(c.get());
      }
      done.push_back(c);
      live[v] = Spawn(address, seeds[v], absl::StrCat("w", v, ".", incarnation++));
    }
    double_events += kind == 2;
  }
  // Everyone (the restarted ones too) takes part in a few more steps, then stops.
  ASSERT_TRUE(all_members()) << "a restarted member did not rejoin after the last event";
  const uint64_t now = (*master)->committed_steps();
  EXPECT_TRUE((*master)->AwaitCommittedSteps(now + 3, absl::Seconds(60)));
  for (ChildPtr& c : live) {
    close(c->in_fd);
    c->in_fd = -1;
  }
  for (ChildPtr& c : live) {
    Reap(c.get());
    EXPECT_EQ(c->exit_code, 0) << c->name << ":\n" << c->output;
    EXPECT_NE(c->output.find("EF OK"), std::string::npos) << c->name << ":\n" << c->output;
    done.push_back(c);
  }

  // Every committed step: one epoch, one aggregate, one parameter vector on every member. By
  // design (elastic.h) one step may differ: the last step of a member that was killed or
  // evicted, which it committed at once from every member's data while the others never got its
  // vote (it died or stopped first); the master, without its report, rolls the step back and the
  // survivors run it again in the next epoch. Such a last step is checked against nobody.
  std::map<uint64_t, std::string> seen;  // step -> "epoch out params"
  std::map<uint64_t, int> count;
  struct Unconfirmed {
    const Child* member;
    uint64_t step;
    std::string value;  // "epoch out params"
  };
  std::vector<Unconfirmed> unconfirmed;
  std::vector<double> join_ms, first_ms;
  for (const ChildPtr& c : done) {
    EXPECT_EQ(c->output.find("EF MISMATCH"), std::string::npos) << c->name << ":\n" << c->output;
    std::istringstream lines(c->output);
    std::string line;
    std::vector<std::pair<uint64_t, std::string>> commits;
    while (std::getline(lines, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      if (f[0] == "COMMIT" && f.size() == 5) {
        uint64_t step = 0;
        ASSERT_TRUE(absl::SimpleAtoi(f[1], &step));
        commits.emplace_back(step, absl::StrCat(f[2], " ", f[3], " ", f[4]));
      } else if (f[0] == "TIMES" && f.size() == 3) {
        double j = 0, fst = 0;
        if (absl::SimpleAtod(f[1], &j) && absl::SimpleAtod(f[2], &fst) && fst >= 0) {
          join_ms.push_back(j);
          first_ms.push_back(fst);
        }
      }
    }
    if (c->exit_code != 0 && !commits.empty()) {
      unconfirmed.push_back({c.get(), commits.back().first, commits.back().second});
      commits.pop_back();
    }
    for (const auto& [step, v] : commits) {
      auto [it, fresh] = seen.emplace(step, v);
      EXPECT_EQ(it->second, v) << "step " << step << " differs on " << c->name;
      ++count[step];
    }
  }
  for (const Unconfirmed& u : unconfirmed) {
    auto it = seen.find(u.step);
    if (it != seen.end() && it->second != u.value) {
      std::printf("step %llu, the last one %s (exit %d) committed (epoch, out, params: %s), was "
                  "rolled back and run again by the others (%s)\n",
                  static_cast<unsigned long long>(u.step), u.member->name.c_str(),
                  u.member->exit_code, u.value.c_str(), it->second.c_str());
    }
  }
  EXPECT_GE(seen.size(), static_cast<size_t>(events + 2));
  if (const char* stats = std::getenv("ELASTIC_CHURN_STATS")) {
    std::ofstream f(stats);
    f << "events " << events << " stopped " << stopped_events << " double " << double_events
      << "\nsteps " << (*master)->committed_steps() << " epochs " << (*master)->epoch()
      << "\nrecover_ms " << absl::StrJoin(recover_ms, " ") << "\njoin_ms "
      << absl::StrJoin(join_ms, " ") << "\nfirst_commit_ms " << absl::StrJoin(first_ms, " ")
      << "\n";
  }
  (*master)->Stop();
}

// The pipeline replica as a unit: two shard jobs (masters sharing ElasticUnits), two full
// replicas in both, a two-stage pipeline replica with stage 0 in shard 0's job and stage 1 in
// shard 1's. Stage 1 is killed: stage 0 is told (IsReplicaLeft, naming the stage) and leaves
// shard 0's group, the full replicas go on in both, stage 0 is not admitted while stage 1 is
// missing; stage 1 restarts and both stages are admitted at the same outer step.
TEST(ElasticChurnTest, APipelineReplicaLeavesAndRejoinsAsAUnit) {
  setenv("LBCC_PEER_TIMEOUT_MS", absl::StrCat(kPeerTimeoutMs).c_str(), 1);
  std::shared_ptr<ElasticUnits> units = NewElasticUnits();
  std::vector<std::unique_ptr<ElasticMaster>> masters;
  for (int shard = 0; shard < 2; ++shard) {
    ElasticMasterOptions mo;
    mo.job_id = absl::StrCat("shard", shard);
    mo.min_members = 3;
    mo.peer_timeout = absl::Milliseconds(kPeerTimeoutMs);
    mo.units = units;
    absl::StatusOr<std::unique_ptr<ElasticMaster>> m = ElasticMaster::Start(mo);
    ASSERT_THAT(m.status(), lbcc::testing::IsOk());
    masters.push_back(std::move(*m));
  }
  const std::string addresses = absl::StrCat(masters[0]->address(), ",", masters[1]->address());
  auto spawn = [&](int seed, const std::string& name, const std::string& shards, int stage) {
    std::vector<std::pair<std::string, std::string>> env = {
        {"ELASTIC_ROLE", "unit"}, {"ELASTIC_MASTERS", addresses}, {"ELASTIC_SHARDS", shards}};
    if (stage >= 0) {
      env.insert(env.end(), {{"ELASTIC_REPLICA", "pipe"},
                             {"ELASTIC_STAGE", absl::StrCat(stage)},
                             {"ELASTIC_STAGES", "2"}});
    }
    return Spawn("", seed, name, env);
  };
  std::vector<ChildPtr> live = {spawn(0, "full0", "0,1", -1), spawn(1, "full1", "0,1", -1),
                                spawn(2, "stage0", "0", 0), spawn(3, "stage1", "1", 1)};
  std::vector<ChildPtr> done;
  struct Cleanup {
    std::vector<ChildPtr>* live;
    ~Cleanup() {
      for (ChildPtr& c : *live) {
        if (c->drain.joinable()) {
          kill(c->pid, SIGKILL);
          Reap(c.get());
        }
      }
    }
  } cleanup{&live};
  for (auto& m : masters) {
    ASSERT_TRUE(m->AwaitCommittedSteps(3, absl::Seconds(120))) << "the job never started";
  }
  EXPECT_EQ(masters[0]->members(), 3);
  EXPECT_EQ(masters[1]->members(), 3);

  kill(live[3]->pid, SIGKILL);
  Reap(live[3].get());
  done.push_back(live[3]);
  // Stage 0 is told, with a status naming its replica and the stage that left.
  ASSERT_TRUE(AwaitOutput(live[2].get(), "REPLICA_LEFT", absl::Seconds(60))) << OutputOf(live[2].get());
  EXPECT_NE(OutputOf(live[2].get())
                .find("pipeline replica 'pipe' left the data-parallel group: its stage 1 (stage1/shard1)"),
            std::string::npos)
      << OutputOf(live[2].get());
  // Both shards go on with the full replicas only; stage 0 waits for its other stage.
  for (auto& m : masters) {
    const uint64_t now = m->committed_steps();
    ASSERT_TRUE(m->AwaitCommittedSteps(now + 3, absl::Seconds(120)));
  }
  EXPECT_EQ(masters[0]->members(), 2);
  EXPECT_EQ(masters[1]->members(), 2);
  EXPECT_EQ(masters[0]->AwaitWaiting(1, absl::ZeroDuration()), false)
      << "stage 0 must not be a newcomer of shard 0 while stage 1 is missing";

  live[3] = spawn(3, "stage1b", "1", 1);
  ASSERT_TRUE(AwaitOutput(live[3].get(), "ADMITTED", absl::Seconds(120))) << OutputOf(live[3].get());
  for (auto& m : masters) {
    const uint64_t now = m->committed_steps();
    ASSERT_TRUE(m->AwaitCommittedSteps(now + 2, absl::Seconds(120)));
  }
  EXPECT_EQ(masters[0]->members(), 3);
  EXPECT_EQ(masters[1]->members(), 3);
  for (ChildPtr& c : live) {
    close(c->in_fd);
    c->in_fd = -1;
  }
  for (ChildPtr& c : live) {
    Reap(c.get());
    EXPECT_EQ(c->exit_code, 0) << c->name << ":\n" << c->output;
    done.push_back(c);
  }
  // Both stages were admitted (again) at the same outer step; every committed exchange of a
  // shard is one aggregate on every member that committed it.
  auto admitted = [](const std::string& output, int shard) {
    std::vector<uint64_t> steps;
    std::istringstream lines(output);
    std::string line;
    while (std::getline(lines, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      uint64_t step = 0;
      if (f[0] == "ADMITTED" && f.size() == 3 && f[1] == absl::StrCat(shard) &&
          absl::SimpleAtoi(f[2], &step)) {
        steps.push_back(step);
      }
    }
    return steps;
  };
  const std::vector<uint64_t> stage0 = admitted(live[2]->output, 0);
  const std::vector<uint64_t> stage1 = admitted(live[3]->output, 1);
  ASSERT_EQ(stage0.size(), 2u) << live[2]->output;
  ASSERT_EQ(stage1.size(), 1u) << live[3]->output;
  EXPECT_EQ(stage0[1], stage1[0]) << "the stages rejoined at different outer steps";
  EXPECT_GT(stage0[1], 3u);
  std::map<std::pair<std::string, std::string>, std::string> seen;  // (shard, step) -> hash
  for (const ChildPtr& c : done) {
    std::istringstream lines(c->output);
    std::string line;
    while (std::getline(lines, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      if (f[0] == "COMMIT" && f.size() == 4) {
        auto [it, fresh] = seen.emplace(std::make_pair(f[1], f[2]), f[3]);
        EXPECT_EQ(it->second, f[3]) << "shard " << f[1] << " step " << f[2] << " differs on "
                                    << c->name;
      }
    }
  }
  for (auto& m : masters) m->Stop();
}

TEST(ElasticChurnTest, SteadyStateAgainstThePlainCommunicator) {
  const char* steps = std::getenv("ELASTIC_BENCH_STEPS");
  if (steps == nullptr) GTEST_SKIP() << "a measurement: set ELASTIC_BENCH_STEPS (bench/elastic.sh)";
  constexpr int kMembers = 4;
  setenv("ELASTIC_BENCH_LEAVER", absl::StrCat(kMembers - 1).c_str(), 1);
  absl::StatusOr<std::unique_ptr<ElasticMaster>> master = StartMaster(kMembers);
  ASSERT_THAT(master.status(), lbcc::testing::IsOk());
  std::vector<ChildPtr> live;
  for (int i = 0; i < kMembers; ++i) {
    live.push_back(Spawn((*master)->address(), i, absl::StrCat("b", i)));
  }
  std::vector<std::string> lines;
  for (ChildPtr& c : live) {
    Reap(c.get(), /*stop=*/false);
    EXPECT_EQ(c->exit_code, 0) << c->output;
    std::istringstream in(c->output);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("BENCH ", 0) == 0) lines.push_back(line.substr(6));
    }
  }
  if (const char* stats = std::getenv("ELASTIC_CHURN_STATS")) {
    std::ofstream f(stats, std::ios::app);
    for (const std::string& l : lines) f << "bench " << l << "\n";
  }
  (*master)->Stop();
}

}  // namespace
}  // namespace lbcc::comm

int main(int argc, char** argv) {
  if (const char* role = std::getenv("ELASTIC_ROLE"); role != nullptr) {
    if (std::string(role) == "bench") return lbcc::comm::RunTestbedBench();
    if (std::string(role) == "unit") return lbcc::comm::RunUnitMember();
    if (std::string(role) == "master") return lbcc::comm::RunMasterRole();
    return lbcc::comm::RunMember();
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
