// A two-stage toy model's boundary traffic through the C API (lbcc.h) puts the same bytes on the
// wire as the Python path (lbcc.torch.PipelineBoundary), byte for byte.
//
// activations_wire_test.sh runs python/tests/pipeline_payloads.py first, which runs the model
// through Python and writes the payloads it received into $LBCC_PYTHON_PAYLOADS_DIR; this
// binary runs the same model, schedule and basis change through the C API and compares. To see
// the C API's bytes, the other stage of each run is a C++ Communicator of the same job (the
// C API hands out no payloads): run "forward" has stage 0 in C and captures at stage 1, run
// "backward" has stage 1 in C and captures at stage 0.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "codecs/subspace_basis.h"
#include "codecs/subspace_codec.h"
#include "comm/activations.h"
#include "comm/communicator.h"
#include "comm/lbcc.h"
#include "gtest/gtest.h"

namespace lbcc {
namespace {

using comm::SubspaceBasisPtr;
using ::lbcc::testing::IsOk;

// Keep in step with python/tests/pipeline_payloads.py.
constexpr int64_t kD = 32, kK = 8, kV = 40, kTokens = 24;
constexpr uint64_t kSeed = 11;
constexpr uint32_t kTag = 4;
constexpr int kMicrobatches = 3, kChangeBefore = 2;
const char* const kSchedule[] = {"F0", "F1", "B0", "change", "F2", "B1", "B2"};

using Payloads = std::map<int, std::vector<uint8_t>>;  // by microbatch

std::vector<int32_t> Ids(int mb) {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < kTokens; ++t) ids.push_back(static_cast<int32_t>((t * 7 + mb * 3) % kV));
  return ids;
}

float Pattern(int mb, int64_t t, int64_t j, int a, int b, int modulo, float scale, float offset) {
  return static_cast<float>((t * a + j * b + mb) % modulo) / scale - offset;
}

// Stage 0: h = T[y] + r.
std::vector<float> Stage0Output(const codecs::SubspaceBasis& basis, int mb) {
  const std::vector<int32_t> ids = Ids(mb);
  std::vector<float> h(kTokens * kD);
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t j = 0; j < kD; ++j) {
      h[t * kD + j] = basis.table()[ids[t] * kD + j] + Pattern(mb, t, j, 5, 3, 11, 8.0f, 0.5f);
    }
  }
  return h;
}

// Stage 1: the gradient of 0.5 ||h - target||^2.
std::vector<float> Gradient(const std::vector<float>& h, int mb) {
  std::vector<float> g(h.size());
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t j = 0; j < kD; ++j) {
      g[t * kD + j] = h[t * kD + j] - Pattern(2 * mb, t, j, 3, 1, 13, 16.0f, 0.25f);
    }
  }
  return g;
}

int Microbatch(const char* step) { return step[1] - '0'; }

// Both bases, as C handles and as C++ objects (for the token table the model reads).
struct Bases {
  SubspaceBasisPtr v0, v1;
  lbccBasis_t c0 = nullptr, c1 = nullptr;
  ~Bases() {
    if (c0) lbccBasisDestroy(c0);
    if (c1) lbccBasisDestroy(c1);
  }
};

std::string Error(const char* what, lbccResult_t rc) {
  return absl::StrCat(what, ": ", lbccGetErrorString(rc), " (", lbccGetLastError(nullptr), ")");
}

// Waits for and frees `*request` (which the posting call that returned `posted` set); records
// the first failure in *error.
void WaitC(lbccResult_t posted, lbccRequest_t* request, const char* what, std::string* error) {
  lbccResult_t rc = posted;
  if (rc == lbccSuccess) rc = lbccWait(*request);
  if (*request != nullptr) lbccRequestFree(*request);
  if (rc != lbccSuccess && error->empty()) *error = Error(what, rc);
}

void SetError(const absl::Status& status, std::string* error) {
  if (!status.ok() && error->empty()) *error = status.ToString();
}

