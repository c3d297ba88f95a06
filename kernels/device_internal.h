// Internal helpers shared by the device codecs' host code (kernels/*_device.cc).
#ifndef LBCC_KERNELS_DEVICE_INTERNAL_H_
#define LBCC_KERNELS_DEVICE_INTERNAL_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "codecs/dense_quant.h"
#include "codecs/topk_ef.h"
#include "kernels/backend.h"
#include "kernels/device_codec.h"

namespace lbcc::kernels {

// Sub-buffers of one allocation start 256 bytes apart (CUDA's allocation alignment).
inline size_t AlignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

inline absl::Status NoCuda(absl::string_view what) {
  return absl::UnimplementedError(
      absl::StrCat(what, ": LBCC was built without CUDA (build with --config=cuda)"));
}

absl::StatusOr<size_t> EncodeTopKWith(const codecs::TopKEfCodec& codec, const float* delta,
                                      absl::Span<const int64_t> shape, DeviceTopKEfState& state,
                                      absl::Span<uint8_t> out, Stream stream);
absl::StatusOr<size_t> EncodeDenseWith(Backend& backend, const codecs::DenseQuantCodec& codec,
                                       const float* input, absl::Span<const int64_t> shape,
                                       absl::Span<uint8_t> out, Stream stream,
                                       DeviceScratch& scratch);

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_DEVICE_INTERNAL_H_
