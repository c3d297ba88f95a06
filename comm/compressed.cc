// Communicator's compressed point-to-point: SendCompressed and RecvCompressed (pipeline
// boundaries). SparseAllReduce lives in sparse_allreduce.cc.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "comm/communicator.h"
#include "comm/tensor_codec.h"

namespace lbcc::comm {
namespace {

using internal::DecodeTensor;
using internal::EncodeTensor;

// P2P tags: the sequence field holds the user's tag and the step field this marker, so they
// never meet a collective's tags (whose steps stay far below it).
constexpr uint32_t kP2pStep = 0xffff;

}  // namespace

RequestPtr Communicator::SendCompressed(const TensorView& input, const codecs::Codec* codec,
                                        codecs::CodecState* state, int peer, uint32_t tag,
                                        void* cuda_stream) {
  if (codec == nullptr || peer < 0 || peer >= nranks() || peer == rank()) {
    return CompletedRequest(absl::InvalidArgumentError(
        absl::StrCat("SendCompressed: bad codec or peer ", peer)));
  }
  absl::Status status = fabric_->aborted();
  if (!status.ok()) {
    return CompletedRequest(absl::FailedPreconditionError(
        absl::StrCat("SendCompressed: the communicator failed earlier: ", status.ToString())));
  }
  absl::StatusOr<size_t> max = codec->MaxEncodedBytes(input.shape());
  if (!max.ok()) return CompletedRequest(max.status());
  auto payload = std::make_shared<std::vector<uint8_t>>(*max);
  absl::StatusOr<size_t> size =
      EncodeTensor(*codec, input, state, absl::MakeSpan(*payload), cuda_stream, nullptr);
  if (!size.ok()) return CompletedRequest(Annotate(size.status(), "SendCompressed"));
  payload->resize(*size);
  auto request = std::make_shared<Request>();
  fabric_->out(group_.ranks[peer])
      ->Send(MakeTag(comm_id_, tag, kP2pStep), *payload, {transport::Priority::kHigh},
             [request, payload, state](absl::Status status) {
               if (state != nullptr) {
                 absl::Status s = status.ok() ? state->Commit() : state->Abort();
                 if (status.ok()) status = s;
               }
               request->Complete(Annotate(status, "SendCompressed"));
             });
  return request;
}

RequestPtr Communicator::RecvCompressed(const TensorView& out, int peer, uint32_t tag,
                                        PayloadDecoder decode, void* cuda_stream) {
  if (peer < 0 || peer >= nranks() || peer == rank()) {
    return CompletedRequest(
        absl::InvalidArgumentError(absl::StrCat("RecvCompressed: bad peer ", peer)));
  }
  if (out.dtype() != DType::kF32) {
    return CompletedRequest(
        absl::InvalidArgumentError("RecvCompressed: out must be an f32 tensor"));
  }
  absl::Status status = fabric_->aborted();
  if (!status.ok()) {
    return CompletedRequest(absl::FailedPreconditionError(
        absl::StrCat("RecvCompressed: the communicator failed earlier: ", status.ToString())));
  }
  if (!decode) {
    decode = [cuda_stream](absl::Span<const uint8_t> payload, const TensorView& target) {
      codecs::DecodeOptions options;
      options.aggregation = codecs::Aggregation::kSum;
      return DecodeTensor({payload}, options, target, nullptr, cuda_stream, nullptr);
    };
  }
  auto request = std::make_shared<Request>();
  auto buffer = std::make_shared<std::vector<uint8_t>>();
  // A payload is at most the dense f32 tensor plus headers, whatever the codec; a table delta
  // (activations.h) adds a bitmap of one bit per element.
  const size_t limit = out.num_bytes() + out.num_bytes() / 32 + (size_t{1} << 20);
  fabric_->in(group_.ranks[peer])
      ->Recv(
          MakeTag(comm_id_, tag, kP2pStep),
          [buffer, limit, out_bytes = out.num_bytes()](
              size_t size) -> absl::StatusOr<absl::Span<uint8_t>> {
            if (size > limit) {
              return absl::DataLossError(
                  absl::StrCat("compressed message of ", size, " bytes for a tensor of ",
                               out_bytes, " bytes"));
            }
            buffer->resize(size);
            return absl::MakeSpan(*buffer);
          },
          [request, buffer, out, decode](absl::StatusOr<size_t> n) {
            absl::Status status = n.status();
            if (status.ok()) status = decode(*buffer, out);
            request->Complete(Annotate(status, "RecvCompressed"));
          });
  return request;
}

}  // namespace lbcc::comm
