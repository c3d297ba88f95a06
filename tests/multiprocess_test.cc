// Ranks as processes over UCX on 127.0.0.1: SparseAllReduce gives bit-identical results in
// every process, equal to a decode of every rank's payload done here; launches by unique id and
// by a torchrun-style environment; a killed rank fails the others instead of hanging.
//
// The test binary is also the rank program: with MP_TEST_ROLE set it runs one rank and prints
// "RESULT <hash>" (XXH3 of its output) on stdout.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/topk_ef.h"
#include "comm/communicator.h"
#include "comm/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc {
namespace {

constexpr int kRanks = 4;
const Shape kShape = {256, 512};

std::vector<float> DeltaOf(int rank) {
  std::mt19937 rng(rank + 11);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> v(*NumElements(kShape));
  for (float& x : v) x = normal(rng);
  return v;
}

std::unique_ptr<codecs::TopKEfCodec> Codec() {
  return *codecs::TopKEfCodec::Create(codecs::TopKEfOptions());
}

// --- The rank program. ---
absl::Status RunRank(const std::string& role) {
  LBCC_ASSIGN_OR_RETURN(comm::FabricOptions options, comm::FabricOptionsFromEnv());
  options.backend = "ucx";
  options.timeout = absl::Seconds(20);
  std::unique_ptr<comm::Communicator> comm;
  if (role == "id") {
    const std::string bytes = absl::HexStringToBytes(std::getenv("MP_TEST_ID"));
    comm::UniqueId id;
    std::memcpy(&id, bytes.data(), sizeof(id));
    LBCC_ASSIGN_OR_RETURN(comm, comm::Communicator::Init(id, kRanks, std::atoi(std::getenv("MP_TEST_RANK")),
                                                         options));
  } else {
    LBCC_ASSIGN_OR_RETURN(comm, comm::Communicator::InitFromEnvironment(options));
  }
  const int rank = comm->rank();
  // Every rank's Init is over once a barrier completes anywhere: a rank that died before then
  // would fail the others' Init (a set-up that lost a rank), not the operation under test.
  absl::Status status = comm->Barrier()->Wait();
  if (std::getenv("MP_TEST_DIE") != nullptr && rank == kRanks - 1) {
    std::fflush(stdout);
    _exit(3);  // Dies right after joining, without closing anything.
  }
  auto codec = Codec();
  std::vector<float> delta = DeltaOf(rank), out(delta.size());
  codecs::TopKEfState state;
  LBCC_ASSIGN_OR_RETURN(TensorView in, TensorView::Host(delta.data(), kShape));
  LBCC_ASSIGN_OR_RETURN(TensorView outv, TensorView::Host(out.data(), kShape));
  if (status.ok()) status = comm->SparseAllReduce({{in, outv, &state}}, codec.get())->Wait();
  if (!status.ok()) {
    std::printf("ERROR %d %s\n", static_cast<int>(status.code()), status.ToString().c_str());
    std::fflush(stdout);
    return absl::OkStatus();  // Reported through stdout.
  }
  std::printf("RESULT %016llx\n",
              static_cast<unsigned long long>(XXH3_64bits(out.data(), out.size() * 4)));
  std::fflush(stdout);
  return absl::OkStatus();
}

// --- The test side. ---
struct Child {
  pid_t pid;
  int out_fd;
};

Child Spawn(const std::vector<std::pair<std::string, std::string>>& env) {
  int pipe_fds[2];
  EXPECT_EQ(pipe(pipe_fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipe_fds[1], 1);
    close(pipe_fds[0]);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    setenv("UCX_MEM_EVENTS", "no", 1);
    execl("/proc/self/exe", "multiprocess_test", nullptr);
    _exit(127);
  }
  close(pipe_fds[1]);
  return {pid, pipe_fds[0]};
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

std::string ReferenceHash() {
  auto codec = Codec();
  std::vector<std::vector<uint8_t>> payloads(kRanks);
  std::vector<absl::Span<const uint8_t>> spans;
  for (int r = 0; r < kRanks; ++r) {
    std::vector<float> delta = DeltaOf(r);
    codecs::TopKEfState state;
    payloads[r].resize(*codec->MaxEncodedBytes(kShape));
    payloads[r].resize(*codec->Encode(*TensorView::Host(delta.data(), kShape), &state,
                                      absl::MakeSpan(payloads[r])));
    spans.push_back(payloads[r]);
  }
  std::vector<float> out(*NumElements(kShape));
  EXPECT_TRUE(codecs::DecodeAccumulate(spans, {}, *TensorView::Host(out.data(), kShape)).ok());
  char hex[32];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(out.data(), out.size() * 4)));
  return hex;
}

