#include "comm/tensor_codec.h"

namespace lbcc::comm::internal {

absl::StatusOr<size_t> EncodeTensor(const codecs::Codec& codec, const TensorView& input,
                                    codecs::CodecState* state, absl::Span<uint8_t> out,
                                    void* cuda_stream, kernels::DeviceScratch* scratch,
                                    codecs::EncodeObserver* observer) {
  if (input.is_host()) {
    // A device state holds its memory on the GPU; the CPU codec must not be given one.
    if (state != nullptr && state->is_device()) {
      return absl::InvalidArgumentError(
          "a host tensor with a device state (kernels::NewDeviceState): use a CUDA tensor or "
          "the codec's NewState()");
    }
    return observer != nullptr ? codec.EncodeStreamed(input, state, out, observer)
                               : codec.Encode(input, state, out);
  }
  return kernels::EncodeOnDevice(codec, input, state, out, cuda_stream, scratch);
}

absl::Status DecodeTensor(absl::Span<const absl::Span<const uint8_t>> payloads,
                          const codecs::DecodeOptions& options, const TensorView& out,
                          codecs::DecodeScratch* scratch, void* cuda_stream,
                          kernels::DeviceScratch* device_scratch) {
  if (out.is_host()) return codecs::DecodeAccumulate(payloads, options, out, scratch);
  return kernels::DecodeAccumulateOnDevice(payloads, options, out, cuda_stream, device_scratch);
}

}  // namespace lbcc::comm::internal
