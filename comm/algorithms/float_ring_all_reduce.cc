// FloatAllReduceRing: the all-reduce ring of Communicator::AllReduce over tensor views.
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/dtype.h"
#include "comm/collectives.h"

namespace lbcc::comm {
namespace {

using transport::Priority;
using transport::Tag;

// dst[i] = round(float(dst[i]) + float(src[i])) in `dtype`.
void Accumulate(void* dst, const void* src, size_t count, DType dtype) {
  switch (dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(dst);
      const float* s = static_cast<const float*>(src);
      for (size_t i = 0; i < count; ++i) d[i] += s[i];
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToBf16(Bf16ToF32(d[i]) + Bf16ToF32(s[i]));
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToF16(F16ToF32(d[i]) + F16ToF32(s[i]));
      return;
    }
    default:
      LBCC_CHECK(false) << "Accumulate: unsupported dtype";
  }
}

void Scale(void* data, size_t count, DType dtype, float factor) {
  switch (dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(data);
      for (size_t i = 0; i < count; ++i) d[i] *= factor;
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToBf16(Bf16ToF32(d[i]) * factor);
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToF16(F16ToF32(d[i]) * factor);
      return;
    }
    default:
      LBCC_CHECK(false) << "Scale: unsupported dtype";
  }
}

}  // namespace

absl::Status FloatAllReduceRing(const Group& group, Tag tag, const void* in, void* out,
                                size_t count, DType dtype, ReduceOp op, Priority priority,
                                absl::Time deadline) {
  const size_t element = DTypeSize(dtype);
  if (in != out) std::memmove(out, in, count * element);
  const int n = group.size();
  if (n == 1) return absl::OkStatus();
  const std::vector<size_t> offsets = EvenChunkOffsets(count, n, element);
  const int me = group.me;
  // Reduce-scatter (steps 0 .. n-2, tags tag + s): rank r ends owning the full sum of chunk
  // (r + 1) % n; then the all-gather of the owned chunks (tags tag + n + s).
  RingSchedule ring;
  ring.steps = 2 * (n - 1);
  ring.combine_steps = n - 1;
  ring.send_chunk = [me, n](int s) { return ((me - s) % n + n) % n; };
  ring.recv_chunk = [me, n](int s) { return ((me - s - 1) % n + n) % n; };
  ring.step_tag = [tag, n](int s) { return s < n - 1 ? tag + s : tag + n + (s - (n - 1)); };
  ring.combine = [dtype](uint8_t* dst, const uint8_t* src, size_t elements) {
    Accumulate(dst, src, elements, dtype);
  };
  if (op == ReduceOp::kAvg) {
    ring.finish = [dtype, n](uint8_t* segment, size_t elements) {
      Scale(segment, elements, dtype, 1.0f / n);
    };
  }
  return RingPass(group, static_cast<uint8_t*>(out), offsets, element, ring, priority, deadline);
}

}  // namespace lbcc::comm
