// The dense quantizer's device twin (codecs/dense_quant.h): encode on the device, decode with
// validation on the host and aggregation on the device.
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/dense_quant.h"
#include "codecs/payload.h"
#include "kernels/backend.h"
#include "kernels/device_codec.h"
#include "kernels/device_internal.h"

namespace lbcc::kernels {

namespace {

bool IsInt(codecs::DenseFormat f) {
  return f == codecs::DenseFormat::kInt8 || f == codecs::DenseFormat::kInt4;
}

size_t DenseCodeBytes(codecs::DenseFormat f, int64_t n) {
  switch (f) {
    case codecs::DenseFormat::kInt8:
      return static_cast<size_t>(n);
    case codecs::DenseFormat::kInt4:
      return static_cast<size_t>((n + 1) / 2);
    default:
      return static_cast<size_t>(2 * n);
  }
}

absl::StatusOr<size_t> EncodeDense(Backend& be, const codecs::DenseQuantCodec& codec,
                                       const float* x, absl::Span<const int64_t> shape,
                                       absl::Span<uint8_t> out, Stream stream,
                                       DeviceScratch& scratch) {
  const codecs::DenseQuantOptions& o = codec.options();
  LBCC_ASSIGN_OR_RETURN(const int64_t n, NumElements(shape));
  const int64_t block = IsInt(o.format) ? o.block : 0;
  const int64_t blocks = block > 0 ? (n + block - 1) / block : 0;
  const size_t scale_bytes = 4 * static_cast<size_t>(blocks);
  const size_t code_bytes = DenseCodeBytes(o.format, n);
  codecs::PayloadWriter writer;
  LBCC_RETURN_IF_ERROR(writer.Begin(out, codecs::CodecId::kDenseQuant, codecs::kDenseQuantVersion,
                                    DType::kF32, shape, 8, scale_bytes + code_bytes));
  codecs::ByteWriter params(writer.params());
  params.U8(static_cast<uint8_t>(o.format));
  params.U8(o.stochastic ? 1 : 0);
  params.U16(0);
  params.U32(static_cast<uint32_t>(block));
  if (n == 0) return writer.Finish();
  Image image;
  const size_t bad_at = image.Add(sizeof(uint64_t));
  const size_t scales_at = image.Add(scale_bytes);
  const size_t codes_at = image.Add(code_bytes);
  LBCC_ASSIGN_OR_RETURN(uint8_t * host, scratch.Host(image.size()));
  LBCC_ASSIGN_OR_RETURN(uint8_t * device, scratch.Device(image.size()));
  LBCC_RETURN_IF_ERROR(be.Memset(device + bad_at, 0xFF, sizeof(uint64_t), stream));
  DenseEncodeArgs a;
  a.format = static_cast<int32_t>(o.format);
  a.block = block;
  a.stochastic = o.stochastic;
  a.seed = o.seed;
  a.x = x;
  a.n = n;
  a.scales = reinterpret_cast<float*>(device + scales_at);
  a.codes = device + codes_at;
  a.first_bad = reinterpret_cast<uint64_t*>(device + bad_at);
  LBCC_RETURN_IF_ERROR(be.DenseEncode(a, stream));
  LBCC_RETURN_IF_ERROR(be.CopyToHost(host, device, image.size(), stream));
  LBCC_RETURN_IF_ERROR(be.Synchronize(stream));
  uint64_t bad;
  std::memcpy(&bad, host + bad_at, sizeof(bad));
  if (bad != ~uint64_t{0}) {
    float v = 0;
    LBCC_RETURN_IF_ERROR(be.CopyToHost(&v, x + bad, sizeof(float), stream));
    LBCC_RETURN_IF_ERROR(be.Synchronize(stream));
    if (hd::AbsBits(v) > hd::kMaxFiniteAbsBits) {
      return absl::InvalidArgumentError(
          absl::StrCat("dense_quant: input element ", bad, " is NaN or infinite"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "dense_quant: element ", bad, " = ", v, " is beyond ",
        o.format == codecs::DenseFormat::kBf16 ? "bf16" : "fp16", "'s range"));
  }
  uint8_t* body = writer.body().data();
  if (scale_bytes > 0) std::memcpy(body, host + scales_at, scale_bytes);
  std::memcpy(body + scale_bytes, host + codes_at, code_bytes);
  return writer.Finish();
}

absl::Status DecodeDense(Backend& be, absl::Span<const codecs::PayloadInfo> infos,
                         const codecs::DecodeOptions& options, float* out, int64_t n,
                         Stream stream, DeviceScratch& scratch) {
  std::vector<codecs::DenseQuantHeader> headers(infos.size());
  for (size_t r = 0; r < infos.size(); ++r) {
    LBCC_ASSIGN_OR_RETURN(headers[r], codecs::ParseDenseQuantHeader(infos[r]),
                          _.Prepend(absl::StrCat("payload ", r)));
  }
  if (n == 0) return absl::OkStatus();
  Image image;
  const size_t descs_at = image.Add(infos.size() * sizeof(DensePayloadDesc));
  std::vector<size_t> scales_at(infos.size()), codes_at(infos.size());
  for (size_t r = 0; r < infos.size(); ++r) {
    scales_at[r] = image.Add(headers[r].scales.size());
    codes_at[r] = image.Add(headers[r].codes.size());
  }
  LBCC_ASSIGN_OR_RETURN(uint8_t * host, scratch.Host(image.size()));
  LBCC_ASSIGN_OR_RETURN(uint8_t * device, scratch.Device(image.size()));
  auto* descs = reinterpret_cast<DensePayloadDesc*>(host + descs_at);
  for (size_t r = 0; r < infos.size(); ++r) {
    const codecs::DenseQuantHeader& h = headers[r];
    if (!h.scales.empty()) std::memcpy(host + scales_at[r], h.scales.data(), h.scales.size());
    if (!h.codes.empty()) std::memcpy(host + codes_at[r], h.codes.data(), h.codes.size());
    DensePayloadDesc d;
    d.format = static_cast<int32_t>(h.format);
    d.block = h.block;
    d.scales = reinterpret_cast<const float*>(device + scales_at[r]);
    d.codes = device + codes_at[r];
    descs[r] = d;
  }
  LBCC_RETURN_IF_ERROR(be.CopyToDevice(device, host, image.size(), stream));
  DenseAggregateArgs a;
  a.payloads = reinterpret_cast<const DensePayloadDesc*>(device + descs_at);
  a.num_payloads = static_cast<int32_t>(infos.size());
  a.num_elements = n;
  a.divide = options.aggregation != codecs::Aggregation::kSum;
  a.accumulate = options.accumulate;
  a.out = out;
  LBCC_RETURN_IF_ERROR(be.AggregateDense(a, stream));
  return be.Synchronize(stream);
}

class DenseQuantDevice final : public DeviceCodec {
 public:
  absl::StatusOr<std::unique_ptr<codecs::CodecState>> NewState(int /*device*/) const override {
    if (CudaBackend() == nullptr) return NoCuda("NewDeviceState");
    return std::unique_ptr<codecs::CodecState>();
  }

  absl::StatusOr<size_t> Encode(Backend& backend, const codecs::Codec& codec, const float* data,
                                absl::Span<const int64_t> shape, codecs::CodecState* /*state*/,
                                absl::Span<uint8_t> out, Stream stream,
                                DeviceScratch& scratch) const override {
    const auto* dense = dynamic_cast<const codecs::DenseQuantCodec*>(&codec);
    if (dense == nullptr) return absl::InvalidArgumentError("dense_quant: not a DenseQuantCodec");
    return EncodeDense(backend, *dense, data, shape, out, stream, scratch);
  }

  absl::Status DecodeAccumulate(Backend& backend, absl::Span<const codecs::PayloadInfo> infos,
                                const codecs::DecodeOptions& options, float* out,
                                int64_t num_elements, Stream stream,
                                DeviceScratch& scratch) const override {
    return DecodeDense(backend, infos, options, out, num_elements, stream, scratch);
  }
};

}  // namespace

LBCC_REGISTER_DEVICE_CODEC(codecs::CodecId::kDenseQuant, DenseQuantDevice);

}  // namespace lbcc::kernels