lbccComm_t InitC(const lbccUniqueId& id, int rank, std::string* error) {
  lbccConfig_t config = LBCC_CONFIG_INITIALIZER;
  config.transport = "loopback";
  config.timeoutSeconds = 30;
  lbccComm_t comm = nullptr;
  lbccResult_t rc = lbccCommInitRank(&comm, 2, id, rank, &config);
  if (rc != lbccSuccess) *error = Error("lbccCommInitRank", rc);
  return comm;
}

std::unique_ptr<comm::Communicator> InitCpp(const lbccUniqueId& c_id, int rank,
                                            std::string* error) {
  comm::UniqueId id;
  std::memcpy(&id, &c_id, sizeof(id));
  comm::FabricOptions options;
  options.backend = "loopback";
  options.timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<comm::Communicator>> made =
      comm::Communicator::Init(id, 2, rank, options);
  if (!made.ok()) {
    *error = made.status().ToString();
    return nullptr;
  }
  return *std::move(made);
}

// Stage 0 through the C API: sends the forwards, receives the backwards.
void Stage0C(const lbccUniqueId& id, const Bases& b, std::string* error) {
  lbccComm_t comm = InitC(id, 0, error);
  if (comm == nullptr) return;
  std::vector<lbccBasis_t> accepted = {b.c0};
  const codecs::SubspaceBasis* basis = b.v0.get();
  for (const char* step : kSchedule) {
    if (std::string(step) == "change") {
      accepted = {b.c1, b.c0};
      basis = b.v1.get();
      continue;
    }
    const int mb = Microbatch(step);
    lbccRequest_t request = nullptr;
    if (step[0] == 'F') {
      const std::vector<float> h = Stage0Output(*basis, mb);
      const std::vector<int32_t> ids = Ids(mb);
      WaitC(lbccSendActivations(h.data(), ids.data(), kTokens, accepted[0], nullptr, 1, kTag,
                                comm, &request),
            &request, "lbccSendActivations", error);
    } else {
      std::vector<float> g(kTokens * kD);
      WaitC(lbccRecvActivationGrads(g.data(), kTokens, accepted.data(),
                                    static_cast<int>(accepted.size()), 1, kTag, comm, &request),
            &request, "lbccRecvActivationGrads", error);
    }
  }
  lbccCommDestroy(comm);
}

// Stage 1 through the C API: receives the forwards, sends each backward with its forward's
// basis.
void Stage1C(const lbccUniqueId& id, const Bases& b, std::string* error) {
  lbccComm_t comm = InitC(id, 1, error);
  if (comm == nullptr) return;
  std::vector<lbccBasis_t> accepted = {b.c0};
  std::map<int, std::vector<float>> h;
  for (const char* step : kSchedule) {
    if (std::string(step) == "change") {
      accepted = {b.c1, b.c0};
      continue;
    }
    const int mb = Microbatch(step);
    lbccRequest_t request = nullptr;
    if (step[0] == 'F') {
      h[mb].resize(kTokens * kD);
      std::vector<int32_t> ids(kTokens, -1);
      WaitC(lbccRecvActivations(h[mb].data(), ids.data(), kTokens, accepted.data(),
                                static_cast<int>(accepted.size()), 0, kTag, comm, &request),
            &request, "lbccRecvActivations", error);
      if (ids != Ids(mb) && error->empty()) *error = absl::StrCat("ids of microbatch ", mb);
    } else {
      const std::vector<float> g = Gradient(h[mb], mb);
      WaitC(lbccSendActivationGrads(g.data(), kTokens, mb < kChangeBefore ? b.c0 : b.c1, nullptr,
                                    0, kTag, comm, &request),
            &request, "lbccSendActivationGrads", error);
    }
  }
  lbccCommDestroy(comm);
}

