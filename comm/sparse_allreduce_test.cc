// SparseAllReduce over ranks as threads: bit-identical results on every rank, equal to an
// independent decode of every rank's payload in rank order, the same whatever the algorithm and
// topology; error feedback committed only on success.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "codecs/dense_quant.h"
#include "codecs/payload.h"
#include "codecs/topk_ef.h"
#include "comm/agreement.h"
#include "comm/collectives.h"
#include "comm/communicator.h"
#include "comm/testing.h"
#include "comm/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "xxhash.h"

namespace lbcc::comm {
namespace {

using ::lbcc::comm::testing::RankOptions;
using ::lbcc::comm::testing::AbortAndWait;
using ::lbcc::comm::testing::AwaitFirstSend;
using ::lbcc::comm::testing::RunRanks;
using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::Each;
using ::testing::HasSubstr;

constexpr int kRanks = 4;
// Two small tensors make one exchange group; the second set makes four with Pipelined()'s
// groups of >= 2^18 elements (the default minimum, 2^20, would make it one), so encode and
// exchange overlap.
const std::vector<Shape> kFewShapes = {{128, 192}, {1000}};
const std::vector<Shape> kManyShapes = {{512, 512}, {300, 1000}, {1000}, {256, 1024}, {64, 64}};
// One tensor big enough to go to the peers in pieces while it is encoded (direct algorithm).
const std::vector<Shape> kOneLargeShape = {{640, 1024}};

OpOptions Pipelined() {
  OpOptions op;
  op.sparse_group_elements = int64_t{1} << 18;
  return op;
}

std::vector<float> DeltaOf(int rank, int tensor, int64_t count) {
  std::mt19937 rng(rank * 7919 + tensor * 104729 + 1);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> v(count);
  for (float& x : v) x = normal(rng);
  return v;
}

int64_t Count(const Shape& shape) { return *NumElements(shape); }

std::unique_ptr<codecs::TopKEfCodec> MakeCodec() {
  codecs::TopKEfOptions options;
  options.top_k = 64;
  return *codecs::TopKEfCodec::Create(options);
}

// The reference: encode every rank's delta with a fresh state, decode all payloads in rank order.
std::vector<std::vector<float>> Reference(const std::vector<Shape>& kShapes) {
  auto codec = MakeCodec();
  std::vector<std::vector<float>> out;
  for (size_t t = 0; t < kShapes.size(); ++t) {
    std::vector<std::vector<uint8_t>> payloads(kRanks);
    std::vector<absl::Span<const uint8_t>> spans;
    for (int r = 0; r < kRanks; ++r) {
      std::vector<float> delta = DeltaOf(r, t, Count(kShapes[t]));
      codecs::TopKEfState state;
      payloads[r].resize(*codec->MaxEncodedBytes(kShapes[t]));
      const size_t size =
          *codec->Encode(*TensorView::Host(delta.data(), kShapes[t]), &state,
                         absl::MakeSpan(payloads[r]));
      payloads[r].resize(size);
      spans.push_back(payloads[r]);
    }
    std::vector<float> result(Count(kShapes[t]));
    EXPECT_THAT(codecs::DecodeAccumulate(spans, {}, *TensorView::Host(result.data(), kShapes[t])),
                IsOk());
    out.push_back(std::move(result));
  }
  return out;
}

struct Case {
  const char* name;
  const char* topology;
  Algorithm algorithm;
  const std::vector<Shape>* shapes = &kFewShapes;
};

class SparseAllReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(SparseAllReduceTest, BitIdenticalToTheReferenceOnEveryRank) {
  const std::vector<Shape>& shapes = *GetParam().shapes;
  const size_t n = shapes.size();
  const std::vector<std::vector<float>> reference = Reference(shapes);
  RankOptions options;
  options.topology = *Topology::FromJson(GetParam().topology);
  auto codec = MakeCodec();
  Mutex mu;
  std::vector<std::vector<std::vector<float>>> results(kRanks);
  auto statuses = RunRanks(kRanks, options, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<std::vector<float>> deltas, outs(n);
    std::vector<codecs::TopKEfState> states(n);
    std::vector<Communicator::SparseTensor> tensors;
    for (size_t t = 0; t < n; ++t) {
      deltas.push_back(DeltaOf(rank, t, Count(shapes[t])));
      outs[t].assign(Count(shapes[t]), -1.0f);
    }
    for (size_t t = 0; t < n; ++t) {
      tensors.push_back({*TensorView::Host(deltas[t].data(), shapes[t]),
                         *TensorView::Host(outs[t].data(), shapes[t]), &states[t]});
    }
    OpOptions op = Communicator::BulkOptions();
    op.algorithm = GetParam().algorithm;
    op.sparse_group_elements = Pipelined().sparse_group_elements;
    LBCC_RETURN_IF_ERROR(comm.SparseAllReduce(tensors, codec.get(), {}, op)->Wait());
    for (const auto& state : states) {
      if (state.has_pending() || state.error().empty()) {
        return absl::InternalError("state not committed");
      }
    }
    MutexLock lock(&mu);
    results[rank] = outs;
    return absl::OkStatus();
  });
  ASSERT_THAT(statuses, Each(IsOk()));
  for (int r = 0; r < kRanks; ++r) {
    for (size_t t = 0; t < n; ++t) {
      ASSERT_EQ(results[r][t].size(), reference[t].size());
      EXPECT_EQ(std::memcmp(results[r][t].data(), reference[t].data(), reference[t].size() * 4), 0)
          << "rank " << r << " tensor " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Topologies, SparseAllReduceTest,
    ::testing::Values(Case{"flat_auto", R"({"nranks": 4})", Algorithm::kAuto},
                      Case{"flat_ring", R"({"nranks": 4})", Algorithm::kRing},
                      Case{"two_islands_auto", R"({"nranks": 4, "islands": [[0, 1], [2, 3]]})",
                           Algorithm::kAuto},
                      Case{"two_islands_direct", R"({"nranks": 4, "islands": [[0, 1], [2, 3]]})",
                           Algorithm::kDirect},
                      Case{"island_and_remotes", R"({"nranks": 4, "islands": [[0, 2, 3]]})",
                           Algorithm::kHierarchical},
                      Case{"pipelined_direct", R"({"nranks": 4})", Algorithm::kDirect, &kManyShapes},
                      Case{"pipelined_ring", R"({"nranks": 4})", Algorithm::kRing, &kManyShapes},
                      Case{"pipelined_hierarchical", R"({"nranks": 4, "islands": [[0, 2, 3]]})",
                           Algorithm::kHierarchical, &kManyShapes},
                      Case{"one_large_direct", R"({"nranks": 4})", Algorithm::kDirect,
                           &kOneLargeShape},
                      Case{"one_large_ring", R"({"nranks": 4})", Algorithm::kRing,
                           &kOneLargeShape},
                      Case{"one_large_hierarchical", R"({"nranks": 4, "islands": [[0, 2, 3]]})",
                           Algorithm::kHierarchical, &kOneLargeShape}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(SparseAllReduceFailureTest, ARejectedInputFailsEveryRankAndKeepsState) {
  auto codec = MakeCodec();
  const Shape shape = {64, 64};
  auto statuses = RunRanks(3, {}, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<float> delta = DeltaOf(rank, 0, 4096), out(4096, 7.0f);
    codecs::TopKEfState state;
    std::vector<Communicator::SparseTensor> tensors = {
        {*TensorView::Host(delta.data(), shape), *TensorView::Host(out.data(), shape), &state}};
    // A first exchange gives every rank some error-feedback memory.
    LBCC_RETURN_IF_ERROR(comm.SparseAllReduce(tensors, codec.get())->Wait());
    const std::vector<float> memory(state.error().begin(), state.error().end());
    const std::vector<float> out_before = out;
    if (rank == 1) delta[5] = std::nanf("");
    absl::Status failed = comm.SparseAllReduce(tensors, codec.get())->Wait();
    if (failed.code() != absl::StatusCode::kInvalidArgument ||
        !absl::StrContains(failed.message(), "rank 1")) {
      return absl::InternalError(absl::StrCat("expected rank 1's rejection, got ", failed.ToString()));
    }
    if (state.has_pending() ||
        std::memcmp(state.error().data(), memory.data(), memory.size() * 4) != 0) {
      return absl::InternalError("error feedback changed by a failed exchange");
    }
    if (out != out_before) return absl::InternalError("output written by a failed exchange");
    // The communicator is still usable.
    delta[5] = 0.5f;
    return comm.SparseAllReduce(tensors, codec.get())->Wait();
  });
  EXPECT_THAT(statuses, Each(IsOk()));
}

// A bad LBCC_SPARSE_GROUP_ELEMENTS fails the call on every rank with InvalidArgument naming the
// variable, before anything is encoded; an explicit OpOptions value does not read it.
TEST(SparseAllReduceFailureTest, BadGroupSizeVariableIsInvalidArgument) {
  // The variable is read once, at Init (comm/config.h): every rank's Init fails naming it, so no
  // operation runs with it (and none can touch a state or an output).
  setenv("LBCC_SPARSE_GROUP_ELEMENTS", "0", 1);
  auto statuses = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    return absl::InternalError("Init accepted LBCC_SPARSE_GROUP_ELEMENTS=0");
  });
  unsetenv("LBCC_SPARSE_GROUP_ELEMENTS");
  EXPECT_THAT(statuses, Each(StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("LBCC_SPARSE_GROUP_ELEMENTS='0'"))));
  // Per operation, a valid value still wins over the communicator's (Pipelined: 2^18).
  auto codec = MakeCodec();
  const Shape shape = {64, 64};
  statuses = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<float> delta = DeltaOf(rank, 0, 4096), out(4096, 7.0f);
    codecs::TopKEfState state;
    std::vector<Communicator::SparseTensor> tensors = {
        {*TensorView::Host(delta.data(), shape), *TensorView::Host(out.data(), shape), &state}};
    return comm.SparseAllReduce(tensors, codec.get(), {}, Pipelined())->Wait();
  });
  EXPECT_THAT(statuses, Each(IsOk()));
}

