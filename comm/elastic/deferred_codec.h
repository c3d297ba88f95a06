// The elastic step's hold on error-feedback updates: SparseAllReduce's Commit() and Abort()
// only mark a DeferredState, and the group commits or aborts the caller's state itself (at
// once when the exchange succeeded here; after the master's decision when it failed, since
// the step may still be forwarded). DeferringCodec is the caller's codec with DeferredState
// unwrapped on the way in.
//
// Thread-safety: as the wrapped state and codec (one call at a time per state).
#ifndef LBCC_COMM_ELASTIC_DEFERRED_CODEC_H_
#define LBCC_COMM_ELASTIC_DEFERRED_CODEC_H_

#include <memory>
#include <string>

#include "codecs/codec.h"

namespace lbcc::comm::elastic {

class DeferredState final : public codecs::CodecState {
 public:
  explicit DeferredState(codecs::CodecState* inner) : inner_(inner) {}
  codecs::CodecId codec() const override { return inner_->codec(); }
  bool has_pending() const override { return inner_->has_pending() && !marked_ && !dropped_; }
  // FailedPrecondition without a pending update.
  absl::Status Commit() override;
  absl::Status Abort() override;
  codecs::CodecState* inner() const { return inner_; }
  // The master's decision: applies or drops whatever the inner state holds.
  absl::Status Finish(bool commit);

 private:
  codecs::CodecState* const inner_;
  bool marked_ = false;
  bool dropped_ = false;
};

class DeferringCodec final : public codecs::Codec {
 public:
  // `inner` must outlive this codec.
  explicit DeferringCodec(const codecs::Codec& inner) : inner_(inner) {}
  codecs::CodecId id() const override { return inner_.id(); }
  absl::string_view name() const override { return inner_.name(); }
  std::string Describe() const override { return inner_.Describe(); }
  absl::StatusOr<size_t> MaxEncodedBytes(absl::Span<const int64_t> shape) const override {
    return inner_.MaxEncodedBytes(shape);
  }
  std::unique_ptr<codecs::CodecState> NewState() const override { return inner_.NewState(); }
  absl::StatusOr<size_t> Encode(const TensorView& input, codecs::CodecState* state,
                                absl::Span<uint8_t> out) const override;
  absl::StatusOr<size_t> EncodeStreamed(const TensorView& input, codecs::CodecState* state,
                                        absl::Span<uint8_t> out,
                                        codecs::EncodeObserver* observer) const override;
  std::unique_ptr<codecs::CodecScratch> NewDecodeScratch() const override {
    return inner_.NewDecodeScratch();
  }
  absl::Status PrepareDecode(const codecs::DecodeCall& call,
                             codecs::CodecScratch* scratch) const override {
    return inner_.PrepareDecode(call, scratch);
  }
  void ApplyDecode(const codecs::DecodeCall& call, codecs::CodecScratch* scratch) const override {
    inner_.ApplyDecode(call, scratch);
  }
  absl::Status Inspect(const codecs::PayloadInfo& info,
                       codecs::PayloadSummary* summary) const override {
    return inner_.Inspect(info, summary);
  }
  bool ClipsToMedianNorm() const override { return inner_.ClipsToMedianNorm(); }

 private:
  const codecs::Codec& inner_;
};

}  // namespace lbcc::comm::elastic

#endif  // LBCC_COMM_ELASTIC_DEFERRED_CODEC_H_