// Stage 1 in C++, capturing the forwards.
void Stage1Capture(const lbccUniqueId& id, const Bases& b, Payloads* forwards,
                   std::string* error) {
  std::unique_ptr<comm::Communicator> comm = InitCpp(id, 1, error);
  if (comm == nullptr) return;
  std::vector<SubspaceBasisPtr> accepted = {b.v0};
  std::map<int, std::vector<float>> h;
  std::map<int, comm::ActivationRoute> routes;
  for (const char* step : kSchedule) {
    if (std::string(step) == "change") {
      accepted = {b.v1, b.v0};
      continue;
    }
    const int mb = Microbatch(step);
    if (step[0] == 'F') {
      h[mb].resize(kTokens * kD);
      TensorView view = *TensorView::Host(h[mb].data(), {kTokens, kD});
      SetError(comm::RecvActivations(*comm, view, {}, accepted, 0, kTag, &routes[mb],
                                     &(*forwards)[mb])
                   ->Wait(),
               error);
    } else {
      std::vector<float> g = Gradient(h[mb], mb);
      TensorView view = *TensorView::Host(g.data(), {kTokens, kD});
      const SubspaceBasisPtr& basis = routes[mb].basis == b.v0->id() ? b.v0 : b.v1;
      SetError(comm::SendActivationGrads(*comm, view, basis, {}, routes[mb].selectors, 0, kTag)
                   ->Wait(),
               error);
    }
  }
}

// Stage 0 in C++, capturing the backwards.
void Stage0Capture(const lbccUniqueId& id, const Bases& b, Payloads* backwards,
                   std::string* error) {
  std::unique_ptr<comm::Communicator> comm = InitCpp(id, 0, error);
  if (comm == nullptr) return;
  std::vector<SubspaceBasisPtr> accepted = {b.v0};
  for (const char* step : kSchedule) {
    if (std::string(step) == "change") {
      accepted = {b.v1, b.v0};
      continue;
    }
    const int mb = Microbatch(step);
    if (step[0] == 'F') {
      std::vector<float> h = Stage0Output(*accepted[0], mb);
      TensorView view = *TensorView::Host(h.data(), {kTokens, kD});
      SetError(comm::SendActivations(*comm, view, Ids(mb), accepted[0], {}, 1, kTag)->Wait(),
               error);
    } else {
      std::vector<float> g(kTokens * kD);
      TensorView view = *TensorView::Host(g.data(), {kTokens, kD});
      SetError(comm::RecvActivationGrads(*comm, view, accepted, 1, kTag, nullptr,
                                         &(*backwards)[mb])
                   ->Wait(),
               error);
    }
  }
}

// "forward|backward <microbatch> <hex>" lines.
std::map<std::string, Payloads> ReadPythonPayloads(const std::string& path) {
  std::map<std::string, Payloads> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 3) continue;
    const std::string bytes = absl::HexStringToBytes(parts[2]);
    out[parts[0]][std::stoi(parts[1])].assign(bytes.begin(), bytes.end());
  }
  return out;
}

std::string FirstDifference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i] != b[i]) return absl::StrCat("first difference at byte ", i);
  }
  return absl::StrCat("sizes ", a.size(), " and ", b.size());
}

