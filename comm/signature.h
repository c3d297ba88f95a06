// Signatures of collective operations: what every rank must agree on before an operation's data
// is used, and the check that compares them.
//
// Every collective a Communicator runs has a sequence number (its position in the posting order,
// which its tags carry too) and a Signature: the operation's name and the fields that must be
// the same on every rank (dtype, count, reduction, root, codec and its options, aggregation, the
// algorithm chosen, the settings that must match such as LBCC_ALGO and
// LBCC_SPARSE_GROUP_ELEMENTS, a hash of the topology). Before an operation runs, every rank
// sends every peer a 24-byte header (CheckSignatures) with the sequence number and a 64-bit
// hash of the signature, or, when this rank rejected its own arguments, an error contribution
// carrying the error text. Every rank receives every peer's header, so every rank reaches the
// same verdict:
//   - all headers equal: the operation runs;
//   - an error contribution from some rank: the operation fails on every rank with
//     InvalidArgument naming the lowest such rank and its message; nothing else was sent, so the
//     ranks stay in step and the communicator stays usable;
//   - hashes (or sequence numbers) differ: every rank sends every peer its full signature and
//     every rank fails with FailedPrecondition naming rank 0 and the first rank that differs
//     from it, and the first field they differ on ("rank 0 and rank 2 disagree on op 5's dtype:
//     float32 vs float64"). The communicator stays usable.
// Wire format of the header (little-endian): u32 magic 'LBSG', u8 version 1, u8 kind (0: a
// signature hash, 1: an error contribution, 2: a full signature, 3: a signature hash followed
// by the operation's data), u16 zero, u64 sequence, u64 hash; an error contribution appends its
// message, a full signature its Serialize() bytes, kind 3 the data.
// The headers use the operation's tag steps kSignatureStep and kSignatureStep + 1
// (comm/collectives.h), below kFirstP2pStep, so Communicator::ReleaseTags covers them.
//
// Small direct collectives (all-reduce up to 64 KiB) carry the header in their one data round
// instead (ExchangeWithHeader): every rank sends every peer [header | data] at kSignatureStep,
// and checks every peer's header before it uses any data. A peer that runs another operation at
// this position sends its own first message at the same tag (a bare header, or [header | data]),
// so both sides meet, see that the headers differ and go on to the full-signature exchange, the
// same verdicts as above on every rank.
//
// Measurement only: built with -DLBCC_MEASURE_WITHOUT_HEADER (bench/signature_overhead.sh passes
// it for signature.cc alone, through --per_file_copt, into a separate baseline binary), no
// header is sent at all: CheckSignatures returns at once and ExchangeWithHeader sends the bare
// data. Nothing is checked then; never ship such a build.
//
// Thread-safety: Signature is a value; CheckSignatures runs on the communicator's worker thread.
#ifndef LBCC_COMM_SIGNATURE_H_
#define LBCC_COMM_SIGNATURE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/tensor_view.h"
#include "codecs/codec.h"
#include "comm/algorithms.h"
#include "comm/collectives.h"

namespace lbcc::comm {

// (name, value) pairs in a fixed order; the first is ("op", operation name).
class Signature {
 public:
  using Field = std::pair<std::string, std::string>;
  using Fields = std::vector<Field>;

  Signature() = default;
  // `settings`: the communicator's fields every operation shares (Communicator makes them once),
  // hashed once into `settings_hash` (HashFields(*settings)).
  Signature(absl::string_view op, std::shared_ptr<const Fields> settings, uint64_t settings_hash);

  Signature& Add(absl::string_view name, absl::string_view value);
  Signature& Add(absl::string_view name, int64_t value);
  Signature& Add(absl::string_view name, const char* value) {
    return Add(name, absl::string_view(value));
  }

  const std::string& op() const { return op_fields_[0].second; }
  // The 64-bit hash of every field (settings, then the operation's): FNV-1a.
  uint64_t Hash() const;
  // Every field, settings first; Parse() reads it back.
  std::string Serialize() const;
  static absl::StatusOr<Fields> Parse(absl::string_view bytes);
  Fields AllFields() const;

