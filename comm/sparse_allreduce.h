// SparseAllReduce as a schedule of named phases (Communicator::SparseAllReduce, communicator.h,
// is the API; this is how one call runs). One SparseAllReduceSchedule object per call holds the
// call's state as members; its phases run in this order:
//
//   0. Header        worker thread  the operation header round (signature.h) is in flight
//                                   from the start; its verdict is waited for before the first
//                                   message is posted, so it overlaps the first encode
//   1. Plan          worker thread  exchange groups of consecutive tensors, each group's
//                                   all-gather algorithm and tag steps, which groups stream in
//                                   pieces: the same on every rank (shapes, codec, topology only)
//   2. Encode/stream worker thread  group by group into a blob, posted at once as an
//                                   AllGatherTask (comm/collectives.h); a streamed group's pieces
//                                   are posted while the encode runs, each its own task
//   3. Exchange      pool thread    group by group: waits for the group's tasks, rebuilds
//                                   streamed blobs, notices a rank that gave up
//   4. Validate      pool thread    every payload checked in full (codecs::PrepareDecode stages
//                                   host decodes), while later groups are still on the wire
//   5. Agree, then   worker thread  every surviving rank agrees on commit or abort
//      decode/commit                (comm/agreement.h); then outputs written and states
//      or abort                     committed, or every state aborted and no output written
//
// Phases 2 and 3-4 overlap: the communicator's thread pool (comm/thread_pool.h) runs 3-4 while
// the worker encodes; the all-gathers run on transport completions. No thread is started per call.
// Wire format (comm/sparse_blob.h) and error semantics are those of communicator.h.
//
// Thread-safety: one Run() per object, on the communicator's worker thread.
#ifndef LBCC_COMM_SPARSE_ALLREDUCE_H_
#define LBCC_COMM_SPARSE_ALLREDUCE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "codecs/codec.h"
#include "comm/agreement.h"
#include "comm/algorithms.h"
#include "comm/collectives.h"
#include "comm/communicator.h"
#include "comm/signature.h"
#include "comm/thread_pool.h"
#include "comm/topology.h"
#include "kernels/device_codec.h"

namespace lbcc::comm::internal {

class PieceSender;  // streams a large tensor's leading payload bytes (sparse_allreduce.cc)

// Groups: a group holds consecutive tensors totalling at least max(total / max_groups,
// min_elements) elements (one large tensor is one group). Returns [begin, end) tensor ranges;
// one empty group for no tensors.
std::vector<std::pair<size_t, size_t>> PlanGroups(
    const std::vector<Communicator::SparseTensor>& tensors, int max_groups, int64_t min_elements);

// The smallest exchange group in elements: options.sparse_group_elements, or else
// LBCC_SPARSE_GROUP_ELEMENTS (InvalidArgument naming it when malformed). Resolved once per call.
int64_t ResolveSparseGroupElements(const OpOptions& options, const CommConfig& config);

class SparseAllReduceSchedule {
 public:
  // What the communicator lends one call; all of it must outlive Run().
  struct Resources {
    const Group* group = nullptr;
    transport::Tag tag = 0;  // the operation's tag base
    absl::Time deadline;
    const Topology* topology = nullptr;
    ThreadPool* pool = nullptr;                // runs phases 3-4; no other job may wait on it
    std::vector<uint8_t>* encode_buffer = nullptr;                       // reused across calls
    std::vector<std::unique_ptr<codecs::DecodeScratch>>* decode_scratch = nullptr;  // ditto
    Algorithm configured = Algorithm::kAuto;   // CommConfig's choice for the payload exchange
    // Makes the outcome the same on every surviving rank before anything is written (the
    // Fabric's vote agreement); null: each rank concludes on its own.
    OutcomeAgreement* agreement = nullptr;
    // Where the phases' times are added (encode, wire_wait, agreement, decode, validate); null:
    // not measured.
    SparseAllReduceProfile* profile = nullptr;
    // The operation's header round, started by the caller: finished before this rank's first
    // message is posted (the encode of the first piece overlaps it). Null: already checked.
    SignatureCheck* header = nullptr;
  };

  SparseAllReduceSchedule(const Resources& resources,
                          const std::vector<Communicator::SparseTensor>& tensors,
                          const codecs::Codec& codec, const codecs::DecodeOptions& decode,
                          const OpOptions& options, int64_t min_elements);
  ~SparseAllReduceSchedule();