TEST(ActivationsWireTest, CApiBoundaryTrafficEqualsThePythonPathByteForByte) {
  const char* dir = std::getenv("LBCC_PYTHON_PAYLOADS_DIR");
  ASSERT_NE(dir, nullptr) << "run me through activations_wire_test.sh";
  std::map<std::string, Payloads> python = ReadPythonPayloads(absl::StrCat(dir, "/payloads.txt"));
  ASSERT_EQ(python["forward"].size(), size_t{kMicrobatches});
  ASSERT_EQ(python["backward"].size(), size_t{kMicrobatches});

  // v0 from the seed (both languages regenerate it), v1 from the file Python saved.
  Bases b;
  lbccBasisSpec_t spec = LBCC_BASIS_SPEC_INITIALIZER;
  spec.modelDim = kD;
  spec.rank = kK;
  spec.vocabSize = kV;
  spec.withTable = 1;
  spec.tableStddev = 0.5;
  spec.seed = kSeed;
  ASSERT_EQ(lbccBasisCreateFromSeed(&spec, &b.c0), lbccSuccess) << lbccGetLastError(nullptr);
  const std::string v1_path = absl::StrCat(dir, "/basis_v1.lbccb");
  ASSERT_EQ(lbccBasisLoad(v1_path.c_str(), &b.c1), lbccSuccess) << lbccGetLastError(nullptr);
  codecs::SubspaceSeedSpec cpp_spec;
  cpp_spec.model_dim = kD;
  cpp_spec.rank = kK;
  cpp_spec.vocab_size = kV;
  cpp_spec.with_table = true;
  cpp_spec.table_stddev = 0.5;
  cpp_spec.seed = kSeed;
  LBCC_ASSERT_OK_AND_ASSIGN(b.v0, codecs::SubspaceBasis::FromSeed(cpp_spec));
  LBCC_ASSERT_OK_AND_ASSIGN(b.v1, codecs::SubspaceBasis::Load(v1_path));
  uint64_t hash0 = 0, hash1 = 0;
  uint32_t version1 = 0;
  ASSERT_EQ(lbccBasisGetInfo(b.c0, nullptr, nullptr, nullptr, &hash0, nullptr), lbccSuccess);
  ASSERT_EQ(lbccBasisGetInfo(b.c1, nullptr, nullptr, nullptr, &hash1, &version1), lbccSuccess);
  EXPECT_EQ(hash0, b.v0->id().hash);
  EXPECT_EQ(version1, 1u);
  EXPECT_NE(hash1, hash0);

  Payloads forwards, backwards;
  for (const char* run : {"forward", "backward"}) {
    lbccUniqueId id;
    ASSERT_EQ(lbccGetUniqueId(&id), lbccSuccess);
    std::string error0, error1;
    std::thread rank0, rank1;
    if (std::string(run) == "forward") {
      rank0 = std::thread([&] { Stage0C(id, b, &error0); });
      rank1 = std::thread([&] { Stage1Capture(id, b, &forwards, &error1); });
    } else {
      rank0 = std::thread([&] { Stage0Capture(id, b, &backwards, &error0); });
      rank1 = std::thread([&] { Stage1C(id, b, &error1); });
    }
    rank0.join();
    rank1.join();
    EXPECT_EQ(error0, "") << run;
    EXPECT_EQ(error1, "") << run;
  }

  for (int mb = 0; mb < kMicrobatches; ++mb) {
    const std::vector<uint8_t>& f = python["forward"][mb];
    const std::vector<uint8_t>& g = python["backward"][mb];
    // 76 bytes of envelope and params, then a 1-byte id and k bf16 coefficients per token.
    EXPECT_EQ(f.size(), 76u + kTokens * (1 + 2 * kK));
    EXPECT_EQ(g.size(), 76u + kTokens * 2 * kK);
    EXPECT_TRUE(forwards[mb] == f) << "forward " << mb << ": " << FirstDifference(forwards[mb], f);
    EXPECT_TRUE(backwards[mb] == g) << "backward " << mb << ": "
                                    << FirstDifference(backwards[mb], g);
  }
  // The basis change is on the wire: microbatch 1's backward (sent after the change) names v0,
  // microbatch 2's v1.
  LBCC_ASSERT_OK_AND_ASSIGN(codecs::SubspacePayloadHeader late,
                            codecs::InspectSubspacePayload(python["backward"][1]));
  LBCC_ASSERT_OK_AND_ASSIGN(codecs::SubspacePayloadHeader next,
                            codecs::InspectSubspacePayload(python["backward"][2]));
  EXPECT_EQ(late.basis, b.v0->id());
  EXPECT_EQ(next.basis, b.v1->id());
}

}  // namespace
}  // namespace lbcc