  static uint64_t HashFields(const Fields& fields, uint64_t seed = kFnvOffset);

 private:
  static constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
  std::shared_ptr<const Fields> settings_;
  uint64_t settings_hash_ = kFnvOffset;
  Fields op_fields_;
};

// The first field on which `a` (rank `rank_a`'s) and `b` differ, as "rank 0 and rank 2 disagree
// on op 5's dtype: float32 vs float64" (a missing field reads "(none)").
std::string DescribeMismatch(int rank_a, const Signature::Fields& a, int rank_b,
                             const Signature::Fields& b, uint64_t sequence);

// Adds SparseAllReduce's fields to `signature`: the codec (name and options), aggregation,
// accumulate, the exchange group size, the algorithm asked for and every tensor's shape.
void AddSparseAllReduceFields(Signature& signature, const codecs::Codec& codec,
                              const codecs::DecodeOptions& decode, int64_t group_elements,
                              Algorithm requested, const std::vector<const Shape*>& shapes);

// The exchange described at the top, among the ranks of `group`, for the operation whose tag
// base is `tag` and sequence number `sequence`. `rejection`: OK, or why this rank rejected its
// arguments (then this rank sends an error contribution and gets `rejection` back). Errors:
// InvalidArgument (some rank rejected its arguments), FailedPrecondition (signatures differ),
// DataLoss (a peer's header is malformed: the Fabric is aborted), and the Fabric's Unavailable /
// DeadlineExceeded (naming the ranks that did not answer) / Cancelled.
absl::Status CheckSignatures(const Group& group, transport::Tag tag, uint64_t sequence,
                             const Signature& mine, const absl::Status& rejection,
                             absl::Time deadline);

// CheckSignatures in two halves, so that an operation can prepare its first data while the
// headers travel (SparseAllReduce encodes its first group meanwhile): Start() sends this rank's
// header and posts the receives, Finish() waits for every peer's and returns CheckSignatures'
// verdict (the same errors, on every rank alike). The operation sends none of its data before
// Finish() returned OK. Finish() is called once; the destructor calls it when the caller did not
// (an early return), so no receive outlives the check.
class SignatureCheck {
 public:
  struct Round;  // signature.cc

  static std::unique_ptr<SignatureCheck> Start(const Group& group, transport::Tag tag,
                                               uint64_t sequence, const Signature& mine,
                                               absl::Time deadline);
  ~SignatureCheck();
  absl::Status Finish();

 private:
  SignatureCheck(const Group& group, transport::Tag tag, uint64_t sequence, const Signature& mine,
                 absl::Time deadline);

  const Group& group_;
  const transport::Tag tag_;
  const uint64_t sequence_;
  const Signature& mine_;
  const absl::Time deadline_;
  std::shared_ptr<Round> round_;  // null: nothing to wait for (one rank, or finished)
  absl::Status verdict_;
};

// The operation header's size, and the most data ExchangeWithHeader carries after it.
inline constexpr size_t kOperationHeaderBytes = 24;
inline constexpr size_t kMaxHeaderData = size_t{64} << 10;

// One direct round with the header in the data (see the top): `data` (at most kMaxHeaderData
// bytes) with this rank's header to every peer of `group`, every peer's into (*rows)[i] (group
// order; this rank's own data too), all of the same size, viewing (*storage). Every peer's
// header is checked before this returns OK, with the verdicts and errors of CheckSignatures
// (this rank takes no rejection: a rejected call goes through CheckSignatures); a peer whose
// header matches but whose data has another size is DataLoss (the Fabric is aborted).
absl::Status ExchangeWithHeader(const Group& group, transport::Tag tag, uint64_t sequence,
                                const Signature& mine, absl::Span<const uint8_t> data,
                                std::vector<std::string>* storage,
                                std::vector<absl::Span<const uint8_t>>* rows, absl::Time deadline);

}  // namespace lbcc::comm

#endif  // LBCC_COMM_SIGNATURE_H_