// A rank that cannot encode a tensor of a later exchange group (its earlier groups already went
// out) fails the collective on every rank; nothing is written and no rank loses error feedback.
TEST(SparseAllReduceFailureTest, ARejectionInALaterGroupKeepsEveryOutputAndState) {
  auto codec = MakeCodec();
  const size_t n = kManyShapes.size();
  auto statuses = RunRanks(3, {}, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<std::vector<float>> deltas, outs(n);
    std::vector<codecs::TopKEfState> states(n);
    std::vector<Communicator::SparseTensor> tensors;
    for (size_t t = 0; t < n; ++t) {
      deltas.push_back(DeltaOf(rank, t, Count(kManyShapes[t])));
      outs[t].assign(Count(kManyShapes[t]), 7.0f);
    }
    for (size_t t = 0; t < n; ++t) {
      tensors.push_back({*TensorView::Host(deltas[t].data(), kManyShapes[t]),
                         *TensorView::Host(outs[t].data(), kManyShapes[t]), &states[t]});
    }
    LBCC_RETURN_IF_ERROR(comm.SparseAllReduce(tensors, codec.get(), {}, Pipelined())->Wait());
    const std::vector<std::vector<float>> outs_before = outs;
    std::vector<std::vector<float>> memory;
    for (const auto& s : states) memory.emplace_back(s.error().begin(), s.error().end());
    if (rank == 1) deltas[3][17] = std::numeric_limits<float>::infinity();
    absl::Status failed = comm.SparseAllReduce(tensors, codec.get(), {}, Pipelined())->Wait();
    if (failed.code() != absl::StatusCode::kInvalidArgument ||
        !absl::StrContains(failed.message(), rank == 1 ? "tensor 3" : "rank 1")) {
      return absl::InternalError(absl::StrCat("expected rank 1's rejection, got ", failed.ToString()));
    }
    for (size_t t = 0; t < n; ++t) {
      if (states[t].has_pending() ||
          std::memcmp(states[t].error().data(), memory[t].data(), memory[t].size() * 4) != 0) {
        return absl::InternalError(absl::StrCat("tensor ", t, ": error feedback changed"));
      }
      if (outs[t] != outs_before[t]) return absl::InternalError("output written by a failed exchange");
    }
    deltas[3][17] = 0.25f;
    return comm.SparseAllReduce(tensors, codec.get(), {}, Pipelined())->Wait();
  });
  EXPECT_THAT(statuses, Each(IsOk()));
}

