// Dense collectives: every op x type against a reference computed here, 4 ranks as threads over
// loopback; layouts (all-to-all, gather, scatter, all-gather), point-to-point, and bad input.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/dtype.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "comm/collectives.h"
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
double ValueOf(int rank, size_t i, DType type) {
  if (type == DType::kBool) return ((rank + i) % 3) == 0 ? 1 : 0;
  return static_cast<double>((rank * 7 + i * 3) % 3 + 1);
}

void Store(void* data, size_t i, DType type, double v) {
  switch (type) {
    case DType::kF32: static_cast<float*>(data)[i] = static_cast<float>(v); return;
    case DType::kF64: static_cast<double*>(data)[i] = v; return;
    case DType::kF16: static_cast<uint16_t*>(data)[i] = F32ToF16(static_cast<float>(v)); return;
    case DType::kBF16: static_cast<uint16_t*>(data)[i] = F32ToBf16(static_cast<float>(v)); return;
    case DType::kI8: static_cast<int8_t*>(data)[i] = static_cast<int8_t>(v); return;
    case DType::kU8: static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v); return;
    case DType::kI16: static_cast<int16_t*>(data)[i] = static_cast<int16_t>(v); return;
    case DType::kI32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v); return;
    case DType::kI64: static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v); return;
    case DType::kBool: static_cast<uint8_t*>(data)[i] = v != 0; return;
  }
}

double Load(const void* data, size_t i, DType type) {
  switch (type) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF64: return static_cast<const double*>(data)[i];
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return Bf16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kI8: return static_cast<const int8_t*>(data)[i];
    case DType::kU8: return static_cast<const uint8_t*>(data)[i];
    case DType::kI16: return static_cast<const int16_t*>(data)[i];
    case DType::kI32: return static_cast<const int32_t*>(data)[i];
    case DType::kI64: return static_cast<const int64_t*>(data)[i];
    case DType::kBool: return static_cast<const uint8_t*>(data)[i];
  }
  return 0;
}

double Reference(size_t i, DType type, ReduceOp op) {
  const bool boolean = type == DType::kBool;
  int64_t acc = static_cast<int64_t>(ValueOf(0, i, type));
  double sum = ValueOf(0, i, type);
  for (int r = 1; r < kRanks; ++r) {
    const int64_t v = static_cast<int64_t>(ValueOf(r, i, type));
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc = boolean ? (acc || v) : acc + v; break;
      case ReduceOp::kProduct: acc = boolean ? (acc && v) : acc * v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kBand: acc &= v; break;
      case ReduceOp::kBor: acc |= v; break;
      case ReduceOp::kBxor: acc ^= v; break;
    }
    sum += v;
  }
  if (op == ReduceOp::kAvg) return sum / kRanks;
  return static_cast<double>(acc);
}

std::vector<uint8_t> Filled(int rank, size_t count, DType type, size_t offset = 0) {
  std::vector<uint8_t> data(count * DTypeSize(type));
  for (size_t i = 0; i < count; ++i) Store(data.data(), i, type, ValueOf(rank, offset + i, type));
  return data;
}

absl::Status Expect(const void* data, size_t count, DType type, ReduceOp op, size_t offset,
                    absl::string_view what) {
  for (size_t i = 0; i < count; ++i) {
    const double want = Reference(offset + i, type, op);
    if (Load(data, i, type) != want) {
      return absl::InternalError(absl::StrCat(what, " ", TorchDTypeName(type), " ",
                                              ReduceOpName(op), ": element ", i, " is ",
                                              Load(data, i, type), ", expected ", want));
    }
  }
  return absl::OkStatus();
}

constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg,  ReduceOp::kProduct, ReduceOp::kMin,
                             ReduceOp::kMax, ReduceOp::kBand, ReduceOp::kBor,     ReduceOp::kBxor};

class DenseReductionTest : public ::testing::TestWithParam<DType> {};

