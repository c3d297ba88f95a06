// Dense collectives: every op x type against a reference computed here, 4 ranks as threads over
// loopback; layouts (all-to-all, gather, scatter, all-gather), point-to-point, and bad input.
#include "comm/dense_collectives.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/dtype.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "comm/communicator.h"
#include "comm/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using ::lbcc::comm::testing::RankOptions;
using ::lbcc::comm::testing::RunRanks;
using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::Each;
using ::testing::HasSubstr;

constexpr int kRanks = 4;

// Small values (1..3, or 0/1 for bool) so every reduction is exact in every type and order.
double ValueOf(int rank, size_t i, DenseType type) {
  if (type == DenseType::kBool) return ((rank + i) % 3) == 0 ? 1 : 0;
  return static_cast<double>((rank * 7 + i * 3) % 3 + 1);
}

void Store(void* data, size_t i, DenseType type, double v) {
  switch (type) {
    case DenseType::kF32: static_cast<float*>(data)[i] = static_cast<float>(v); return;
    case DenseType::kF64: static_cast<double*>(data)[i] = v; return;
    case DenseType::kF16: static_cast<uint16_t*>(data)[i] = F32ToF16(static_cast<float>(v)); return;
    case DenseType::kBF16: static_cast<uint16_t*>(data)[i] = F32ToBf16(static_cast<float>(v)); return;
    case DenseType::kI8: static_cast<int8_t*>(data)[i] = static_cast<int8_t>(v); return;
    case DenseType::kU8: static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v); return;
    case DenseType::kI16: static_cast<int16_t*>(data)[i] = static_cast<int16_t>(v); return;
    case DenseType::kI32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v); return;
    case DenseType::kI64: static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v); return;
    case DenseType::kBool: static_cast<uint8_t*>(data)[i] = v != 0; return;
  }
}

double Load(const void* data, size_t i, DenseType type) {
  switch (type) {
    case DenseType::kF32: return static_cast<const float*>(data)[i];
    case DenseType::kF64: return static_cast<const double*>(data)[i];
    case DenseType::kF16: return F16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DenseType::kBF16: return Bf16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DenseType::kI8: return static_cast<const int8_t*>(data)[i];
    case DenseType::kU8: return static_cast<const uint8_t*>(data)[i];
    case DenseType::kI16: return static_cast<const int16_t*>(data)[i];
    case DenseType::kI32: return static_cast<const int32_t*>(data)[i];
    case DenseType::kI64: return static_cast<const int64_t*>(data)[i];
    case DenseType::kBool: return static_cast<const uint8_t*>(data)[i];
  }
  return 0;
}

double Reference(size_t i, DenseType type, DenseOp op) {
  const bool boolean = type == DenseType::kBool;
  int64_t acc = static_cast<int64_t>(ValueOf(0, i, type));
  double sum = ValueOf(0, i, type);
  for (int r = 1; r < kRanks; ++r) {
    const int64_t v = static_cast<int64_t>(ValueOf(r, i, type));
    switch (op) {
      case DenseOp::kSum:
      case DenseOp::kAvg: acc = boolean ? (acc || v) : acc + v; break;
      case DenseOp::kProduct: acc = boolean ? (acc && v) : acc * v; break;
      case DenseOp::kMin: acc = std::min(acc, v); break;
      case DenseOp::kMax: acc = std::max(acc, v); break;
      case DenseOp::kBand: acc &= v; break;
      case DenseOp::kBor: acc |= v; break;
      case DenseOp::kBxor: acc ^= v; break;
    }
    sum += v;
  }
  if (op == DenseOp::kAvg) return sum / kRanks;
  return static_cast<double>(acc);
}

std::vector<uint8_t> Filled(int rank, size_t count, DenseType type, size_t offset = 0) {
  std::vector<uint8_t> data(count * DenseTypeSize(type));
  for (size_t i = 0; i < count; ++i) Store(data.data(), i, type, ValueOf(rank, offset + i, type));
  return data;
}

absl::Status Expect(const void* data, size_t count, DenseType type, DenseOp op, size_t offset,
                    absl::string_view what) {
  for (size_t i = 0; i < count; ++i) {
    const double want = Reference(offset + i, type, op);
    if (Load(data, i, type) != want) {
      return absl::InternalError(absl::StrCat(what, " ", DenseTypeName(type), " ",
                                              DenseOpName(op), ": element ", i, " is ",
                                              Load(data, i, type), ", expected ", want));
    }
  }
  return absl::OkStatus();
}