// Wraps a TopK-EF codec and damages the payload of tensors of one shape, on one rank only.
// A codec that forwards to `inner`; subclasses change what Encode does around it.
class WrappingCodec : public codecs::Codec {
 public:
  WrappingCodec(const codecs::Codec* inner, std::string what)
      : inner_(inner), what_(std::move(what)) {}
  codecs::CodecId id() const override { return inner_->id(); }
  // The inner codec's: every rank's signature (comm/signature.h) names the same codec, as a
  // real peer that misbehaves would.
  std::string Describe() const override { return inner_->Describe(); }
  const std::string& what() const { return what_; }
  absl::StatusOr<size_t> MaxEncodedBytes(absl::Span<const int64_t> shape) const override {
    return inner_->MaxEncodedBytes(shape);
  }

 protected:
  const codecs::Codec* inner_;

 private:
  std::string what_;
};

class CorruptingCodec final : public WrappingCodec {
 public:
  enum class Damage { kChecksum, kIndexWithValidChecksum };
  CorruptingCodec(const codecs::Codec* inner, Shape victim, Damage damage)
      : WrappingCodec(inner, "corrupting"), victim_(std::move(victim)), damage_(damage) {}
  absl::StatusOr<size_t> Encode(const TensorView& input, codecs::CodecState* state,
                                absl::Span<uint8_t> out) const override {
    LBCC_ASSIGN_OR_RETURN(size_t size, inner_->Encode(input, state, out));
    if (input.shape() != victim_) return size;
    LBCC_ASSIGN_OR_RETURN(codecs::PayloadInfo info, codecs::ParsePayload(out.subspan(0, size)));
    uint8_t* index_section = const_cast<uint8_t*>(info.body.data());
    if (damage_ == Damage::kChecksum) {
      index_section[0] ^= 0x40;  // The checksum no longer matches.
      return size;
    }
    // First 12-bit index -> >= 4080, beyond every chunk of victim_; then re-sign the payload,
    // so only the decoder's range check can catch it.
    index_section[0] = 0xff;
    index_section[1] |= 0xff;
    const uint64_t sum = XXH3_64bits(out.data(), size - codecs::kPayloadChecksumBytes);
    std::memcpy(out.data() + size - codecs::kPayloadChecksumBytes, &sum, sizeof(sum));
    return size;
  }

 private:
  Shape victim_;
  Damage damage_;
};

// A corrupt payload from rank 1 fails the collective on every rank with DataLoss, before any
// output is written and with every rank's error feedback kept: caught by the checksum (either
// tensor) or, with a valid checksum, by the decoder's range check.
class SparseAllReduceCorruptTest
    : public ::testing::TestWithParam<std::tuple<CorruptingCodec::Damage, int>> {};

TEST_P(SparseAllReduceCorruptTest, FailsEveryRankAndWritesNothing) {
  const auto [damage, victim_tensor] = GetParam();
  // 65 x 65 chunks into 13 x 13 blocks (169 elements), so a 12-bit index can exceed a chunk.
  const Shape shapes[2] = {{65, 65}, {64, 96}};
  codecs::TopKEfOptions options;
  options.indices = codecs::IndexCoding::kPacked12;
  auto inner = *codecs::TopKEfCodec::Create(options);
  CorruptingCodec corrupting(inner.get(), shapes[victim_tensor], damage);
  auto statuses = RunRanks(3, {}, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<std::vector<float>> delta, out;
    std::vector<codecs::TopKEfState> states(2);
    std::vector<Communicator::SparseTensor> tensors;
    for (int t = 0; t < 2; ++t) {
      delta.push_back(DeltaOf(rank, t, Count(shapes[t])));
      out.emplace_back(Count(shapes[t]), 7.0f);
    }
    for (int t = 0; t < 2; ++t) {
      tensors.push_back({*TensorView::Host(delta[t].data(), shapes[t]),
                         *TensorView::Host(out[t].data(), shapes[t]), &states[t]});
    }
    LBCC_RETURN_IF_ERROR(comm.SparseAllReduce(tensors, inner.get())->Wait());
    const std::vector<std::vector<float>> out_before = out;
    std::vector<std::vector<float>> memory;
    for (const auto& s : states) memory.emplace_back(s.error().begin(), s.error().end());
    const codecs::Codec* codec =
        rank == 1 ? static_cast<const codecs::Codec*>(&corrupting) : inner.get();
    absl::Status failed = comm.SparseAllReduce(tensors, codec)->Wait();
    // Every payload is checked in full as its group arrives, before any output is written.
    const std::string where = absl::StrCat("tensor ", victim_tensor, ": payload 1");
    if (failed.code() != absl::StatusCode::kDataLoss || !absl::StrContains(failed.message(), where)) {
      return absl::InternalError(absl::StrCat("expected DataLoss naming '", where, "', got ",
                                              failed.ToString()));
    }
    for (int t = 0; t < 2; ++t) {
      if (states[t].has_pending() ||
          std::memcmp(states[t].error().data(), memory[t].data(), memory[t].size() * 4) != 0) {
        return absl::InternalError("error feedback changed by a failed exchange");
      }
      if (out[t] != out_before[t]) return absl::InternalError("output written by a failed exchange");
    }
    // The next clean exchange works.
    return comm.SparseAllReduce(tensors, inner.get())->Wait();
  });
  EXPECT_THAT(statuses, Each(IsOk()));
}

INSTANTIATE_TEST_SUITE_P(
    Damages, SparseAllReduceCorruptTest,
    ::testing::Values(std::make_tuple(CorruptingCodec::Damage::kChecksum, 0),
                      std::make_tuple(CorruptingCodec::Damage::kChecksum, 1),
                      std::make_tuple(CorruptingCodec::Damage::kIndexWithValidChecksum, 0),
                      std::make_tuple(CorruptingCodec::Damage::kIndexWithValidChecksum, 1)));