TEST_P(DenseReductionTest, EveryOpMatchesTheReference) {
  const DType type = GetParam();
  auto results = RunRanks(kRanks, RankOptions(), [type](int rank, Communicator& comm) {
    for (ReduceOp op : kOps) {
      if (!CheckReduceOp(type, op).ok()) continue;
      for (size_t count : {size_t{1}, size_t{3}, size_t{37}}) {
        const size_t bytes = count * DTypeSize(type);
        // All-reduce, in place.
        std::vector<uint8_t> data = Filled(rank, count, type);
        LBCC_RETURN_IF_ERROR(comm.AllReduce(data.data(), data.data(), count, type, op)->Wait());
        LBCC_RETURN_IF_ERROR(Expect(data.data(), count, type, op, 0, "allreduce"));
        // Reduce to rank 1 (verified).
        std::vector<uint8_t> in = Filled(rank, count, type);
        std::vector<uint8_t> out(bytes);
        OpOptions verify;
        verify.verify = true;
        LBCC_RETURN_IF_ERROR(
            comm.Reduce(in.data(), out.data(), count, type, op, 1, verify)->Wait());
        if (rank == 1) LBCC_RETURN_IF_ERROR(Expect(out.data(), count, type, op, 0, "reduce"));
        // Reduce-scatter: rank r gets block r of kRanks blocks.
        std::vector<uint8_t> blocks = Filled(rank, count * kRanks, type);
        LBCC_RETURN_IF_ERROR(
            comm.ReduceScatter(blocks.data(), out.data(), count, type, op)->Wait());
        LBCC_RETURN_IF_ERROR(
            Expect(out.data(), count, type, op, rank * count, "reduce_scatter"));
      }
    }
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DenseReductionTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kF64,
                                           DType::kI8, DType::kU8, DType::kI16, DType::kI32,
                                           DType::kI64, DType::kBool),
                         [](const auto& info) { return std::string(TorchDTypeName(info.param)); });

// ReduceCombine element by element against a scalar reference, over lengths that cover its
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
T ReferenceCombine(T a, T b, ReduceOp op) {
  if constexpr (std::is_floating_point_v<T>) {
    if ((op == ReduceOp::kMin || op == ReduceOp::kMax) && (std::isnan(a) || std::isnan(b))) {
      return std::isnan(a) ? a : b;
    }
  }
  using W = typename Wide<T>::type;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return static_cast<T>(static_cast<W>(a) + static_cast<W>(b));
    case ReduceOp::kProduct: return static_cast<T>(static_cast<W>(a) * static_cast<W>(b));
    case ReduceOp::kMin: return b < a ? b : a;
    case ReduceOp::kMax: return b > a ? b : a;
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    if (op == ReduceOp::kBand) return a & b;
    if (op == ReduceOp::kBor) return a | b;
    return a ^ b;
  }
  return a;
}

template <typename T>
void CheckCombine(DType type) {
  for (ReduceOp op : kOps) {
    if (!CheckReduceOp(type, op).ok()) continue;
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
      ReduceCombine(dst.data(), src.data(), count, type, op);
      EXPECT_EQ(std::memcmp(dst.data(), want.data(), count * sizeof(T)), 0)
          << TorchDTypeName(type) << " " << ReduceOpName(op) << " count " << count;
    }
  }
}

