// The C API's context-parallel section (comm/lbcc.h over comm/context_ring.h): the K/V ring of
// ring attention, forward and backward.
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/subspace_basis.h"
#include "comm/c_api_internal.h"
#include "comm/context_ring.h"
#include "comm/lbcc.h"

struct lbccContextRing {
  lbccComm* comm = nullptr;
  std::unique_ptr<lbcc::comm::ContextRing> ring;
};

namespace {

using lbcc::comm::RingCodec;

absl::StatusOr<RingCodec> ToRingCodec(const lbccRingCodec_t& c, int64_t dim) {
  if (c.size != sizeof(lbccRingCodec_t)) {
    return absl::InvalidArgumentError(
        "lbccRingCodec_t.size is wrong: initialise it with LBCC_RING_CODEC_INITIALIZER");
  }
  switch (c.kind) {
    case LBCC_RING_RAW_F32:
      return RingCodec::Raw();
    case LBCC_RING_DENSE_BF16:
      return RingCodec::Dense(lbcc::codecs::DenseFormat::kBf16);
    case LBCC_RING_DENSE_FP16:
      return RingCodec::Dense(lbcc::codecs::DenseFormat::kF16);
    case LBCC_RING_SUBSPACE: {
      absl::StatusOr<std::shared_ptr<const lbcc::codecs::SubspaceBasis>> basis;
      if (c.basisPath != nullptr) {
        basis = lbcc::codecs::SubspaceBasis::Load(c.basisPath);
      } else {
        lbcc::codecs::SubspaceSeedSpec spec;
        spec.model_dim = dim;
        spec.rank = c.rank;
        spec.components = c.components;
        spec.seed = c.seed;
        spec.version = c.version;
        basis = lbcc::codecs::SubspaceBasis::FromSeed(spec);
      }
      if (!basis.ok()) return basis.status();
      lbcc::codecs::SubspaceCodecOptions options;
      LBCC_ASSIGN_OR_RETURN(options.coefficient_dtype, ToDType(c.coefficients));
      options.int8_block = c.int8Block;
      options.mixture_block = c.mixtureBlock;
      return RingCodec::Subspace(*std::move(basis), options);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown lbccRingCodecKind_t ", c.kind));
}

// ntensors host views of [tokens, dim] over `buffers` (NULL entries are InvalidArgument).
template <typename T>
absl::StatusOr<std::vector<lbcc::TensorView>> Views(const lbcc::comm::ContextRing& ring,
                                                    T* const* buffers, const char* what) {
  std::vector<lbcc::TensorView> views;
  const auto& o = ring.options();
  for (size_t i = 0; i < o.tensors.size(); ++i) {
    if (buffers[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] is NULL"));
    }
    LBCC_ASSIGN_OR_RETURN(lbcc::TensorView v,
                          lbcc::TensorView::Create(const_cast<float*>(buffers[i]),
                                                   lbcc::DType::kF32, {o.tokens, o.dim}));
    views.push_back(v);
  }
  return views;
}

lbccResult_t Result(const absl::Status& status, lbccContextRing_t ring) {
  return status.ok() ? lbccSuccess : Fail(status, ring->comm);
}

}  // namespace

extern "C" {

lbccResult_t lbccContextRingCreate(lbccComm_t comm, int ntensors, const lbccRingCodec_t* codecs,
                                   int64_t tokens, int64_t dim, lbccContextRing_t* ring) {
  constexpr const char* kName = "lbccContextRingCreate";
  LBCC_C_CHECK_PTR(kName, comm);
  LBCC_C_CHECK_PTR(kName, codecs);
  LBCC_C_CHECK_PTR(kName, ring);
  *ring = nullptr;
  if (ntensors < 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(kName, ": ntensors ", ntensors, " < 1")),
                comm);
  }
  lbcc::comm::ContextRingOptions options;
  for (int i = 0; i < ntensors; ++i) {
    absl::StatusOr<RingCodec> codec = ToRingCodec(codecs[i], dim);
    if (!codec.ok()) {
      return Fail(lbcc::Annotate(codec.status(), absl::StrCat(kName, ": codecs[", i, "]")), comm);
    }
    options.tensors.push_back(*std::move(codec));
  }
  options.tokens = tokens;
  options.dim = dim;
  auto made = lbcc::comm::ContextRing::Create(comm->comm.get(), std::move(options));
  if (!made.ok()) return Fail(lbcc::Annotate(made.status(), kName), comm);
  *ring = new lbccContextRing{comm, *std::move(made)};
  return lbccSuccess;
}

lbccResult_t lbccContextRingDestroy(lbccContextRing_t ring) {
  LBCC_C_CHECK_PTR("lbccContextRingDestroy", ring);
  delete ring;
  return lbccSuccess;
}

lbccResult_t lbccContextRingPayloadBytes(lbccContextRing_t ring, int tensor, size_t* forward,
                                         size_t* backward) {
  LBCC_C_CHECK_PTR("lbccContextRingPayloadBytes", ring);
  if (tensor < 0 || tensor >= static_cast<int>(ring->ring->options().tensors.size())) {
    return Fail(absl::InvalidArgumentError(
                    absl::StrCat("lbccContextRingPayloadBytes: no tensor ", tensor)),
                ring->comm);
  }
  const lbcc::comm::RingPayloadBytes b = ring->ring->payload_bytes(tensor);
  if (forward) *forward = b.forward;
  if (backward) *backward = b.backward;
  return lbccSuccess;
}

lbccResult_t lbccContextRingBeginForward(lbccContextRing_t ring, const float* const* mine,
                                         float* const* mineOut) {
  constexpr const char* kName = "lbccContextRingBeginForward";
  LBCC_C_CHECK_PTR(kName, ring);
  // A bad pointer still takes part (the ring posts an error contribution), so every rank fails
  // this pass alike.
  std::vector<lbcc::TensorView> in, out;
  absl::Status why;
  if (mine == nullptr) {
    why = absl::InvalidArgumentError(absl::StrCat(kName, ": mine is NULL"));
  } else {
    absl::StatusOr<std::vector<lbcc::TensorView>> v = Views(*ring->ring, mine, "mine");
    if (v.ok()) in = *std::move(v);
    why = v.status();
  }
  if (why.ok() && mineOut != nullptr) {
    absl::StatusOr<std::vector<lbcc::TensorView>> v = Views(*ring->ring, mineOut, "mineOut");
    if (v.ok()) out = *std::move(v);
    why = v.status();
  }
  if (!why.ok()) in.clear();  // An empty block is rejected by the ring, on every rank.
  absl::Status s = ring->ring->BeginForward(in, out);
  return Result(why.ok() ? s : why, ring);
}

lbccResult_t lbccContextRingNextForward(lbccContextRing_t ring, float* const* out, int* source) {
  constexpr const char* kName = "lbccContextRingNextForward";
  LBCC_C_CHECK_PTR(kName, ring);
  LBCC_C_CHECK_PTR(kName, out);
  absl::StatusOr<std::vector<lbcc::TensorView>> v = Views(*ring->ring, out, "out");
  if (!v.ok()) return Result(lbcc::Annotate(v.status(), kName), ring);
  absl::StatusOr<int> src = ring->ring->NextForward(*v);
  if (!src.ok()) return Result(src.status(), ring);
  if (source) *source = *src;
  return lbccSuccess;
}

lbccResult_t lbccContextRingEndForward(lbccContextRing_t ring) {
  LBCC_C_CHECK_PTR("lbccContextRingEndForward", ring);
  return Result(ring->ring->EndForward(), ring);
}

lbccResult_t lbccContextRingBeginBackward(lbccContextRing_t ring) {
  LBCC_C_CHECK_PTR("lbccContextRingBeginBackward", ring);
  return Result(ring->ring->BeginBackward(), ring);
}

lbccResult_t lbccContextRingPassGradient(lbccContextRing_t ring,
                                         const float* const* contribution, int* owner) {
  constexpr const char* kName = "lbccContextRingPassGradient";
  LBCC_C_CHECK_PTR(kName, ring);
  LBCC_C_CHECK_PTR(kName, contribution);
  absl::StatusOr<std::vector<lbcc::TensorView>> v =
      Views(*ring->ring, contribution, "contribution");
  if (!v.ok()) return Result(lbcc::Annotate(v.status(), kName), ring);
  absl::StatusOr<int> got = ring->ring->PassGradient(*v);
  if (!got.ok()) return Result(got.status(), ring);
  if (owner) *owner = *got;
  return lbccSuccess;
}

lbccResult_t lbccContextRingEndBackward(lbccContextRing_t ring, float* const* out) {
  constexpr const char* kName = "lbccContextRingEndBackward";
  LBCC_C_CHECK_PTR(kName, ring);
  LBCC_C_CHECK_PTR(kName, out);
  absl::StatusOr<std::vector<lbcc::TensorView>> v = Views(*ring->ring, out, "out");
  if (!v.ok()) return Result(lbcc::Annotate(v.status(), kName), ring);
  return Result(ring->ring->EndBackward(*v), ring);
}

}  // extern "C"