// Counts successful encodes into *done (under *mu, signalling *cv).
class CountingCodec final : public WrappingCodec {
 public:
  CountingCodec(const codecs::Codec* inner, Mutex* mu, CondVar* cv, int* done)
      : WrappingCodec(inner, "counting"), mu_(mu), cv_(cv), done_(done) {}
  absl::StatusOr<size_t> Encode(const TensorView& input, codecs::CodecState* state,
                                absl::Span<uint8_t> out) const override {
    LBCC_ASSIGN_OR_RETURN(size_t size, inner_->Encode(input, state, out));
    MutexLock lock(mu_);
    ++*done_;
    cv_->SignalAll();
    return size;
  }

 private:
  Mutex* mu_;
  CondVar* cv_;
  int* done_;
};

// Ranks 0 and 2 have encoded all four exchange groups and started their exchange (blobs over
// 64 KiB, which the loopback transport delivers like a rendezvous: a send completes only once
// received) before rank 1 gives up in the first group. Every send must still find its receive:
// the collective fails on every rank with rank 1's error well before the timeout, and the
// communicator works afterwards. For each all-gather algorithm (direct sends groups from the
// encoding thread, ring and hierarchical run each group's all-gather on a thread of its own).
class SparseAllReduceGiveUpTest : public ::testing::TestWithParam<Algorithm> {};

// Rank 1's codec: its first Encode waits until the others encoded every group (the operation
// starts on every rank at once, after the signature check, so the wait is inside it).
class GatedCodec final : public WrappingCodec {
 public:
  GatedCodec(const codecs::Codec* inner, Mutex* mu, CondVar* cv, const int* done, int until)
      : WrappingCodec(inner, "gated"), mu_(mu), cv_(cv), done_(done), until_(until) {}
  absl::StatusOr<size_t> Encode(const TensorView& input, codecs::CodecState* state,
                                absl::Span<uint8_t> out) const override {
    {
      MutexLock lock(mu_);
      while (*done_ < until_) cv_->Wait(mu_);
    }
    return inner_->Encode(input, state, out);
  }

 private:
  Mutex* mu_;
  CondVar* cv_;
  const int* done_;
  const int until_;
};

TEST_P(SparseAllReduceGiveUpTest, AGiveUpAfterOthersStartedEveryGroupStrandsNoSend) {
  codecs::TopKEfOptions topk;
  topk.top_k = 1024;  // 1/4 of the values as fp32 with 12-bit indices: ~90 KB per tensor
  topk.values = codecs::ValueCoding::kF32;
  topk.indices = codecs::IndexCoding::kPacked12;
  auto inner = *codecs::TopKEfCodec::Create(topk);
  const Shape shape = {256, 256};
  constexpr int kTensors = 4;
  OpOptions op;
  op.sparse_group_elements = 256 * 256;  // one group per tensor
  op.algorithm = GetParam();
  RankOptions options;
  options.timeout = absl::Seconds(20);
  options.topology = *Topology::FromJson(R"({"nranks": 3, "islands": [[0, 1]]})");
  Mutex mu;
  CondVar cv;
  int encoded = 0;  // by ranks 0 and 2
  CountingCodec counting(inner.get(), &mu, &cv, &encoded);
  GatedCodec gated(inner.get(), &mu, &cv, &encoded, 2 * kTensors);
  auto statuses = RunRanks(3, options, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<std::vector<float>> deltas, outs(kTensors);
    std::vector<codecs::TopKEfState> states(kTensors);
    std::vector<Communicator::SparseTensor> tensors;
    for (int t = 0; t < kTensors; ++t) {
      deltas.push_back(DeltaOf(rank, t, 256 * 256));
      outs[t].assign(256 * 256, 7.0f);
    }
    for (int t = 0; t < kTensors; ++t) {
      tensors.push_back({*TensorView::Host(deltas[t].data(), shape),
                         *TensorView::Host(outs[t].data(), shape), &states[t]});
    }
    if (rank == 1) deltas[0][3] = std::nanf("");
    const absl::Time start = absl::Now();
    const codecs::Codec* codec = &gated;
    if (rank != 1) codec = &counting;
    absl::Status failed = comm.SparseAllReduce(tensors, codec, {}, op)->Wait();
    if (failed.code() != absl::StatusCode::kInvalidArgument ||
        !absl::StrContains(failed.message(), rank == 1 ? "tensor 0" : "rank 1")) {
      return absl::InternalError(absl::StrCat("expected rank 1's rejection, got ", failed.ToString()));
    }
    if (absl::Now() - start > absl::Seconds(10)) {
      return absl::InternalError("the failed collective waited for the timeout");
    }
    for (int t = 0; t < kTensors; ++t) {
      if (states[t].has_pending()) return absl::InternalError("state left pending");
      if (outs[t] != std::vector<float>(256 * 256, 7.0f)) {
        return absl::InternalError("output written by a failed exchange");
      }
    }
    deltas[0][3] = 0.25f;
    return comm.SparseAllReduce(tensors, inner.get(), {}, op)->Wait();
  });
  EXPECT_THAT(statuses, Each(IsOk()));
}

// A tensor sent in pieces while it is encoded: rank 1 meets a NaN in its last rows, after most
// of its index section went out. Every rank fails with rank 1's error, writes nothing, keeps its
// state, and the same communicator then completes the collective with equal results everywhere.
TEST_P(SparseAllReduceGiveUpTest, AGiveUpAfterStreamedPiecesFailsEveryRankCleanly) {
  auto codec = MakeCodec();
  const Shape shape = {512, 1024};
  const int64_t n = Count(shape);
  RankOptions options;
  options.timeout = absl::Seconds(20);
  options.topology = *Topology::FromJson(R"({"nranks": 3, "islands": [[0, 1]]})");
  Mutex mu;
  std::vector<std::vector<float>> results(3);
  auto statuses = RunRanks(3, options, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<float> delta = DeltaOf(rank, 0, n), out(n, 7.0f);
    codecs::TopKEfState state;
    std::vector<Communicator::SparseTensor> tensors = {
        {*TensorView::Host(delta.data(), shape), *TensorView::Host(out.data(), shape), &state}};
    OpOptions op;
    op.algorithm = GetParam();
    if (rank == 1) delta[n - 3] = std::nanf("");
    absl::Status failed = comm.SparseAllReduce(tensors, codec.get(), {}, op)->Wait();
    if (failed.code() != absl::StatusCode::kInvalidArgument ||
        !absl::StrContains(failed.message(), rank == 1 ? "NaN" : "rank 1")) {
      return absl::InternalError(absl::StrCat("expected rank 1's rejection, got ", failed.ToString()));
    }
    if (state.has_pending() || out != std::vector<float>(n, 7.0f)) {
      return absl::InternalError("state pending or output written by a failed exchange");
    }
    delta[n - 3] = 0.5f;
    LBCC_RETURN_IF_ERROR(comm.SparseAllReduce(tensors, codec.get(), {}, op)->Wait());
    MutexLock lock(&mu);
    results[rank] = out;
    return absl::OkStatus();
  });
  ASSERT_THAT(statuses, Each(IsOk()));
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
  EXPECT_NE(results[0], std::vector<float>(n, 7.0f));
}

