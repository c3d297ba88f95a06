// CUDA tensors in the compressed operations of a build without CUDA: Unimplemented on every
// rank, and nothing else breaks (kernels/device_codec.h reports the missing build); a device
// error-feedback state never reaches the CPU codec.
#include <vector>

#include "base/status_matchers.h"
#include "codecs/topk_ef.h"
#include "comm/communicator.h"
#include "comm/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda_runtime.h"
#include "kernels/device_codec.h"

namespace lbcc::comm {
namespace {

using ::lbcc::comm::testing::RunRanks;
using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;

TEST(DeviceTensorsTest, WithoutCudaSparseAllReduceAndSendAreUnimplemented) {
  if (kernels::BuiltWithCuda()) GTEST_SKIP() << "built with CUDA: see device_sparse_allreduce_test";
  auto codec = *codecs::TopKEfCodec::Create(codecs::TopKEfOptions());
  const Shape shape = {64, 64};
  auto statuses = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<float> delta(4096, 1.0f), out(4096, 0.0f);
    // Views that claim CUDA memory (never dereferenced).
    TensorView d = *TensorView::Create(delta.data(), DType::kF32, shape, MemoryKind::kCuda, 0);
    TensorView o = *TensorView::Create(out.data(), DType::kF32, shape, MemoryKind::kCuda, 0);
    codecs::TopKEfState state;
    absl::Status sparse = comm.SparseAllReduce({{d, o, &state}}, codec.get())->Wait();
    if (sparse.code() != absl::StatusCode::kUnimplemented) return sparse;
    absl::Status send = comm.SendCompressed(d, codec.get(), nullptr, 1 - rank, 3)->Wait();
    if (send.code() != absl::StatusCode::kUnimplemented) return send;
    // The communicator stays usable.
    std::vector<float> host(4096, static_cast<float>(rank));
    TensorView h = *TensorView::Host(host.data(), shape);
    return comm.SparseAllReduce({{h, *TensorView::Host(out.data(), shape), &state}}, codec.get())
        ->Wait();
  });
  for (const absl::Status& s : statuses) EXPECT_THAT(s, IsOk());
}

// A device state with a host tensor is refused before the CPU codec sees it.
TEST(DeviceTensorsTest, HostTensorWithADeviceStateIsRefused) {
  auto codec = *codecs::TopKEfCodec::Create(codecs::TopKEfOptions());
  auto state = kernels::DeviceTopKEfState::Create(kernels::EmulatedBackend(), 0);
  ASSERT_THAT(state.status(), IsOk());
  const Shape shape = {64, 64};
  auto statuses = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<float> delta(4096, 1.0f), out(4096, 0.0f);
    TensorView d = *TensorView::Host(delta.data(), shape);
    TensorView o = *TensorView::Host(out.data(), shape);
    codecs::TopKEfState host_state;
    codecs::CodecState* s = rank == 0 ? static_cast<codecs::CodecState*>(state->get()) : &host_state;
    return comm.SparseAllReduce({{d, o, s}}, codec.get())->Wait();
  });
  for (const absl::Status& s : statuses) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  }
  EXPECT_THAT(statuses[0], StatusIs(absl::StatusCode::kInvalidArgument,
                                    ::testing::HasSubstr("device state")));
}

}  // namespace
}  // namespace lbcc::comm
