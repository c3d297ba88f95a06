// Fuzzes the subspace decoders (forward, backward, single basis, mixture, no vocabulary), the
// payload inspector and the basis file parser. Any input must give ok or a documented error
// code, never a crash; a rejected payload must leave every output untouched; an accepted one
// must yield ids in [0, V) and selectors in [0, M). Input format: see subspace_fuzz_bases.h.
#include <xxhash.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "codecs/subspace_fuzz_bases.h"

namespace {

using lbcc::codecs::SubspaceCodec;
using lbcc::codecs::SubspacePayloadHeader;
using lbcc::codecs::SubspaceSelectors;
namespace fuzz = lbcc::codecs::fuzz;

constexpr float kSentinel = -3.25f;

void Check(bool condition) {
  if (!condition) std::abort();
}

void Decode(SubspaceCodec& codec, bool forward, const std::vector<uint8_t>& payload) {
  const int64_t d = codec.basis().model_dim();
  int64_t tokens = 1;
  absl::StatusOr<SubspacePayloadHeader> header = lbcc::codecs::InspectSubspacePayload(payload);
  if (header.ok()) {
    Check(header->total_bytes == payload.size());
    Check(header->tokens >= 0 && header->rank >= 1 && header->rank <= header->model_dim);
    tokens = header->tokens;
  } else {
    Check(header.status().code() == absl::StatusCode::kDataLoss);
  }
  // The body bounds tokens (k >= 1 byte per token), so this stays small.
  std::vector<float> out(static_cast<size_t>(tokens * d), kSentinel);
  std::vector<int32_t> ids(static_cast<size_t>(tokens), -1);
  SubspaceSelectors selectors{-5, {7}};
  auto view = lbcc::TensorView::Host(out.data(), {tokens, d});
  Check(view.ok());
  const bool want_ids = forward && codec.basis().vocab_size() > 0;
  const absl::Status status =
      forward ? codec.DecodeForward(payload, *view,
                                    want_ids ? absl::MakeSpan(ids) : absl::Span<int32_t>(),
                                    &selectors)
              : codec.DecodeBackward(payload, *view, &selectors);
  if (!status.ok()) {
    Check(status.code() == absl::StatusCode::kDataLoss ||
          status.code() == absl::StatusCode::kFailedPrecondition ||
          status.code() == absl::StatusCode::kInvalidArgument);
    for (float x : out) Check(std::memcmp(&x, &kSentinel, sizeof(x)) == 0);
    for (int32_t id : ids) Check(id == -1);
    Check(selectors.mixture_block == -5 && selectors.values.size() == 1);
    return;
  }
  Check(header.ok());
  for (int32_t id : ids) {
    if (want_ids) Check(id >= 0 && id < codec.basis().vocab_size());
  }
  if (codec.basis().components() > 1) {
    Check(selectors.mixture_block >= 1);
    Check(static_cast<int64_t>(selectors.values.size()) == header->num_selectors);
    for (uint8_t s : selectors.values) Check(s < codec.basis().components());
    // The backward encoder accepts what the forward decoder hands out.
    auto back = codec.EncodeBackward(*view, selectors);
    Check(back.ok());
  } else {
    Check(selectors.values.empty());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::FuzzCodecs* codecs = new fuzz::FuzzCodecs(fuzz::MakeFuzzCodecs({}));
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::vector<uint8_t> payload(data + 1, data + size);
  if ((mode & fuzz::kFixChecksum) != 0 && payload.size() >= 8) {
    const uint64_t sum = XXH3_64bits(payload.data(), payload.size() - 8);
    std::memcpy(payload.data() + payload.size() - 8, &sum, 8);
  }
  switch ((mode & 7) % fuzz::kTargets) {
    case fuzz::kForwardSingle:
      Decode(codecs->single, true, payload);
      break;
    case fuzz::kBackwardSingle:
      Decode(codecs->single, false, payload);
      break;
    case fuzz::kForwardMixture:
      Decode(codecs->mixture, true, payload);
      break;
    case fuzz::kBackwardMixture:
      Decode(codecs->mixture, false, payload);
      break;
    case fuzz::kForwardNoVocab:
      Decode(codecs->no_vocab, true, payload);
      break;
    case fuzz::kBasisFile: {
      auto basis = lbcc::codecs::SubspaceBasis::Parse(payload);
      if (!basis.ok()) {
        Check(basis.status().code() == absl::StatusCode::kDataLoss);
      } else {
        Check((*basis)->OrthonormalityError() <= 1e-4);
        Check((*basis)->Serialize() == payload);
      }
      break;
    }
  }
  return 0;
}