TEST(DenseCombineTest, EveryOpMatchesTheScalarLoopBitForBit) {
  CheckCombine<float>(DType::kF32);
  CheckCombine<double>(DType::kF64);
  CheckCombine<int8_t>(DType::kI8);
  CheckCombine<uint8_t>(DType::kU8);
  CheckCombine<int16_t>(DType::kI16);
  CheckCombine<int32_t>(DType::kI32);
  CheckCombine<int64_t>(DType::kI64);
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
    LBCC_RETURN_IF_ERROR(comm.AllToAll(in.data(), out.data(), layout)->Wait());
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
    LBCC_RETURN_IF_ERROR(comm.Gather(mine.data(), all.data(), 5, 2)->Wait());
    if (rank == 2) {
      for (int i = 0; i < 5 * kRanks; ++i) {
        if (all[i] != i / 5 + 1) return absl::InternalError("gather: wrong byte");
      }
    }
    std::vector<uint8_t> source(5 * kRanks);
    for (int i = 0; i < 5 * kRanks; ++i) source[i] = static_cast<uint8_t>(100 + i / 5);
    LBCC_RETURN_IF_ERROR(comm.Scatter(source.data(), one.data(), 5, 3)->Wait());
    if (one != std::vector<uint8_t>(5, 100 + rank)) return absl::InternalError("scatter");
    std::fill(all.begin(), all.end(), 0);
    LBCC_RETURN_IF_ERROR(comm.AllGather(mine.data(), all.data(), 5)->Wait());
    for (int i = 0; i < 5 * kRanks; ++i) {
      if (all[i] != i / 5 + 1) return absl::InternalError("allgather: wrong byte");
    }
    std::vector<uint8_t> shared = mine;
    LBCC_RETURN_IF_ERROR(comm.Broadcast(shared.data(), 5, 1)->Wait());
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
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      std::vector<uint8_t> data = Filled(rank, count, DType::kF32);
      LBCC_RETURN_IF_ERROR(
          comm.AllReduce(data.data(), data.data(), count, DType::kF32, op)->Wait());
      LBCC_RETURN_IF_ERROR(Expect(data.data(), count, DType::kF32, op, 0, "allreduce"));
    }
    const size_t bytes = 2 * kRingSegmentBytes + 3;  // int8: elements are bytes
    std::vector<uint8_t> data = Filled(rank, bytes, DType::kI8);
    LBCC_RETURN_IF_ERROR(
        comm.AllReduce(data.data(), data.data(), bytes, DType::kI8, ReduceOp::kBxor)->Wait());
    LBCC_RETURN_IF_ERROR(Expect(data.data(), bytes, DType::kI8, ReduceOp::kBxor, 0, "bxor"));
    const size_t block = kRingSegmentBytes / sizeof(float) + 7;  // 2 segments per block
    std::vector<uint8_t> blocks = Filled(rank, block * kRanks, DType::kF32);
    std::vector<uint8_t> out(block * sizeof(float));
    LBCC_RETURN_IF_ERROR(
        comm.ReduceScatter(blocks.data(), out.data(), block, DType::kF32, ReduceOp::kMax)->Wait());
    LBCC_RETURN_IF_ERROR(
        Expect(out.data(), block, DType::kF32, ReduceOp::kMax, rank * block, "reduce_scatter"));
    // The f32/f16/bf16 all-reduce of Communicator::AllReduce runs the same pipelined ring.
    std::vector<float> mean(count);
    for (size_t i = 0; i < count; ++i) mean[i] = static_cast<float>(ValueOf(rank, i, DType::kF32));
    LBCC_ASSIGN_OR_RETURN(TensorView view, TensorView::Host(mean.data(), {static_cast<int64_t>(count)}));
    LBCC_RETURN_IF_ERROR(comm.AllReduce(view, view, ReduceOp::kSum)->Wait());
    LBCC_RETURN_IF_ERROR(Expect(mean.data(), count, DType::kF32, ReduceOp::kSum, 0, "AllReduce"));
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
    RequestPtr recv = comm.Recv(got.data(), 9 * 8, left, 7);
    RequestPtr send = comm.Send(mine.data(), 9 * 8, right, 7);
    LBCC_RETURN_IF_ERROR(send->Wait());
    LBCC_RETURN_IF_ERROR(recv->Wait());
    if (got != std::vector<int64_t>(9, left)) return absl::InternalError("p2p: wrong data");
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