constexpr DenseOp kOps[] = {DenseOp::kSum, DenseOp::kAvg, DenseOp::kProduct, DenseOp::kMin,
                            DenseOp::kMax, DenseOp::kBand, DenseOp::kBor, DenseOp::kBxor};

class DenseReductionTest : public ::testing::TestWithParam<DenseType> {};

TEST_P(DenseReductionTest, EveryOpMatchesTheReference) {
  const DenseType type = GetParam();
  auto results = RunRanks(kRanks, RankOptions(), [type](int rank, Communicator& comm) {
    for (DenseOp op : kOps) {
      if (!CheckDenseOp(type, op).ok()) continue;
      for (size_t count : {size_t{1}, size_t{3}, size_t{37}}) {
        const size_t bytes = count * DenseTypeSize(type);
        // All-reduce, in place.
        std::vector<uint8_t> data = Filled(rank, count, type);
        LBCC_RETURN_IF_ERROR(
            comm.DenseAllReduce(data.data(), data.data(), count, type, op)->Wait());
        LBCC_RETURN_IF_ERROR(Expect(data.data(), count, type, op, 0, "allreduce"));
        // Reduce to rank 1 (verified).
        std::vector<uint8_t> in = Filled(rank, count, type);
        std::vector<uint8_t> out(bytes);
        DenseOptions verify;
        verify.verify = true;
        LBCC_RETURN_IF_ERROR(
            comm.DenseReduce(in.data(), out.data(), count, type, op, 1, verify)->Wait());
        if (rank == 1) LBCC_RETURN_IF_ERROR(Expect(out.data(), count, type, op, 0, "reduce"));
        // Reduce-scatter: rank r gets block r of kRanks blocks.
        std::vector<uint8_t> blocks = Filled(rank, count * kRanks, type);
        LBCC_RETURN_IF_ERROR(
            comm.DenseReduceScatter(blocks.data(), out.data(), count, type, op)->Wait());
        LBCC_RETURN_IF_ERROR(
            Expect(out.data(), count, type, op, rank * count, "reduce_scatter"));
      }
    }
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DenseReductionTest,
                         ::testing::Values(DenseType::kF32, DenseType::kF16, DenseType::kBF16,
                                           DenseType::kF64, DenseType::kI8, DenseType::kU8,
                                           DenseType::kI16, DenseType::kI32, DenseType::kI64,
                                           DenseType::kBool),
                         [](const auto& info) { return std::string(DenseTypeName(info.param)); });

// DenseCombine element by element against a scalar reference, over lengths that cover its
// vectorized blocks and their scalar tail, values that overflow (integers wrap), and NaNs and
// signed zeros in min/max (NaN wins; on a tie the destination's value stays).
template <typename T, bool = std::is_integral_v<T>>
struct Wide {  // the type integers are added and multiplied in (unsigned: they wrap)
  using type = T;
};
template <typename T>
struct Wide<T, true> {
  using type = std::make_unsigned_t<T>;
};

template <typename T>
T ReferenceCombine(T a, T b, DenseOp op) {
  if constexpr (std::is_floating_point_v<T>) {
    if ((op == DenseOp::kMin || op == DenseOp::kMax) && (std::isnan(a) || std::isnan(b))) {
      return std::isnan(a) ? a : b;
    }
  }
  using W = typename Wide<T>::type;
  switch (op) {
    case DenseOp::kSum:
    case DenseOp::kAvg: return static_cast<T>(static_cast<W>(a) + static_cast<W>(b));
    case DenseOp::kProduct: return static_cast<T>(static_cast<W>(a) * static_cast<W>(b));
    case DenseOp::kMin: return b < a ? b : a;
    case DenseOp::kMax: return b > a ? b : a;
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    if (op == DenseOp::kBand) return a & b;
    if (op == DenseOp::kBor) return a | b;
    return a ^ b;
  }
  return a;
}

template <typename T>
void CheckCombine(DenseType type) {
  for (DenseOp op : kOps) {
    if (!CheckDenseOp(type, op).ok()) continue;
    for (size_t count : {size_t{0}, size_t{5}, size_t{64}, size_t{203}}) {
      std::vector<T> dst(count), src(count), want(count);
      for (size_t i = 0; i < count; ++i) {
        if constexpr (std::is_floating_point_v<T>) {
          const T nan = std::numeric_limits<T>::quiet_NaN();
          const T values[] = {T(1.5), T(-2), T(0.0), T(-0.0), nan, T(3), T(1e30), T(-7.25)};
          dst[i] = values[i % 8];
          src[i] = values[(i * 3 + 1) % 8];
        } else {
          dst[i] = static_cast<T>(i * 37 + 11);  // wraps in the narrow types
          src[i] = static_cast<T>(std::numeric_limits<T>::max() - static_cast<T>(i * 5));
        }
        want[i] = ReferenceCombine(dst[i], src[i], op);
      }
      DenseCombine(dst.data(), src.data(), count, type, op);
      EXPECT_EQ(std::memcmp(dst.data(), want.data(), count * sizeof(T)), 0)
          << DenseTypeName(type) << " " << DenseOpName(op) << " count " << count;
    }
  }
}

TEST(DenseCombineTest, EveryOpMatchesTheScalarLoopBitForBit) {
  CheckCombine<float>(DenseType::kF32);
  CheckCombine<double>(DenseType::kF64);
  CheckCombine<int8_t>(DenseType::kI8);
  CheckCombine<uint8_t>(DenseType::kU8);
  CheckCombine<int16_t>(DenseType::kI16);
  CheckCombine<int32_t>(DenseType::kI32);
  CheckCombine<int64_t>(DenseType::kI64);
}

TEST(DenseCollectivesTest, LayoutsMoveEveryByte) {
  auto results = RunRanks(kRanks, RankOptions(), [](int rank, Communicator& comm) {
    // All-to-all with uneven sizes: rank r sends r + j + 1 bytes to rank j.
    AllToAllLayout layout;
    size_t send_total = 0, recv_total = 0;
    for (int j = 0; j < kRanks; ++j) {
      layout.send_offsets.push_back(send_total);
      layout.send_bytes.push_back(rank + j + 1);
      send_total += rank + j + 1;
      layout.recv_offsets.push_back(recv_total);
      layout.recv_bytes.push_back(j + rank + 1);
      recv_total += j + rank + 1;
    }
    std::vector<uint8_t> in(send_total), out(recv_total);
    for (int j = 0; j < kRanks; ++j) {
      for (size_t b = 0; b < layout.send_bytes[j]; ++b) {
        in[layout.send_offsets[j] + b] = static_cast<uint8_t>(rank * 16 + j);
      }
    }
    LBCC_RETURN_IF_ERROR(comm.DenseAllToAll(in.data(), out.data(), layout)->Wait());
    for (int i = 0; i < kRanks; ++i) {
      for (size_t b = 0; b < layout.recv_bytes[i]; ++b) {
        if (out[layout.recv_offsets[i] + b] != i * 16 + rank) {
          return absl::InternalError(absl::StrCat("alltoall: wrong byte from ", i));
        }
      }
    }
    // Gather to 2, scatter from 3, all-gather, broadcast from 1: 5 bytes each.
    const std::vector<uint8_t> mine(5, static_cast<uint8_t>(rank + 1));
    std::vector<uint8_t> all(5 * kRanks, 0), one(5, 0);
    LBCC_RETURN_IF_ERROR(comm.DenseGather(mine.data(), all.data(), 5, 2)->Wait());
    if (rank == 2) {
      for (int i = 0; i < 5 * kRanks; ++i) {
        if (all[i] != i / 5 + 1) return absl::InternalError("gather: wrong byte");
      }
    }
    std::vector<uint8_t> source(5 * kRanks);
    for (int i = 0; i < 5 * kRanks; ++i) source[i] = static_cast<uint8_t>(100 + i / 5);
    LBCC_RETURN_IF_ERROR(comm.DenseScatter(source.data(), one.data(), 5, 3)->Wait());
    if (one != std::vector<uint8_t>(5, 100 + rank)) return absl::InternalError("scatter");
    std::fill(all.begin(), all.end(), 0);
    LBCC_RETURN_IF_ERROR(comm.DenseAllGather(mine.data(), all.data(), 5)->Wait());
    for (int i = 0; i < 5 * kRanks; ++i) {
      if (all[i] != i / 5 + 1) return absl::InternalError("allgather: wrong byte");
    }
    std::vector<uint8_t> shared = mine;
    LBCC_RETURN_IF_ERROR(comm.DenseBroadcast(shared.data(), 5, 1)->Wait());
    if (shared != std::vector<uint8_t>(5, 2)) return absl::InternalError("broadcast");
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

// Over slow links, buffers whose ring chunks are larger than kRingSegmentBytes and of unequal
// sizes travel as several pipelined segments per step (the reduce-scatter and all-gather in one
// pass); every element still gets every rank's contribution exactly once. Over fast links (the
// second round) each chunk goes whole.
class PipelinedRingTest : public ::testing::TestWithParam<bool> {};

TEST_P(PipelinedRingTest, SegmentsCoverEveryElement) {
  RankOptions options;
  if (GetParam()) options.topology = *Topology::FromJson(R"({"nranks": 4})");  // all slow
  auto results = RunRanks(kRanks, options, [](int rank, Communicator& comm) {
    const size_t count = 3 * kRingSegmentBytes / sizeof(float) + 5;  // 3 segments per chunk
    for (DenseOp op : {DenseOp::kSum, DenseOp::kAvg}) {
      std::vector<uint8_t> data = Filled(rank, count, DenseType::kF32);
      LBCC_RETURN_IF_ERROR(
          comm.DenseAllReduce(data.data(), data.data(), count, DenseType::kF32, op)->Wait());
      LBCC_RETURN_IF_ERROR(Expect(data.data(), count, DenseType::kF32, op, 0, "allreduce"));
    }
    const size_t bytes = 2 * kRingSegmentBytes + 3;  // int8: elements are bytes
    std::vector<uint8_t> data = Filled(rank, bytes, DenseType::kI8);
    LBCC_RETURN_IF_ERROR(comm.DenseAllReduce(data.data(), data.data(), bytes, DenseType::kI8,
                                             DenseOp::kBxor)
                             ->Wait());
    LBCC_RETURN_IF_ERROR(Expect(data.data(), bytes, DenseType::kI8, DenseOp::kBxor, 0, "bxor"));
    const size_t block = kRingSegmentBytes / sizeof(float) + 7;  // 2 segments per block
    std::vector<uint8_t> blocks = Filled(rank, block * kRanks, DenseType::kF32);
    std::vector<uint8_t> out(block * sizeof(float));
    LBCC_RETURN_IF_ERROR(comm.DenseReduceScatter(blocks.data(), out.data(), block,
                                                 DenseType::kF32, DenseOp::kMax)
                             ->Wait());
    LBCC_RETURN_IF_ERROR(
        Expect(out.data(), block, DenseType::kF32, DenseOp::kMax, rank * block, "reduce_scatter"));
    // The f32/f16/bf16 all-reduce of Communicator::AllReduce runs the same pipelined ring.
    std::vector<float> mean(count);
    for (size_t i = 0; i < count; ++i) mean[i] = static_cast<float>(ValueOf(rank, i, DenseType::kF32));
    LBCC_ASSIGN_OR_RETURN(TensorView view, TensorView::Host(mean.data(), {static_cast<int64_t>(count)}));
    LBCC_RETURN_IF_ERROR(comm.AllReduce(view, view, ReduceOp::kSum)->Wait());
    LBCC_RETURN_IF_ERROR(Expect(mean.data(), count, DenseType::kF32, DenseOp::kSum, 0, "AllReduce"));
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

INSTANTIATE_TEST_SUITE_P(SlowAndFastLinks, PipelinedRingTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "slow" : "fast"; });

TEST(DenseCollectivesTest, PointToPointRing) {
  auto results = RunRanks(kRanks, RankOptions(), [](int rank, Communicator& comm) {
    const int right = (rank + 1) % kRanks, left = (rank + kRanks - 1) % kRanks;
    const std::vector<int64_t> mine(9, rank);
    std::vector<int64_t> got(9, -1);
    RequestPtr recv = comm.DenseRecv(got.data(), 9 * 8, left, 7);
    RequestPtr send = comm.DenseSend(mine.data(), 9 * 8, right, 7);
    LBCC_RETURN_IF_ERROR(send->Wait());
    LBCC_RETURN_IF_ERROR(recv->Wait());
    if (got != std::vector<int64_t>(9, left)) return absl::InternalError("p2p: wrong data");
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

// Ranks 1..3 each send two messages (rank, k) on one tag; rank 0 takes three with DenseRecvAny,
// then the rest with DenseRecv from each peer: every message arrives once, each source is named
// correctly, and each peer's messages arrive in its order (also those an any-source receive
// took ahead of time for a later DenseRecv).
TEST(DenseCollectivesTest, AnySourceReceiveNamesTheSourceAndKeepsEachPeersOrder) {
  auto results = RunRanks(kRanks, RankOptions(), [](int rank, Communicator& comm) {
    constexpr uint32_t kTag = 5;
    if (rank != 0) {
      int64_t messages[2][2] = {{rank, 0}, {rank, 1}};
      RequestPtr first = comm.DenseSend(messages[0], sizeof(messages[0]), 0, kTag);
      RequestPtr second = comm.DenseSend(messages[1], sizeof(messages[1]), 0, kTag);
      LBCC_RETURN_IF_ERROR(first->Wait());
      LBCC_RETURN_IF_ERROR(second->Wait());
      // A message of another size fails the any-source receive with DataLoss.
      int32_t odd = rank;
      if (rank == 2) LBCC_RETURN_IF_ERROR(comm.DenseSend(&odd, sizeof(odd), 0, kTag + 1)->Wait());
      return absl::OkStatus();
    }
    std::vector<int> next(kRanks, 0);  // next k expected from each peer
    for (int i = 0; i < 3; ++i) {
      int64_t got[2] = {-1, -1};
      int source = -1;
      LBCC_RETURN_IF_ERROR(comm.DenseRecvAny(got, sizeof(got), kTag, &source)->Wait());
      if (source < 1 || source >= kRanks || got[0] != source || got[1] != next[source]) {
        return absl::InternalError(absl::StrCat("any-source receive ", i, ": source ", source,
                                                " got (", got[0], ", ", got[1], ")"));
      }
      ++next[source];
    }
    for (int peer = 1; peer < kRanks; ++peer) {
      while (next[peer] < 2) {
        int64_t got[2] = {-1, -1};
        LBCC_RETURN_IF_ERROR(comm.DenseRecv(got, sizeof(got), peer, kTag)->Wait());
        if (got[0] != peer || got[1] != next[peer]) {
          return absl::InternalError(absl::StrCat("receive from ", peer, " got (", got[0], ", ",
                                                  got[1], "), expected k ", next[peer]));
        }
        ++next[peer];
      }
    }
    int64_t wide = 0;
    int source = -1;
    absl::Status mismatch = comm.DenseRecvAny(&wide, sizeof(wide), kTag + 1, &source)->Wait();
    if (mismatch.code() != absl::StatusCode::kDataLoss) {
      return absl::InternalError(absl::StrCat("size mismatch gave ", mismatch.ToString()));
    }
    int dummy = 0;
    if (comm.DenseRecvAny(&wide, sizeof(wide), kTag, nullptr)->status().code() !=
            absl::StatusCode::kInvalidArgument ||
        comm.DenseRecvAny(nullptr, 8, kTag, &dummy)->status().code() !=
            absl::StatusCode::kInvalidArgument) {
      return absl::InternalError("bad arguments not refused");
    }
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

TEST(DenseCollectivesTest, BadInputIsRejectedAtPost) {
  auto results = RunRanks(2, RankOptions(), [](int rank, Communicator& comm) {
    float x[4] = {};
    EXPECT_THAT(comm.DenseAllReduce(x, x, 4, DenseType::kF32, DenseOp::kBxor)->Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bxor")));
    int32_t i[4] = {};
    EXPECT_THAT(comm.DenseAllReduce(i, i, 4, DenseType::kI32, DenseOp::kAvg)->Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int32")));
    EXPECT_THAT(comm.DenseReduce(x, x, 4, DenseType::kF32, DenseOp::kSum, 5)->Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("root 5")));
    EXPECT_THAT(comm.DenseSend(x, 16, rank, 0)->Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("peer")));
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

TEST(DenseCollectivesTest, VerifyNamesTheDisagreeingRankAndKeepsTheCommunicator) {
  auto results = RunRanks(kRanks, RankOptions(), [](int rank, Communicator& comm) {
    std::vector<float> data(rank == 2 ? 5 : 4, 1.0f);
    DenseOptions verify;
    verify.verify = true;
    absl::Status status = comm.DenseAllReduce(data.data(), data.data(), data.size(),
                                              DenseType::kF32, DenseOp::kSum, verify)
                              ->Wait();
    // The signature check (comm/signature.h) runs first, always, and names the field.
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition,
                                 HasSubstr("rank 0 and rank 2 disagree on op 0's count: 4 vs 5")));
    // Still usable: nothing was aborted.
    std::vector<float> ok(4, 1.0f);
    LBCC_RETURN_IF_ERROR(
        comm.DenseAllReduce(ok.data(), ok.data(), 4, DenseType::kF32, DenseOp::kSum)->Wait());
    if (ok != std::vector<float>(4, 4.0f)) return absl::InternalError("after verify: wrong sum");
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

TEST(DenseCollectivesTest, UnverifiedSizeMismatchFailsEveryRank) {
  // Without verify too: every rank fails, naming the two ranks and the field.
  auto results = RunRanks(kRanks, RankOptions(), [](int rank, Communicator& comm) {
    std::vector<float> data(rank == 0 ? 8 : 12, 1.0f);
    return comm.DenseAllReduce(data.data(), data.data(), data.size(), DenseType::kF32,
                               DenseOp::kSum)
        ->Wait();
  });
  for (const absl::Status& status : results) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition,
                                 HasSubstr("rank 0 and rank 1 disagree on op 0's count: 8 vs 12")));
  }
}

// DenseAllReduce takes its algorithm from ChooseAlgorithm: a forced ring on a small buffer and a
// forced direct one on a buffer beyond the header's data (no header in its round) both reduce
// correctly; ranks that choose differently fail together, naming the algorithm.
TEST(DenseCollectivesTest, AllReduceAlgorithmComesFromTheSelection) {
  auto results = RunRanks(kRanks, RankOptions(), [](int rank, Communicator& comm) {
    for (auto [algorithm, count] : {std::pair{Algorithm::kRing, size_t{37}},
                                    std::pair{Algorithm::kDirect, size_t{40000}},
                                    std::pair{Algorithm::kAuto, size_t{40000}}}) {
      std::vector<uint8_t> data = Filled(rank, count, DenseType::kI32);
      DenseOptions options;
      options.algorithm = algorithm;
      LBCC_RETURN_IF_ERROR(comm.DenseAllReduce(data.data(), data.data(), count, DenseType::kI32,
                                               DenseOp::kSum, options)
                               ->Wait());
      LBCC_RETURN_IF_ERROR(Expect(data.data(), count, DenseType::kI32, DenseOp::kSum, 0,
                                  AlgorithmName(algorithm)));
    }
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
  auto mixed = RunRanks(kRanks, RankOptions(), [](int rank, Communicator& comm) {
    std::vector<float> data(40000, 1.0f);  // beyond the header's data: both post a header round
    DenseOptions options;
    options.algorithm = rank == 2 ? Algorithm::kDirect : Algorithm::kRing;
    return comm.DenseAllReduce(data.data(), data.data(), data.size(), DenseType::kF32,
                               DenseOp::kSum, options)
        ->Wait();
  });
  for (const absl::Status& status : mixed) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("algorithm")));
  }
}

// The same on a buffer small enough for the header's data: the direct rank carries the header
// inside its one data round, the ring ranks send it alone; they still meet at the header's tag
// and fail together, naming the algorithm, well before the operation's timeout.
TEST(DenseCollectivesTest, RanksChoosingDifferentAlgorithmsOnASmallBufferFailTogether) {
  for (const char* backend : {"loopback", "ucx"}) {
    RankOptions rank_options;
    rank_options.backend = backend;
    auto mixed = RunRanks(kRanks, rank_options, [](int rank, Communicator& comm) {
      std::vector<float> data(37, 1.0f);  // within the header's data: the direct rank's one round
      DenseOptions options;
      options.algorithm = rank == 2 ? Algorithm::kDirect : Algorithm::kRing;
      return comm.DenseAllReduce(data.data(), data.data(), data.size(), DenseType::kF32,
                                 DenseOp::kSum, options)
          ->Wait();
    });
    for (const absl::Status& status : mixed) {
      EXPECT_THAT(status,
                  StatusIs(absl::StatusCode::kFailedPrecondition,
                           HasSubstr("rank 0 and rank 2 disagree on op 0's algorithm: ring vs direct")))
          << backend;
    }
  }
}

}  // namespace
}  // namespace lbcc::comm