INSTANTIATE_TEST_SUITE_P(Algorithms, SparseAllReduceGiveUpTest,
                         ::testing::Values(Algorithm::kDirect, Algorithm::kRing,
                                           Algorithm::kHierarchical),
                         [](const auto& info) {
                           return std::string(AlgorithmName(info.param));
                         });

TEST(SparseAllReduceFailureTest, ADeadRankFailsTheOthersWithoutLosingState) {
  auto codec = MakeCodec();
  const Shape shape = {64, 64};
  RankOptions options;
  options.timeout = absl::Seconds(5);
  std::vector<absl::Status> exchange(3);
  // Rank 2 dies only once the others completed the first exchange (an abort fails whatever is
  // still in flight, which is not what this test is about).
  Mutex mu;
  CondVar cv;
  int first_done = 0;
  auto statuses = RunRanks(3, options, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<float> delta = DeltaOf(rank, 0, 4096), out(4096, 7.0f);
    codecs::TopKEfState state;
    std::vector<Communicator::SparseTensor> tensors = {
        {*TensorView::Host(delta.data(), shape), *TensorView::Host(out.data(), shape), &state}};
    LBCC_RETURN_IF_ERROR(comm.SparseAllReduce(tensors, codec.get())->Wait());
    const std::vector<float> memory(state.error().begin(), state.error().end());
    {
      MutexLock lock(&mu);
      ++first_done;
      cv.SignalAll();
      while (rank == 2 && first_done < 3) cv.Wait(&mu);
    }
    if (rank == 2) {
      comm.Abort();  // Dies before the second exchange.
      return absl::OkStatus();
    }
    exchange[rank] = comm.SparseAllReduce(tensors, codec.get())->Wait();
    if (state.has_pending() ||
        std::memcmp(state.error().data(), memory.data(), memory.size() * 4) != 0) {
      return absl::InternalError("error feedback changed by a failed exchange");
    }
    return absl::OkStatus();
  });
  EXPECT_THAT(statuses, Each(IsOk()));
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(exchange[r], StatusIs(AnyOf(absl::StatusCode::kUnavailable,
                                            absl::StatusCode::kCancelled,
                                            absl::StatusCode::kDeadlineExceeded)))
        << "rank " << r;
  }
}

// Abort() while the exchange waits for a peer that never posts it (ranks 1 and 2): the call
// returns at once with the abort's Cancelled, the error feedback as before the call, no output
// written. Only the abort can end it: the communicator's timeout and LBCC_PEER_TIMEOUT_MS are a
// minute. Over each transport, ranks as threads.
class SparseAllReduceAbortTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SparseAllReduceAbortTest, AbortFailsThePendingExchangeAtOnceAndKeepsState) {
  setenv("LBCC_PEER_TIMEOUT_MS", "60000", 1);
  auto codec = MakeCodec();
  const Shape shape = {64, 64};
  RankOptions options;
  options.backend = GetParam();
  options.timeout = absl::Seconds(60);
  Mutex mu;
  CondVar cv;
  bool rank0_done = false;
  absl::Status exchange;
  absl::Duration latency = absl::InfiniteDuration();
  auto statuses = RunRanks(3, options, [&](int rank, Communicator& comm) -> absl::Status {
    // Every rank is up (its Init returned) before rank 0 closes its connections.
    LBCC_RETURN_IF_ERROR(comm.Barrier()->Wait());
    if (rank != 0) {
      MutexLock lock(&mu);
      while (!rank0_done) cv.Wait(&mu);
      comm.Abort();
      return absl::OkStatus();
    }
    std::vector<float> delta = DeltaOf(rank, 0, 4096), out(4096, 7.0f);
    codecs::TopKEfState state;
    std::vector<Communicator::SparseTensor> tensors = {
        {*TensorView::Host(delta.data(), shape), *TensorView::Host(out.data(), shape), &state}};
    const uint64_t sent_before = comm.fabric()->Counters(1).messages_sent;
    RequestPtr request = comm.SparseAllReduce(tensors, codec.get());
    AwaitFirstSend(comm, 1, sent_before, request);
    std::tie(exchange, latency) = AbortAndWait(comm, request);
    {
      MutexLock lock(&mu);
      rank0_done = true;
      cv.SignalAll();
    }
    if (state.has_pending() ||
        std::any_of(state.error().begin(), state.error().end(), [](float e) { return e != 0; })) {
      return absl::InternalError("error feedback changed by an aborted exchange");
    }
    if (std::any_of(out.begin(), out.end(), [](float x) { return x != 7.0f; })) {
      return absl::InternalError("an aborted exchange wrote its output");
    }
    return absl::OkStatus();
  });
  EXPECT_THAT(statuses, Each(IsOk()));
  EXPECT_THAT(exchange, StatusIs(absl::StatusCode::kCancelled, HasSubstr("aborted")));
  EXPECT_THAT(exchange.message(), HasSubstr("Communicator::Abort"));
  // Not a timing check: far above what it takes, and below anything that waits for a peer (the
  // outcome agreement's grace of 10 s, the timeouts of a minute).
  EXPECT_LT(latency, absl::Seconds(10));
  std::printf("Abort() to the pending SparseAllReduce's return over %s: %.3f ms\n", GetParam(),
              absl::ToDoubleMilliseconds(latency));
}