// Ranks 1..3 each send two messages (rank, k) on one tag; rank 0 takes three with RecvAny,
// then the rest with Recv from each peer: every message arrives once, each source is named
// correctly, and each peer's messages arrive in its order (also those an any-source receive
// took ahead of time for a later Recv).
TEST(DenseCollectivesTest, AnySourceReceiveNamesTheSourceAndKeepsEachPeersOrder) {
  auto results = RunRanks(kRanks, RankOptions(), [](int rank, Communicator& comm) {
    constexpr uint32_t kTag = 5;
    if (rank != 0) {
      int64_t messages[2][2] = {{rank, 0}, {rank, 1}};
      RequestPtr first = comm.Send(messages[0], sizeof(messages[0]), 0, kTag);
      RequestPtr second = comm.Send(messages[1], sizeof(messages[1]), 0, kTag);
      LBCC_RETURN_IF_ERROR(first->Wait());
      LBCC_RETURN_IF_ERROR(second->Wait());
      // A message of another size fails the any-source receive with DataLoss.
      int32_t odd = rank;
      if (rank == 2) LBCC_RETURN_IF_ERROR(comm.Send(&odd, sizeof(odd), 0, kTag + 1)->Wait());
      return absl::OkStatus();
    }
    std::vector<int> next(kRanks, 0);  // next k expected from each peer
    for (int i = 0; i < 3; ++i) {
      int64_t got[2] = {-1, -1};
      int source = -1;
      LBCC_RETURN_IF_ERROR(comm.RecvAny(got, sizeof(got), kTag, &source)->Wait());
      if (source < 1 || source >= kRanks || got[0] != source || got[1] != next[source]) {
        return absl::InternalError(absl::StrCat("any-source receive ", i, ": source ", source,
                                                " got (", got[0], ", ", got[1], ")"));
      }
      ++next[source];
    }
    for (int peer = 1; peer < kRanks; ++peer) {
      while (next[peer] < 2) {
        int64_t got[2] = {-1, -1};
        LBCC_RETURN_IF_ERROR(comm.Recv(got, sizeof(got), peer, kTag)->Wait());
        if (got[0] != peer || got[1] != next[peer]) {
          return absl::InternalError(absl::StrCat("receive from ", peer, " got (", got[0], ", ",
                                                  got[1], "), expected k ", next[peer]));
        }
        ++next[peer];
      }
    }
    int64_t wide = 0;
    int source = -1;
    absl::Status mismatch = comm.RecvAny(&wide, sizeof(wide), kTag + 1, &source)->Wait();
    if (mismatch.code() != absl::StatusCode::kDataLoss) {
      return absl::InternalError(absl::StrCat("size mismatch gave ", mismatch.ToString()));
    }
    int dummy = 0;
    if (comm.RecvAny(&wide, sizeof(wide), kTag, nullptr)->status().code() !=
            absl::StatusCode::kInvalidArgument ||
        comm.RecvAny(nullptr, 8, kTag, &dummy)->status().code() !=
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
    EXPECT_THAT(comm.AllReduce(x, x, 4, DType::kF32, ReduceOp::kBxor)->Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bxor")));
    int32_t i[4] = {};
    EXPECT_THAT(comm.AllReduce(i, i, 4, DType::kI32, ReduceOp::kAvg)->Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int32")));
    EXPECT_THAT(comm.Reduce(x, x, 4, DType::kF32, ReduceOp::kSum, 5)->Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("root 5")));
    EXPECT_THAT(comm.Send(x, 16, rank, 0)->Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("peer")));
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

TEST(DenseCollectivesTest, VerifyNamesTheDisagreeingRankAndKeepsTheCommunicator) {
  auto results = RunRanks(kRanks, RankOptions(), [](int rank, Communicator& comm) {
    std::vector<float> data(rank == 2 ? 5 : 4, 1.0f);
    OpOptions verify;
    verify.verify = true;
    absl::Status status =
        comm.AllReduce(data.data(), data.data(), data.size(), DType::kF32, ReduceOp::kSum, verify)
            ->Wait();
    // The signature check (comm/signature.h) runs first, always, and names the field.
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition,
                                 HasSubstr("rank 0 and rank 2 disagree on op 0's count: 4 vs 5")));
    // Still usable: nothing was aborted.
    std::vector<float> ok(4, 1.0f);
    LBCC_RETURN_IF_ERROR(
        comm.AllReduce(ok.data(), ok.data(), 4, DType::kF32, ReduceOp::kSum)->Wait());
    if (ok != std::vector<float>(4, 4.0f)) return absl::InternalError("after verify: wrong sum");
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

TEST(DenseCollectivesTest, UnverifiedSizeMismatchFailsEveryRank) {
  // Without verify too: every rank fails, naming the two ranks and the field.
  auto results = RunRanks(kRanks, RankOptions(), [](int rank, Communicator& comm) {
    std::vector<float> data(rank == 0 ? 8 : 12, 1.0f);
    return comm.AllReduce(data.data(), data.data(), data.size(), DType::kF32, ReduceOp::kSum)
        ->Wait();
  });
  for (const absl::Status& status : results) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition,
                                 HasSubstr("rank 0 and rank 1 disagree on op 0's count: 8 vs 12")));
  }
}

// AllReduce takes its algorithm from ChooseAlgorithm: a forced ring on a small buffer and a
// forced direct one on a buffer beyond the header's data (no header in its round) both reduce
// correctly; ranks that choose differently fail together, naming the algorithm.
TEST(DenseCollectivesTest, AllReduceAlgorithmComesFromTheSelection) {
  auto results = RunRanks(kRanks, RankOptions(), [](int rank, Communicator& comm) {
    for (auto [algorithm, count] : {std::pair{Algorithm::kRing, size_t{37}},
                                    std::pair{Algorithm::kDirect, size_t{40000}},
                                    std::pair{Algorithm::kAuto, size_t{40000}}}) {
      std::vector<uint8_t> data = Filled(rank, count, DType::kI32);
      OpOptions options;
      options.algorithm = algorithm;
      LBCC_RETURN_IF_ERROR(
          comm.AllReduce(data.data(), data.data(), count, DType::kI32, ReduceOp::kSum, options)
              ->Wait());
      LBCC_RETURN_IF_ERROR(
          Expect(data.data(), count, DType::kI32, ReduceOp::kSum, 0, AlgorithmName(algorithm)));
    }
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
  auto mixed = RunRanks(kRanks, RankOptions(), [](int rank, Communicator& comm) {
    std::vector<float> data(40000, 1.0f);  // beyond the header's data: both post a header round
    OpOptions options;
    options.algorithm = rank == 2 ? Algorithm::kDirect : Algorithm::kRing;
    return comm
        .AllReduce(data.data(), data.data(), data.size(), DType::kF32, ReduceOp::kSum, options)
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
      OpOptions options;
      options.algorithm = rank == 2 ? Algorithm::kDirect : Algorithm::kRing;
      return comm
          .AllReduce(data.data(), data.data(), data.size(), DType::kF32, ReduceOp::kSum, options)
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
