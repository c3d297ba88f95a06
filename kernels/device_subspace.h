// The subspace activation codec (codecs/subspace_codec.h) on device tensors: forward
// c = U^T (h - T[y]) and backward g_c = U^T g_h with cuBLAS, the token-table terms and the
// coefficient quantizers in kernels (kernels/subspace_kernels.h), the payload assembled on the
// host from the few sections that come back (selectors, int8 scales, coefficients).
//
// Payloads have the CPU codec's format, parameters and layout; the CPU codec decodes them and
// this one decodes the CPU's. Coefficients are not bit-identical: cuBLAS and OpenBLAS sum the d
// products in different orders (see subspace_kernels.h), so values differ by a few fp32 units
// in the last place of |U|^T |h|, and a mixture's choice can differ where two components'
// energies agree to that precision. Ids, selectors given to the backward encoder, and every
// step after the products are the CPU's.
//
// The basis (U, T U and T) is copied to the device once, at Create(). Token ids stay host
// arrays, as in the CPU codec (they are validated there and travel in the payload).
//
// Errors: those of the CPU codec, plus Unimplemented (built without CUDA), Unavailable,
// ResourceExhausted. Thread-safety: thread-compatible (one thread at a time; one per stream).
#ifndef LBCC_KERNELS_DEVICE_SUBSPACE_H_
#define LBCC_KERNELS_DEVICE_SUBSPACE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/tensor_view.h"
#include "codecs/subspace_basis.h"
#include "codecs/subspace_codec.h"
#include "kernels/device_codec.h"

namespace lbcc::kernels {

class Backend;

class DeviceSubspaceCodec {
 public:
  // A codec on CUDA device `device`. InvalidArgument as codecs::SubspaceCodec::Create.
  static absl::StatusOr<std::unique_ptr<DeviceSubspaceCodec>> Create(
      std::shared_ptr<const codecs::SubspaceBasis> basis, codecs::SubspaceCodecOptions options,
      int device);
  // On any backend; the emulated one takes host tensors (tests).
  static absl::StatusOr<std::unique_ptr<DeviceSubspaceCodec>> Create(
      Backend& backend, std::shared_ptr<const codecs::SubspaceBasis> basis,
      codecs::SubspaceCodecOptions options, int device);
  ~DeviceSubspaceCodec();
  DeviceSubspaceCodec(const DeviceSubspaceCodec&) = delete;
  DeviceSubspaceCodec& operator=(const DeviceSubspaceCodec&) = delete;

  const codecs::SubspaceBasis& basis() const { return *basis_; }
  size_t ForwardPayloadBytes(int64_t tokens) const { return host_.ForwardPayloadBytes(tokens); }
  size_t BackwardPayloadBytes(int64_t tokens) const { return host_.BackwardPayloadBytes(tokens); }

  // As codecs::SubspaceCodec, with `h` / `g_h` / the outputs in device memory (f32 [tokens, d])
  // and the work on `stream`; each call returns when its device work is done.
  absl::StatusOr<size_t> EncodeForward(const TensorView& h, absl::Span<const int32_t> ids,
                                       absl::Span<uint8_t> out,
                                       codecs::SubspaceSelectors* selectors_out = nullptr,
                                       void* stream = nullptr);
  absl::Status DecodeForward(absl::Span<const uint8_t> payload, const TensorView& h_out,
                             absl::Span<int32_t> ids_out = {},
                             codecs::SubspaceSelectors* selectors_out = nullptr,
                             void* stream = nullptr);
  absl::StatusOr<size_t> EncodeBackward(const TensorView& g_h,
                                        const codecs::SubspaceSelectors& selectors,
                                        absl::Span<uint8_t> out, void* stream = nullptr);
  absl::Status DecodeBackward(absl::Span<const uint8_t> payload, const TensorView& g_out,
                              codecs::SubspaceSelectors* selectors_out = nullptr,
                              void* stream = nullptr);

 private:
  DeviceSubspaceCodec(Backend& backend, std::shared_ptr<const codecs::SubspaceBasis> basis,
                      codecs::SubspaceCodecOptions options, codecs::SubspaceCodec host, int device);
  absl::Status Upload();
  absl::Status CheckView(const TensorView& x, absl::string_view what) const;
  absl::StatusOr<size_t> Encode(bool forward, const float* x, int64_t tokens,
                                absl::Span<const int32_t> ids, const uint8_t* selectors,
                                int64_t block, absl::Span<uint8_t> out,
                                codecs::SubspaceSelectors* selectors_out, void* stream);
  // coef [tokens x k] = g_h x with each run of blocks' chosen component (backward encode).
  absl::Status ProjectBackward(const float* x, int64_t tokens, const uint8_t* selectors,
                               int64_t block, float* coef, void* stream);
  absl::Status Decode(bool forward, absl::Span<const uint8_t> payload, const TensorView& out,
                      absl::Span<int32_t> ids_out, codecs::SubspaceSelectors* selectors_out,
                      void* stream);

  Backend* backend_;
  std::shared_ptr<const codecs::SubspaceBasis> basis_;
  codecs::SubspaceCodecOptions options_;
  codecs::SubspaceCodec host_;  // sizes and payload headers
  int device_;
  void* blas_ = nullptr;
  float* u_ = nullptr;                // U [d x M k]
  float* projected_table_ = nullptr;  // T U [V x M k]
  float* table_ = nullptr;            // T [V x d]
  DeviceScratch buffers_;             // device scratch and pinned host staging, grown
};

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_DEVICE_SUBSPACE_H_