  // Runs every phase; returns when the pool's part is over and every task drained.
  absl::Status Run();
  // Whether Run() failed in the header round (its verdict, before any data was sent: every
  // state aborted).
  bool header_failed() const { return !header_status_.ok(); }

 private:
  // One exchange group's traffic: its messages (one, or kStreamPieces pieces and a final one).
  struct GroupExchange {
    std::string blob;  // streamed: this rank's blob (otherwise it travels as messages[0])
    std::vector<std::unique_ptr<AllGatherTask>> messages;  // posted by the encoder
    std::vector<std::string> assembled;                    // streamed: every rank's blob
    const std::vector<std::string>* all = nullptr;         // every rank's blob, once exchanged
  };

  // 1.
  absl::Status Plan();
  void PrepareDecodeScratch();
  // 2. (worker)
  void EncodeAndStream();
  void EncodeGroup(int g, bool placeholder);
  absl::Status EncodeTensorInto(size_t i, PieceSender* pieces, std::string* blob,
                                size_t* stream_prefix);
  bool PassHeader();
  void PostMessage(int g, std::string message);
  // 3-4. (pool)
  void ExchangeAndValidate();
  absl::Status Receive(int g);
  bool SomeoneGaveUp(int g);
  absl::Status Validate(int g);
  // 5. (worker)
  absl::Status DrainTasks();
  absl::Status Conclude();
  absl::Status DecodeAndCommit();
  void AbortStates();

  const Group& group_;
  const transport::Tag tag_;
  const absl::Time deadline_;
  const Topology& topology_;
  ThreadPool* const pool_;
  std::vector<uint8_t>& encode_buffer_;
  std::vector<std::unique_ptr<codecs::DecodeScratch>>& decode_scratch_;
  const std::vector<Communicator::SparseTensor>& tensors_;
  const codecs::Codec& codec_;
  const codecs::DecodeOptions decode_;
  const OpOptions options_;
  const Algorithm configured_;
  OutcomeAgreement* const agreement_;
  SparseAllReduceProfile* const profile_;
  SignatureCheck* const header_;
  const int64_t min_elements_;

  // Plan (written before the pool starts, then read-only).
  std::vector<std::pair<size_t, size_t>> plan_;  // [begin, end) tensors per group
  std::vector<Algorithm> algorithms_;
  bool direct_ = false;              // every group direct: all messages of a group on one tag
  uint32_t steps_ = 0;               // tag steps one all-gather may use
  std::vector<int> pieces_;          // streamed pieces per group (0: one message)
  std::vector<uint32_t> first_step_;  // group g's tag steps start at tag_ + first_step_[g]
  // groups_[g] is written by the encoder before encoded_ passes g, then by the pool.
  std::vector<GroupExchange> groups_;

  // Encoder only.
  absl::Status local_;  // why this rank gave up
  bool header_passed_ = false;
  absl::Status header_status_;  // the header round's verdict when it failed (then read by Run)
  absl::Duration header_wait_;  // blocked in the header round's Finish
  std::unique_ptr<kernels::DeviceScratch> encode_scratch_;

  Mutex mu_;
  int encoded_ ABSL_GUARDED_BY(mu_) = 0;           // groups posted
  bool stop_encoding_ ABSL_GUARDED_BY(mu_) = false;  // someone gave up: placeholders from now
  bool exchange_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool exchange_done_ ABSL_GUARDED_BY(mu_) = false;  // the pool's part is over
  bool header_failed_ ABSL_GUARDED_BY(mu_) = false;  // nothing is posted, the pool stops

  // Pool only until exchange_done_.
  absl::Status exchanged_;  // the first group whose all-gather failed
  absl::Status invalid_;    // the first bad payload, or the first rank that gave up
  int groups_exchanged_ = 0;
  absl::Duration validating_;  // time spent in Validate
  absl::Time concluded_;       // Conclude: the agreement's end
  // per_rank_[r]: rank r's payloads, tensor by tensor (spans into the groups' blobs).
  std::vector<std::vector<absl::Span<const uint8_t>>> per_rank_;
};

}  // namespace lbcc::comm::internal

#endif  // LBCC_COMM_SPARSE_ALLREDUCE_H_
