#include "comm/elastic/deferred_codec.h"

namespace lbcc::comm::elastic {
namespace {

codecs::CodecState* Unwrap(codecs::CodecState* state) {
  return state == nullptr ? nullptr : static_cast<DeferredState*>(state)->inner();
}

}  // namespace

absl::Status DeferredState::Commit() {
  if (!has_pending()) return absl::FailedPreconditionError("elastic: no pending update");
  marked_ = true;
  return absl::OkStatus();
}

absl::Status DeferredState::Abort() {
  if (!has_pending()) return absl::FailedPreconditionError("elastic: no pending update");
  dropped_ = true;
  return absl::OkStatus();
}

absl::Status DeferredState::Finish(bool commit) {
  marked_ = dropped_ = false;
  if (!inner_->has_pending()) return absl::OkStatus();
  return commit ? inner_->Commit() : inner_->Abort();
}

absl::StatusOr<size_t> DeferringCodec::Encode(const TensorView& input, codecs::CodecState* state,
                                              absl::Span<uint8_t> out) const {
  return inner_.Encode(input, Unwrap(state), out);
}

absl::StatusOr<size_t> DeferringCodec::EncodeStreamed(const TensorView& input,
                                                      codecs::CodecState* state,
                                                      absl::Span<uint8_t> out,
                                                      codecs::EncodeObserver* observer) const {
  return inner_.EncodeStreamed(input, Unwrap(state), out, observer);
}

}  // namespace lbcc::comm::elastic
