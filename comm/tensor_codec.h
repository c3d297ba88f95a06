// Encode and decode of one TensorView wherever it lives: host tensors through the codec (and
// codecs::DecodeAccumulate), CUDA tensors on their GPU (kernels/device_codec.h; Unimplemented
// in a build without CUDA). Shared by SparseAllReduce and compressed point-to-point.
//
// Buffers: `out` / `payloads` only for the call; `state` and the scratches as the codec says.
// Thread-safety: as the codec's Encode and the decoders (one call per state or scratch at once).
#ifndef LBCC_COMM_TENSOR_CODEC_H_
#define LBCC_COMM_TENSOR_CODEC_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/tensor_view.h"
#include "codecs/codec.h"
#include "kernels/device_codec.h"

namespace lbcc::comm::internal {

// The payload's size in `out`. With an `observer`, a host encode reports its body as it becomes
// final (Codec::EncodeStreamed). InvalidArgument for a host tensor with a device state, else
// what the codec returns.
absl::StatusOr<size_t> EncodeTensor(const codecs::Codec& codec, const TensorView& input,
                                    codecs::CodecState* state, absl::Span<uint8_t> out,
                                    void* cuda_stream, kernels::DeviceScratch* scratch,
                                    codecs::EncodeObserver* observer = nullptr);

// Decodes `payloads` into `out` (accumulating as `options` says); errors as the decoders'.
absl::Status DecodeTensor(absl::Span<const absl::Span<const uint8_t>> payloads,
                          const codecs::DecodeOptions& options, const TensorView& out,
                          codecs::DecodeScratch* scratch, void* cuda_stream,
                          kernels::DeviceScratch* device_scratch);

}  // namespace lbcc::comm::internal

#endif  // LBCC_COMM_TENSOR_CODEC_H_
