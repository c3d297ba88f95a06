// The C API's pipeline activations section (comm/lbcc.h over comm/activations.h): bases,
// activations and their gradients, table refreshes and their deltas.
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "comm/activations.h"
#include "comm/c_api_internal.h"
#include "comm/lbcc.h"

struct lbccBasis {
  lbcc::comm::SubspaceBasisPtr basis;
};

namespace {

// A handle over `basis`; a mixture basis is refused (the C API carries no selectors).
lbccResult_t NewBasis(absl::StatusOr<lbcc::comm::SubspaceBasisPtr> made, const char* function,
                      lbccBasis_t* out) {
  if (!made.ok()) return Fail(lbcc::Annotate(made.status(), function));
  if ((*made)->components() != 1) {
    return Fail(absl::UnimplementedError(absl::StrCat(
        function, ": a mixture basis (M = ", (*made)->components(),
        ") needs the forward's selectors for its backward, which the C API does not carry: "
        "use the C++ ActivationChannel")));
  }
  *out = new lbccBasis{*std::move(made)};
  return lbccSuccess;
}

absl::StatusOr<lbcc::codecs::SubspaceCodecOptions> ActivationOptions(
    const lbccActivationConfig_t* config) {
  lbcc::codecs::SubspaceCodecOptions options;
  if (config == nullptr) return options;
  if (config->size != sizeof(lbccActivationConfig_t)) {
    return absl::InvalidArgumentError(
        "lbccActivationConfig_t.size is wrong: use LBCC_ACTIVATION_CONFIG_INITIALIZER");
  }
  LBCC_ASSIGN_OR_RETURN(options.coefficient_dtype, ToDType(config->coefficients));
  options.int8_block = config->int8Block;
  return options;  // The codec checks the values (f32, bf16, f16 or i8; the block's range).
}

absl::StatusOr<std::vector<lbcc::comm::SubspaceBasisPtr>> AcceptedBases(const lbccBasis_t* bases,
                                                                        int nbases) {
  if (nbases < 1) return absl::InvalidArgumentError(absl::StrCat("nbases ", nbases, " < 1"));
  std::vector<lbcc::comm::SubspaceBasisPtr> accepted;
  for (int i = 0; i < nbases; ++i) {
    if (bases[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("bases[", i, "] is NULL"));
    }
    accepted.push_back(bases[i]->basis);
  }
  return accepted;
}

// The receiving calls' checks: the handles, then the bases a payload may name (newest first)
// into `accepted`.
lbccResult_t CheckReceive(const char* kName, lbccComm_t comm, lbccRequest_t* request,
                          const lbccBasis_t* bases, int nbases,
                          std::vector<lbcc::comm::SubspaceBasisPtr>* accepted) {
  LBCC_C_CHECK_PTR(kName, comm);
  LBCC_C_CHECK_PTR(kName, request);
  LBCC_C_CHECK_PTR(kName, bases);
  absl::StatusOr<std::vector<lbcc::comm::SubspaceBasisPtr>> found = AcceptedBases(bases, nbases);
  if (!found.ok()) return Fail(lbcc::Annotate(found.status(), kName), comm);
  *accepted = *std::move(found);
  return lbccSuccess;
}

// A host f32 view of [tokens, d].
absl::StatusOr<lbcc::TensorView> TokensView(const float* data, int64_t tokens,
                                            const lbcc::codecs::SubspaceBasis& basis) {
  const int64_t d = basis.model_dim();
  if (tokens < 0 || tokens > INT64_MAX / 8 / d) {
    return absl::InvalidArgumentError(absl::StrCat("bad tokens ", tokens));
  }
  if (tokens > 0 && data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("NULL buffer for ", tokens, " tokens"));
  }
  return lbcc::TensorView::Host(const_cast<float*>(data), {tokens, d});
}

// The ids of `tokens` tokens for `basis`: none when it has no vocabulary (or ids is NULL on a
// receive).
absl::StatusOr<absl::Span<int32_t>> IdSpan(const int32_t* ids, int64_t tokens,
                                           const lbcc::codecs::SubspaceBasis& basis,
                                           bool required) {
  if (basis.vocab_size() == 0 || tokens == 0 || (ids == nullptr && !required)) {
    return absl::Span<int32_t>();
  }
  if (ids == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ids is NULL, but basis ", basis.id().ToString(), " has a vocabulary of ",
        basis.vocab_size()));
  }
  return absl::Span<int32_t>(const_cast<int32_t*>(ids), static_cast<size_t>(tokens));
}

}  // namespace