// The same once the exchange is under way: ranks 1 and 2 passed the header round and are held
// before they send anything (the fault hook), so rank 0 waits for their payloads; it aborts, and
// its call returns at once. Then ranks 1 and 2 abort too and are let go.
TEST_P(SparseAllReduceAbortTest, AbortFailsAnExchangeWaitingForPayloadsAtOnce) {
  setenv("LBCC_PEER_TIMEOUT_MS", "60000", 1);
  auto codec = MakeCodec();
  const Shape shape = {64, 64};
  RankOptions options;
  options.backend = GetParam();
  options.timeout = absl::Seconds(60);
  Mutex mu;
  bool rank0_exchanging = false, rank0_done = false;
  std::vector<bool> aborted(3, false);
  internal::SetFaultHookForTesting([&](const Group& group, internal::FaultPoint point) -> int {
    if (point != internal::FaultPoint::kBeforeSend) return -1;
    const int rank = group.fabric->rank();
    MutexLock lock(&mu);
    if (rank == 0) {
      rank0_exchanging = true;
      return -1;
    }
    mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return aborted[rank]; });
    return -1;
  });
  std::vector<absl::Status> exchange(3);
  absl::Duration latency = absl::InfiniteDuration();
  auto statuses = RunRanks(3, options, [&](int rank, Communicator& comm) -> absl::Status {
    LBCC_RETURN_IF_ERROR(comm.Barrier()->Wait());
    std::vector<float> delta = DeltaOf(rank, 0, 4096), out(4096, 7.0f);
    codecs::TopKEfState state;
    std::vector<Communicator::SparseTensor> tensors = {
        {*TensorView::Host(delta.data(), shape), *TensorView::Host(out.data(), shape), &state}};
    RequestPtr request = comm.SparseAllReduce(tensors, codec.get());
    if (rank != 0) {
      {
        MutexLock lock(&mu);
        mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return rank0_done; });
      }
      comm.Abort();
      {
        MutexLock lock(&mu);
        aborted[rank] = true;
      }
      exchange[rank] = request->Wait();
    } else {
      {
        MutexLock lock(&mu);
        mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return rank0_exchanging; });
      }
      std::tie(exchange[0], latency) = AbortAndWait(comm, request);
      MutexLock lock(&mu);
      rank0_done = true;
    }
    if (state.has_pending() ||
        std::any_of(state.error().begin(), state.error().end(), [](float e) { return e != 0; })) {
      return absl::InternalError("error feedback changed by an aborted exchange");
    }
    if (std::any_of(out.begin(), out.end(), [](float x) { return x != 7.0f; })) {
      return absl::InternalError("an aborted exchange wrote its output");
    }
    return absl::OkStatus();
  });
  internal::SetFaultHookForTesting(nullptr);
  EXPECT_THAT(statuses, Each(IsOk()));
  EXPECT_THAT(exchange[0], StatusIs(absl::StatusCode::kCancelled, HasSubstr("Communicator::Abort")));
  for (int r = 1; r < 3; ++r) {
    EXPECT_THAT(exchange[r], StatusIs(AnyOf(absl::StatusCode::kCancelled,
                                            absl::StatusCode::kUnavailable)))
        << "rank " << r;
  }
  EXPECT_LT(latency, absl::Seconds(10));  // as above: not a timing check
  std::printf("Abort() to the return of a SparseAllReduce waiting for payloads over %s: %.3f ms\n",
              GetParam(), absl::ToDoubleMilliseconds(latency));
}

INSTANTIATE_TEST_SUITE_P(Transports, SparseAllReduceAbortTest,
                         ::testing::Values("loopback", "ucx"),
                         [](const auto& info) { return std::string(info.param); });

// One outcome per step: a rank dies (every connection closed, control ones too, as when its
// process is killed) at each point of the schedule; every survivor ends the same way: all
// commit (states committed, outputs written) or all abort (states kept, outputs untouched).
struct DeathCase {
  const char* name;
  internal::FaultPoint point;
  int vote_reach;  // at kVote: how many peers get the dying rank's vote (-1: all)
  Algorithm algorithm;
  const char* expect;  // "abort", or "either" when the dying rank's vote may have counted
};

class SparseAllReduceOutcomeTest : public ::testing::TestWithParam<DeathCase> {};

// The first rank an operation's error names after "... on rank <reporter>: ", or -1.
int FirstRankBlamed(const absl::Status& status, int reporter) {
  const std::string prefix = absl::StrCat(" on rank ", reporter, ": ");
  absl::string_view body = status.message();
  const size_t at = body.find(prefix);
  if (at != absl::string_view::npos) body.remove_prefix(at + prefix.size());
  for (size_t i = body.find("rank"); i != absl::string_view::npos;
       i = body.find("rank", i + 1)) {
    size_t j = i + 4;
    if (j < body.size() && body[j] == 's') ++j;  // "ranks 0, 2"
    if (j >= body.size() || body[j] != ' ') continue;
    const size_t digits = ++j;
    int rank = 0;
    while (j < body.size() && body[j] >= '0' && body[j] <= '9') rank = rank * 10 + body[j++] - '0';
    if (j > digits) return rank;
  }
  return -1;
}

