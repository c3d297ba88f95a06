// SparseAllReduce and compressed point-to-point on CUDA tensors (needs a GPU; skips without
// one): every rank's aggregate and error feedback bit-identical to the same exchange on host
// tensors with the CPU codecs.
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "codecs/dense_quant.h"
#include "codecs/topk_ef.h"
#include "comm/communicator.h"
#include "comm/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device_codec.h"

namespace lbcc::comm {
namespace {

using ::lbcc::comm::testing::RunRanks;
using ::lbcc::testing::IsOk;

constexpr int kRanks = 3;
const Shape kShape = {256, 320};

std::vector<float> DeltaOf(int rank, int round) {
  std::mt19937 rng(rank * 7919 + round * 104729 + 1);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> v(256 * 320);
  for (float& x : v) x = normal(rng);
  return v;
}

absl::Span<const uint8_t> Bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}
absl::Span<uint8_t> Bytes(std::vector<float>& v) {
  return {reinterpret_cast<uint8_t*>(v.data()), v.size() * sizeof(float)};
}

TEST(DeviceSparseAllReduceTest, MatchesTheHostExchangeBitForBit) {
  if (!kernels::DeviceCodecsAvailable()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  auto codec = *codecs::TopKEfCodec::Create(codecs::TopKEfOptions());
  const int64_t n = 256 * 320;
  // Host exchange: the reference.
  std::vector<std::vector<float>> host_out(kRanks), host_error(kRanks);
  auto host = RunRanks(kRanks, {}, [&](int rank, Communicator& comm) -> absl::Status {
    codecs::TopKEfState state;
    std::vector<float> out(n);
    for (int round = 0; round < 3; ++round) {
      std::vector<float> delta = DeltaOf(rank, round);
      LBCC_RETURN_IF_ERROR(comm.SparseAllReduce({{*TensorView::Host(delta.data(), kShape),
                                                  *TensorView::Host(out.data(), kShape), &state}},
                                                codec.get())
                               ->Wait());
    }
    host_out[rank] = out;
    host_error[rank].assign(state.error().begin(), state.error().end());
    return absl::OkStatus();
  });
  for (const absl::Status& s : host) ASSERT_THAT(s, IsOk());
  // Device exchange.
  std::vector<std::vector<float>> dev_out(kRanks, std::vector<float>(n)),
      dev_error(kRanks, std::vector<float>(n));
  auto dev = RunRanks(kRanks, {}, [&](int rank, Communicator& comm) -> absl::Status {
    LBCC_ASSIGN_OR_RETURN(std::unique_ptr<codecs::CodecState> state,
                          kernels::NewDeviceState(*codec, 0));
    LBCC_ASSIGN_OR_RETURN(kernels::DeviceBuffer delta, kernels::DeviceBuffer::Allocate(4 * n, 0));
    LBCC_ASSIGN_OR_RETURN(kernels::DeviceBuffer out, kernels::DeviceBuffer::Allocate(4 * n, 0));
    for (int round = 0; round < 3; ++round) {
      LBCC_RETURN_IF_ERROR(delta.CopyFromHost(Bytes(DeltaOf(rank, round))));
      LBCC_RETURN_IF_ERROR(comm.SparseAllReduce({{*delta.View(kShape), *out.View(kShape),
                                                  state.get()}},
                                                codec.get())
                               ->Wait());
    }
    LBCC_RETURN_IF_ERROR(out.CopyToHost(Bytes(dev_out[rank])));
    return static_cast<kernels::DeviceTopKEfState*>(state.get())
        ->CopyErrorToHost(absl::MakeSpan(dev_error[rank]));
  });
  for (const absl::Status& s : dev) ASSERT_THAT(s, IsOk());
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(0, std::memcmp(dev_out[r].data(), host_out[r].data(), 4 * n)) << "rank " << r;
    EXPECT_EQ(0, std::memcmp(dev_error[r].data(), host_error[r].data(), 4 * n)) << "rank " << r;
  }
}

TEST(DeviceSparseAllReduceTest, CompressedPointToPointFromAndToTheGpu) {
  if (!kernels::DeviceCodecsAvailable()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  codecs::DenseQuantOptions options;
  options.format = codecs::DenseFormat::kInt8;
  auto codec = *codecs::DenseQuantCodec::Create(options);
  const int64_t n = 256 * 320;
  std::vector<float> sent = DeltaOf(0, 9), expected(n), received(n);
  {
    std::vector<uint8_t> payload(*codec->MaxEncodedBytes(kShape));
    const size_t size = *codec->Encode(*TensorView::Host(sent.data(), kShape), nullptr,
                                       absl::MakeSpan(payload));
    payload.resize(size);
    codecs::DecodeOptions sum;
    sum.aggregation = codecs::Aggregation::kSum;
    ASSERT_THAT(codecs::DecodeAccumulate({payload}, sum, *TensorView::Host(expected.data(), kShape)),
                IsOk());
  }
  auto statuses = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    LBCC_ASSIGN_OR_RETURN(kernels::DeviceBuffer buffer, kernels::DeviceBuffer::Allocate(4 * n, 0));
    if (rank == 0) {
      LBCC_RETURN_IF_ERROR(buffer.CopyFromHost(Bytes(sent)));
      return comm.SendCompressed(*buffer.View(kShape), codec.get(), nullptr, 1, 4)->Wait();
    }
    LBCC_RETURN_IF_ERROR(comm.RecvCompressed(*buffer.View(kShape), 0, 4)->Wait());
    return buffer.CopyToHost(Bytes(received));
  });
  for (const absl::Status& s : statuses) ASSERT_THAT(s, IsOk());
  EXPECT_EQ(0, std::memcmp(received.data(), expected.data(), 4 * n));
}

}  // namespace
}  // namespace lbcc::comm