extern "C" {

lbccResult_t lbccBasisCreateFromSeed(const lbccBasisSpec_t* spec, lbccBasis_t* basis) {
  LBCC_C_CHECK_PTR("lbccBasisCreateFromSeed", spec);
  LBCC_C_CHECK_PTR("lbccBasisCreateFromSeed", basis);
  *basis = nullptr;
  if (spec->size != sizeof(lbccBasisSpec_t)) {
    return Fail(absl::InvalidArgumentError(
        "lbccBasisSpec_t.size is wrong: initialise it with LBCC_BASIS_SPEC_INITIALIZER"));
  }
  lbcc::codecs::SubspaceSeedSpec s;
  s.model_dim = spec->modelDim;
  s.rank = spec->rank;
  s.vocab_size = spec->vocabSize;
  s.with_table = spec->withTable != 0;
  s.table_stddev = spec->tableStddev;
  s.seed = spec->seed;
  s.version = spec->version;
  return NewBasis(lbcc::codecs::SubspaceBasis::FromSeed(s), "lbccBasisCreateFromSeed", basis);
}

lbccResult_t lbccBasisLoad(const char* path, lbccBasis_t* basis) {
  LBCC_C_CHECK_PTR("lbccBasisLoad", path);
  LBCC_C_CHECK_PTR("lbccBasisLoad", basis);
  *basis = nullptr;
  return NewBasis(lbcc::codecs::SubspaceBasis::Load(path), "lbccBasisLoad", basis);
}

lbccResult_t lbccBasisDestroy(lbccBasis_t basis) {
  LBCC_C_CHECK_PTR("lbccBasisDestroy", basis);
  delete basis;
  return lbccSuccess;
}

lbccResult_t lbccBasisGetInfo(const lbccBasis_t basis, int64_t* model_dim, int64_t* rank,
                              int64_t* vocab_size, uint64_t* hash, uint32_t* version) {
  LBCC_C_CHECK_PTR("lbccBasisGetInfo", basis);
  const lbcc::codecs::SubspaceBasis& b = *basis->basis;
  if (model_dim) *model_dim = b.model_dim();
  if (rank) *rank = b.rank();
  if (vocab_size) *vocab_size = b.vocab_size();
  if (hash) *hash = b.id().hash;
  if (version) *version = b.id().version;
  return lbccSuccess;
}

lbccResult_t lbccSendActivations(const float* h, const int32_t* ids, int64_t tokens,
                                 lbccBasis_t basis, const lbccActivationConfig_t* config,
                                 int peer, uint32_t tag, lbccComm_t comm,
                                 lbccRequest_t* request) {
  const char* kName = "lbccSendActivations";
  LBCC_C_CHECK_PTR(kName, comm);
  LBCC_C_CHECK_PTR(kName, request);
  LBCC_C_CHECK_PTR(kName, basis);
  absl::StatusOr<lbcc::TensorView> view = TokensView(h, tokens, *basis->basis);
  if (!view.ok()) return Fail(lbcc::Annotate(view.status(), kName), comm);
  absl::StatusOr<absl::Span<int32_t>> id_span = IdSpan(ids, tokens, *basis->basis, true);
  if (!id_span.ok()) return Fail(lbcc::Annotate(id_span.status(), kName), comm);
  absl::StatusOr<lbcc::codecs::SubspaceCodecOptions> options = ActivationOptions(config);
  if (!options.ok()) return Fail(options.status(), comm);
  return Finish(lbcc::comm::SendActivations(*comm->comm, *view, *id_span, basis->basis, *options,
                                            peer, tag),
                comm, request);
}

lbccResult_t lbccRecvActivations(float* h, int32_t* ids, int64_t tokens, const lbccBasis_t* bases,
                                 int nbases, int peer, uint32_t tag, lbccComm_t comm,
                                 lbccRequest_t* request) {
  const char* kName = "lbccRecvActivations";
  std::vector<lbcc::comm::SubspaceBasisPtr> accepted;
  const lbccResult_t checked = CheckReceive(kName, comm, request, bases, nbases, &accepted);
  if (checked != lbccSuccess) return checked;
  const lbcc::codecs::SubspaceBasis& newest = *accepted.front();
  absl::StatusOr<lbcc::TensorView> view = TokensView(h, tokens, newest);
  if (!view.ok()) return Fail(lbcc::Annotate(view.status(), kName), comm);
  absl::StatusOr<absl::Span<int32_t>> id_span = IdSpan(ids, tokens, newest, false);
  if (!id_span.ok()) return Fail(lbcc::Annotate(id_span.status(), kName), comm);
  return Finish(lbcc::comm::RecvActivations(*comm->comm, *view, *id_span, std::move(accepted),
                                            peer, tag),
                comm, request);
}

lbccResult_t lbccSendActivationGrads(const float* grads, int64_t tokens, lbccBasis_t basis,
                                     const lbccActivationConfig_t* config, int peer, uint32_t tag,
                                     lbccComm_t comm, lbccRequest_t* request) {
  const char* kName = "lbccSendActivationGrads";
  LBCC_C_CHECK_PTR(kName, comm);
  LBCC_C_CHECK_PTR(kName, request);
  LBCC_C_CHECK_PTR(kName, basis);
  absl::StatusOr<lbcc::TensorView> view = TokensView(grads, tokens, *basis->basis);
  if (!view.ok()) return Fail(lbcc::Annotate(view.status(), kName), comm);
  absl::StatusOr<lbcc::codecs::SubspaceCodecOptions> options = ActivationOptions(config);
  if (!options.ok()) return Fail(options.status(), comm);
  return Finish(lbcc::comm::SendActivationGrads(*comm->comm, *view, basis->basis, *options, {},
                                                peer, tag),
                comm, request);
}

lbccResult_t lbccRecvActivationGrads(float* grads, int64_t tokens, const lbccBasis_t* bases,
                                     int nbases, int peer, uint32_t tag, lbccComm_t comm,
                                     lbccRequest_t* request) {
  const char* kName = "lbccRecvActivationGrads";
  std::vector<lbcc::comm::SubspaceBasisPtr> accepted;
  const lbccResult_t checked = CheckReceive(kName, comm, request, bases, nbases, &accepted);
  if (checked != lbccSuccess) return checked;
  absl::StatusOr<lbcc::TensorView> view = TokensView(grads, tokens, *accepted.front());
  if (!view.ok()) return Fail(lbcc::Annotate(view.status(), kName), comm);
  return Finish(lbcc::comm::RecvActivationGrads(*comm->comm, *view, std::move(accepted), peer,
                                                tag),
                comm, request);
}

lbccResult_t lbccBasisRefreshTable(lbccBasis_t basis, float* embedding,
                                   lbccTableRefreshMode_t mode, lbccBasis_t* next) {
  const char* kName = "lbccBasisRefreshTable";
  LBCC_C_CHECK_PTR(kName, basis);
  LBCC_C_CHECK_PTR(kName, next);
  *next = nullptr;
  lbcc::codecs::TableRefreshMode refresh;
  switch (mode) {
    case LBCC_TABLE_LOSSY:
      refresh = lbcc::codecs::TableRefreshMode::kLossy;
      break;
    case LBCC_TABLE_CONSTRAINED:
      refresh = lbcc::codecs::TableRefreshMode::kConstrained;
      break;
    default:
      return Fail(absl::InvalidArgumentError(
          absl::StrCat(kName, ": unknown lbccTableRefreshMode_t ", static_cast<int>(mode))));
  }
  const lbcc::codecs::SubspaceBasis& b = *basis->basis;
  const int64_t v = b.vocab_size(), d = b.model_dim();
  if (v > 0 && embedding == nullptr) return NullArgument(kName, "embedding");
  absl::StatusOr<lbcc::TensorView> view = lbcc::TensorView::Host(embedding, {v, d});
  if (!view.ok()) return Fail(lbcc::Annotate(view.status(), kName));
  return NewBasis(lbcc::codecs::RefreshTable(b, *view, refresh,
                                             lbcc::codecs::SubspaceArithmetic::kPortable),
                  kName, next);
}

lbccResult_t lbccSendTableUpdate(const float* before, const float* after, size_t count, int peer,
                                 uint32_t tag, lbccComm_t comm, size_t* bytes,
                                 lbccRequest_t* request) {
  const char* kName = "lbccSendTableUpdate";
  LBCC_C_CHECK_PTR(kName, comm);
  LBCC_C_CHECK_PTR(kName, request);
  if (count > 0) {
    LBCC_C_CHECK_PTR(kName, before);
    LBCC_C_CHECK_PTR(kName, after);
  }
  return Finish(lbcc::comm::SendTableUpdate(*comm->comm, absl::MakeConstSpan(before, count),
                                            absl::MakeConstSpan(after, count), peer, tag, bytes),
                comm, request);
}

lbccResult_t lbccRecvTableUpdate(float* table, size_t count, int peer, uint32_t tag,
                                 lbccComm_t comm, size_t* bytes, lbccRequest_t* request) {
  const char* kName = "lbccRecvTableUpdate";
  LBCC_C_CHECK_PTR(kName, comm);
  LBCC_C_CHECK_PTR(kName, request);
  if (count > 0) LBCC_C_CHECK_PTR(kName, table);
  return Finish(lbcc::comm::RecvTableUpdate(*comm->comm, absl::MakeSpan(table, count), peer, tag,
                                            bytes),
                comm, request);
}

}  // extern "C"