TEST_P(SparseAllReduceOutcomeTest, EverySurvivorCommitsOrEverySurvivorAborts) {
  constexpr int kVictim = 2;
  const DeathCase c = GetParam();
  const std::vector<Shape>& shapes = kManyShapes;
  const size_t n = shapes.size();
  auto codec = MakeCodec();
  RankOptions options;
  options.timeout = absl::Seconds(20);
  Mutex mu;
  int warm = 0;           // ranks done with the first (undisturbed) call
  bool armed = false;     // the hook kills from now on
  internal::SetFaultHookForTesting(
      [&](const Group& group, internal::FaultPoint point) -> int {
        {
          MutexLock lock(&mu);
          if (!armed || group.fabric->rank() != kVictim) return -1;
        }
        if (point == internal::FaultPoint::kVote) return c.vote_reach;
        const internal::FaultPoint death = c.point == internal::FaultPoint::kVote
                                               ? internal::FaultPoint::kAfterVote
                                               : c.point;
        if (point == death) group.fabric->CrashForTesting();
        return -1;
      });
  struct Outcome {
    absl::Status status;
    bool committed = false, written = false, pending = false, partly = false;
  };
  std::vector<Outcome> outcomes(kRanks);
  auto statuses = RunRanks(kRanks, options, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<std::vector<float>> deltas, outs(n);
    std::vector<codecs::TopKEfState> states(n);
    std::vector<Communicator::SparseTensor> tensors;
    for (size_t t = 0; t < n; ++t) {
      deltas.push_back(DeltaOf(rank, t, Count(shapes[t])));
      outs[t].assign(Count(shapes[t]), 0.0f);
    }
    for (size_t t = 0; t < n; ++t) {
      tensors.push_back({*TensorView::Host(deltas[t].data(), shapes[t]),
                         *TensorView::Host(outs[t].data(), shapes[t]), &states[t]});
    }
    OpOptions op = Pipelined();
    op.algorithm = c.algorithm;
    LBCC_RETURN_IF_ERROR(comm.SparseAllReduce(tensors, codec.get(), {}, op)->Wait());
    std::vector<std::vector<float>> memory, before = outs;
    for (const auto& state : states) {
      memory.emplace_back(state.error().begin(), state.error().end());
    }
    {
      MutexLock lock(&mu);
      if (++warm == kRanks) armed = true;
      mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return armed; });
    }
    Outcome& o = outcomes[rank];
    o.status = comm.SparseAllReduce(tensors, codec.get(), {}, op)->Wait();
    int changed = 0, written = 0;
    for (size_t t = 0; t < n; ++t) {
      o.pending |= states[t].has_pending();
      changed += std::memcmp(states[t].error().data(), memory[t].data(),
                             memory[t].size() * 4) != 0;
      written += outs[t] != before[t];
    }
    o.committed = changed == static_cast<int>(n);
    o.written = written == static_cast<int>(n);
    o.partly = (changed != 0 && !o.committed) || (written != 0 && !o.written);
    return absl::OkStatus();
  });
  internal::SetFaultHookForTesting(nullptr);
  EXPECT_THAT(statuses, Each(IsOk()));
  const bool commit = outcomes[0].status.ok();
  for (int r = 0; r < kRanks; ++r) {
    if (r == kVictim) continue;
    const Outcome& o = outcomes[r];
    SCOPED_TRACE(absl::StrCat("rank ", r, ": ", o.status.ToString()));
    EXPECT_EQ(o.status.ok(), commit) << "survivors disagree";
    EXPECT_FALSE(o.pending);
    EXPECT_FALSE(o.partly);
    EXPECT_EQ(o.committed, commit);
    EXPECT_EQ(o.written, commit);
    if (!commit) {
      EXPECT_THAT(o.status, StatusIs(AnyOf(absl::StatusCode::kUnavailable,
                                           absl::StatusCode::kCancelled,
                                           absl::StatusCode::kDeadlineExceeded)));
      // The error blames the dead rank, not a survivor that aborted because of it.
      EXPECT_EQ(FirstRankBlamed(o.status, r), kVictim);
    }
  }
  if (std::string(c.expect) == "abort") EXPECT_FALSE(commit);
}

INSTANTIATE_TEST_SUITE_P(
    DeathPoints, SparseAllReduceOutcomeTest,
    ::testing::Values(
        DeathCase{"BeforeSendDirect", internal::FaultPoint::kBeforeSend, -1, Algorithm::kDirect,
                  "abort"},
        DeathCase{"BeforeSendRing", internal::FaultPoint::kBeforeSend, -1, Algorithm::kRing,
                  "abort"},
        DeathCase{"MidExchangeDirect", internal::FaultPoint::kMidExchange, -1,
                  Algorithm::kDirect, "abort"},
        DeathCase{"MidExchangeRing", internal::FaultPoint::kMidExchange, -1, Algorithm::kRing,
                  "abort"},
        DeathCase{"AfterLastSendDirect", internal::FaultPoint::kAfterLastSend, -1,
                  Algorithm::kDirect, "abort"},
        DeathCase{"AfterLastSendRing", internal::FaultPoint::kAfterLastSend, -1,
                  Algorithm::kRing, "abort"},
        DeathCase{"VotedToNobody", internal::FaultPoint::kVote, 0, Algorithm::kDirect, "abort"},
        DeathCase{"VotedToOnePeer", internal::FaultPoint::kVote, 1, Algorithm::kDirect,
                  "either"},
        DeathCase{"VotedToTwoPeers", internal::FaultPoint::kVote, 2, Algorithm::kRing,
                  "either"},
        DeathCase{"AfterVotingDirect", internal::FaultPoint::kAfterVote, -1, Algorithm::kDirect,
                  "either"},
        DeathCase{"AfterVotingRing", internal::FaultPoint::kAfterVote, -1, Algorithm::kRing,
                  "either"}),
    [](const auto& info) { return std::string(info.param.name); });