std::vector<std::string> RunChildren(std::vector<std::vector<std::pair<std::string, std::string>>> envs,
                                     std::vector<int>* codes) {
  std::vector<Child> children;
  for (const auto& env : envs) children.push_back(Spawn(env));
  std::vector<std::string> outputs;
  for (const Child& c : children) {
    outputs.push_back(ReadAll(c.out_fd));
    int status = 0;
    waitpid(c.pid, &status, 0);
    codes->push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return outputs;
}

TEST(MultiProcessTest, SparseAllReduceOverUcxByUniqueId) {
  absl::StatusOr<comm::UniqueId> id = comm::CreateUniqueId("127.0.0.1", absl::Seconds(30));
  ASSERT_TRUE(id.ok()) << id.status();
  const std::string hex =
      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(&*id), sizeof(*id)));
  std::vector<std::vector<std::pair<std::string, std::string>>> envs;
  for (int r = 0; r < kRanks; ++r) {
    envs.push_back({{"MP_TEST_ROLE", "id"}, {"MP_TEST_ID", hex}, {"MP_TEST_RANK", absl::StrCat(r)}});
  }
  std::vector<int> codes;
  const std::vector<std::string> outputs = RunChildren(envs, &codes);
  const std::string expected = absl::StrCat("RESULT ", ReferenceHash(), "\n");
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(codes[r], 0) << "rank " << r;
    EXPECT_EQ(outputs[r], expected) << "rank " << r;
  }
}


std::vector<std::vector<std::pair<std::string, std::string>>> TorchrunEnvs(bool die) {
  // LBCC's root listens on MASTER_PORT + 1.
  const int port = comm::testing::FreeLoopbackPort(2);
  std::vector<std::vector<std::pair<std::string, std::string>>> envs;
  for (int r = 0; r < kRanks; ++r) {
    std::vector<std::pair<std::string, std::string>> env = {
        {"MP_TEST_ROLE", "env"},          {"RANK", absl::StrCat(r)},
        {"WORLD_SIZE", absl::StrCat(kRanks)}, {"LOCAL_RANK", absl::StrCat(r)},
        {"MASTER_ADDR", "127.0.0.1"},     {"MASTER_PORT", absl::StrCat(port)}};
    if (die) env.push_back({"MP_TEST_DIE", "1"});
    envs.push_back(env);
  }
  return envs;
}

TEST(MultiProcessTest, TorchrunStyleEnvironment) {
  std::vector<int> codes;
  const std::vector<std::string> outputs = RunChildren(TorchrunEnvs(false), &codes);
  const std::string expected = absl::StrCat("RESULT ", ReferenceHash(), "\n");
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(codes[r], 0) << "rank " << r;
    EXPECT_EQ(outputs[r], expected) << "rank " << r;
  }
}

TEST(MultiProcessTest, AKilledRankFailsTheOthersWithinTheTimeout) {
  std::vector<int> codes;
  const std::vector<std::string> outputs = RunChildren(TorchrunEnvs(true), &codes);
  EXPECT_EQ(codes[kRanks - 1], 3);
  for (int r = 0; r < kRanks - 1; ++r) {
    EXPECT_EQ(codes[r], 0) << "rank " << r;
    // Unavailable (14) when the transport notices the dead peer, DeadlineExceeded (4) at worst.
    EXPECT_THAT(outputs[r], ::testing::MatchesRegex("ERROR (14|4|1) .*\n")) << "rank " << r;
    EXPECT_THAT(outputs[r], ::testing::HasSubstr("rank 3")) << "rank " << r << " blames the dead";
  }
}

}  // namespace
}  // namespace lbcc

int main(int argc, char** argv) {
  if (const char* role = std::getenv("MP_TEST_ROLE")) {
    const absl::Status status = lbcc::RunRank(role);
    if (!status.ok()) {
      std::printf("ERROR %d %s\n", static_cast<int>(status.code()), status.ToString().c_str());
      return 1;
    }
    return 0;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
