// Internal: the device-twin interface and the helpers the device codecs' host code
// (kernels/*_device.cc) shares.
#ifndef LBCC_KERNELS_DEVICE_INTERNAL_H_
#define LBCC_KERNELS_DEVICE_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/check.h"
#include "codecs/codec.h"
#include "codecs/codec_registry.h"
#include "kernels/backend.h"

namespace lbcc::kernels {

// Defined in kernels/device_codec.h, whose entry points dispatch to the twins below; the twins'
// files include it. Only declared here, so that the two headers do not include each other.
class DeviceScratch;

// Sub-buffers of one allocation start 256 bytes apart (CUDA's allocation alignment).
inline size_t AlignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

inline absl::Status NoCuda(absl::string_view what) {
  return absl::UnimplementedError(
      absl::StrCat(what, ": LBCC was built without CUDA (build with --config=cuda)"));
}

// A host image of device memory: sections appended at 256-byte boundaries; Add() returns the
// offset a section will have once the image is copied to the device buffer.
class Image {
 public:
  size_t Add(size_t bytes) {
    const size_t at = size_;
    size_ += AlignUp(bytes);
    return at;
  }
  size_t size() const { return size_ < 256 ? 256 : size_; }

 private:
  size_t size_ = 0;
};

// A codec's device twin: the device half of the codec registered under the same payload id
// (codecs/codec_registry.h), attached from the twin's own file with one line:
//
//   LBCC_REGISTER_DEVICE_CODEC(codecs::CodecId::kTopKEf, TopKEfDevice);
//
// device_codec.cc's entry points check memory kinds, dtypes and envelopes, then dispatch here
// by codec id. Implementations: topk_device.cc (TopK-EF), dense_device.cc (dense quantizer).
// Twins are stateless and shared by threads. Every method runs on `backend`, on `stream`, and
// returns once its work there is done.
class DeviceCodec : public codecs::DeviceTwin {
 public:
  // A state for one tensor on CUDA `device` (nullptr for a stateless codec). Unimplemented
  // without CUDA.
  virtual absl::StatusOr<std::unique_ptr<codecs::CodecState>> NewState(int device) const = 0;
  // codecs::Codec::Encode for `data` (f32 of `shape` on the backend): `codec` is the encoder
  // whose options apply (InvalidArgument when it is not of this twin's codec class), `state`
  // from NewState() on the same backend. `scratch` belongs to `backend`.
  virtual absl::StatusOr<size_t> Encode(Backend& backend, const codecs::Codec& codec,
                                        const float* data, absl::Span<const int64_t> shape,
                                        codecs::CodecState* state, absl::Span<uint8_t> out,
                                        Stream stream, DeviceScratch& scratch) const = 0;
  // codecs::DecodeAccumulate into `out` (f32 of `num_elements` on the backend) for payloads
  // whose envelopes parsed as `infos` (this codec's id, out's shape): validates the rest on
  // the host first (nothing is written on error), then aggregates on the device.
  virtual absl::Status DecodeAccumulate(Backend& backend,
                                        absl::Span<const codecs::PayloadInfo> infos,
                                        const codecs::DecodeOptions& options, float* out,
                                        int64_t num_elements, Stream stream,
                                        DeviceScratch& scratch) const = 0;
};

// The twin attached to `id`; nullptr when none.
inline const DeviceCodec* FindDeviceCodec(codecs::CodecId id) {
  // Only kernels/ attaches twins, and only DeviceCodecs (LBCC_REGISTER_DEVICE_CODEC).
  return static_cast<const DeviceCodec*>(codecs::FindDeviceTwin(id));
}

// LBCC_REGISTER_DEVICE_CODEC's body: attaches a `Twin` that lives until the process ends.
template <typename Twin>
bool AttachDeviceCodec(codecs::CodecId id) {
  static const Twin* const twin = new Twin();
  const bool ok = codecs::AttachDeviceTwin(id, twin);
  LBCC_CHECK(ok) << "a second device twin for codec id " << static_cast<int>(id);
  return ok;
}

}  // namespace lbcc::kernels

#define LBCC_REGISTER_DEVICE_CODEC(id, Twin) \
  LBCC_REGISTER_DEVICE_CODEC_N_(__COUNTER__, id, Twin)
#define LBCC_REGISTER_DEVICE_CODEC_N_(n, id, Twin) LBCC_REGISTER_DEVICE_CODEC_CAT_(n, id, Twin)
#define LBCC_REGISTER_DEVICE_CODEC_CAT_(n, id, Twin)                        \
  [[maybe_unused]] static const bool lbcc_device_codec_registered_##n = \
      ::lbcc::kernels::AttachDeviceCodec<Twin>(id)

namespace lbcc::kernels {

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_DEVICE_INTERNAL_H_