// The communicator's threads are started with it: 100 calls over every exchange path (direct,
// ring and hierarchical all-gathers, pipelined groups, a tensor streamed in pieces) start none.
TEST(SparseAllReduceThreadsTest, AHundredCallsStartNoThread) {
  auto codec = MakeCodec();
  const std::vector<Shape> shapes = {{256, 512}, {300, 1000}, {64, 64}};
  RankOptions options;
  options.topology = *Topology::FromJson(R"({"nranks": 4, "islands": [[0, 2, 3]]})");
  Mutex mu;
  std::vector<uint64_t> started(kRanks), after(kRanks);
  auto statuses = RunRanks(kRanks, options, [&](int rank, Communicator& comm) -> absl::Status {
    // Once every rank passed the barrier, every communicator (and its pool) exists.
    LBCC_RETURN_IF_ERROR(comm.Barrier()->Wait());
    const uint64_t before = ThreadPool::ThreadsStarted();
    LBCC_RETURN_IF_ERROR(comm.Barrier()->Wait());
    std::vector<std::vector<float>> deltas, outs(shapes.size());
    std::vector<codecs::TopKEfState> states(shapes.size());
    for (size_t t = 0; t < shapes.size(); ++t) {
      deltas.push_back(DeltaOf(rank, t, Count(shapes[t])));
      outs[t].assign(Count(shapes[t]), 0.0f);
    }
    const Algorithm algorithms[] = {Algorithm::kDirect, Algorithm::kRing,
                                    Algorithm::kHierarchical};
    for (int call = 0; call < 100; ++call) {
      OpOptions op = Pipelined();
      op.algorithm = algorithms[call % 3];
      // Odd calls: the large tensor alone (streamed in pieces over the slow links).
      const size_t n = call % 2 == 1 ? 1 : shapes.size();
      std::vector<Communicator::SparseTensor> tensors;
      for (size_t t = 0; t < n; ++t) {
        tensors.push_back({*TensorView::Host(deltas[t].data(), shapes[t]),
                           *TensorView::Host(outs[t].data(), shapes[t]), &states[t]});
      }
      LBCC_RETURN_IF_ERROR(comm.SparseAllReduce(tensors, codec.get(), {}, op)->Wait());
    }
    LBCC_RETURN_IF_ERROR(comm.Barrier()->Wait());
    MutexLock lock(&mu);
    started[rank] = before;
    after[rank] = ThreadPool::ThreadsStarted();
    return absl::OkStatus();
  });
  ASSERT_THAT(statuses, Each(IsOk()));
  EXPECT_GE(started[0], static_cast<uint64_t>(kRanks));  // the counter counts the pools
  EXPECT_EQ(after, started);
}

// Every operation's per-tag state in the transport is released when it completes on a rank, so
// a long job does not grow with the number of steps: the live tag entries of every link stay a
// handful after 30 and after 300 rounds of all-reduce + sparse all-reduce.
uint64_t LiveTags(Communicator& comm) {
  uint64_t live = 0;
  for (int r = 0; r < comm.nranks(); ++r) {
    if (r == comm.rank()) continue;
    live += comm.fabric()->out(comm.global_ranks()[r])->counters().live_tags;
    live += comm.fabric()->in(comm.global_ranks()[r])->counters().live_tags;
  }
  return live;
}

TEST(SparseAllReduceMemoryTest, PerTagStateIsReleasedWhenOperationsComplete) {
  auto codec = MakeCodec();
  const Shape shape = {256, 512};
  RankOptions options;
  options.topology = *Topology::FromJson(R"({"nranks": 4, "islands": [[0, 1]]})");
  Mutex mu;
  std::vector<uint64_t> early(kRanks), late(kRanks);
  auto statuses = RunRanks(kRanks, options, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<float> delta = DeltaOf(rank, 0, Count(shape)), out(Count(shape));
    codecs::TopKEfState state;
    float one = 1.0f;
    const Algorithm algorithms[] = {Algorithm::kDirect, Algorithm::kRing,
                                    Algorithm::kHierarchical};
    for (int round = 1; round <= 300; ++round) {
      TensorView scalar = *TensorView::Host(&one, {1});
      LBCC_RETURN_IF_ERROR(comm.AllReduce(scalar, scalar, ReduceOp::kAvg)->Wait());
      OpOptions op = Pipelined();
      op.algorithm = algorithms[round % 3];
      std::vector<Communicator::SparseTensor> tensors = {
          {*TensorView::Host(delta.data(), shape), *TensorView::Host(out.data(), shape), &state}};
      LBCC_RETURN_IF_ERROR(comm.SparseAllReduce(tensors, codec.get(), {}, op)->Wait());
      if (round == 30 || round == 300) {
        // After a barrier no peer has anything in flight towards this rank.
        LBCC_RETURN_IF_ERROR(comm.Barrier()->Wait());
        LBCC_RETURN_IF_ERROR(comm.Barrier()->Wait());
        MutexLock lock(&mu);
        (round == 30 ? early : late)[rank] = LiveTags(comm);
      }
    }
    return absl::OkStatus();
  });
  ASSERT_THAT(statuses, Each(IsOk()));
  // A few entries stay: the set-up's, and those of the next operation, whose messages peers
  // that measured first may already have sent (at most a few per peer). None accrue per
  // operation: without the release, 30 rounds leave ~1,000 and 300 rounds ~10,000.
  const uint64_t bound = 6u * (kRanks - 1);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_LE(early[r], bound) << "rank " << r;
    EXPECT_LE(late[r], bound) << "rank " << r;
  }
}

TEST(CompressedP2pTest, DenseInt8BetweenStagesAndShapeMismatch) {
  auto codec = *codecs::DenseQuantCodec::Create({});
  auto statuses = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<float> data = DeltaOf(rank, 3, 4096);
    if (rank == 0) {
      LBCC_RETURN_IF_ERROR(
          comm.SendCompressed(*TensorView::Host(data.data(), {4096}), codec.get(), nullptr, 1, 5)
              ->Wait());
      // A tensor of another shape under another tag.
      return comm.SendCompressed(*TensorView::Host(data.data(), {64, 64}), codec.get(), nullptr, 1, 6)
          ->Wait();
    }
    std::vector<float> got(4096, 0.0f);
    LBCC_RETURN_IF_ERROR(comm.RecvCompressed(*TensorView::Host(got.data(), {4096}), 0, 5)->Wait());
    const std::vector<float> sent = DeltaOf(0, 3, 4096);
    float absmax = 0, worst = 0;
    for (size_t i = 0; i < sent.size(); ++i) {
      absmax = std::max(absmax, std::fabs(sent[i]));
      worst = std::max(worst, std::fabs(sent[i] - got[i]));
    }
    if (worst > absmax / 127.0f) return absl::InternalError(absl::StrCat("int8 error ", worst));
    std::vector<float> other(4096, 3.0f);
    absl::Status mismatch = comm.RecvCompressed(*TensorView::Host(other.data(), {4096}), 0, 6)->Wait();
    if (mismatch.code() != absl::StatusCode::kInvalidArgument) {
      return absl::InternalError(absl::StrCat("shape mismatch gave ", mismatch.ToString()));
    }
    for (float x : other) {
      if (x != 3.0f) return absl::InternalError("output written on a mismatch");
    }
    return absl::OkStatus();
  });
  EXPECT_THAT(statuses, Each(IsOk()));
}

}  // namespace
}  // namespace lbcc::comm
