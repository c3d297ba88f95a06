// Communicator: LBCC's C++ API, in NCCL's shape. A communicator is a group of ranks that run
// collectives together; ranks post operations in the same order, each post returns a Request
// (comm/request.h) at once, and the communicator's worker thread runs them in order.
//
//   LBCC_ASSIGN_OR_RETURN(UniqueId id, CreateUniqueId("10.0.0.1", absl::Minutes(5)));  // one rank
//   ... send id to every rank ...
//   LBCC_ASSIGN_OR_RETURN(auto comm, Communicator::Init(id, nranks, rank, config));
//   RequestPtr r = comm->AllReduce(grad, grad, ReduceOp::kAvg);
//   LBCC_RETURN_IF_ERROR(r->Wait());
//
// Every collective is checked before its data is used (comm/signature.h): its sequence number
// and a hash of its signature (operation, dtype, counts, reduction, root, codec, algorithm,
// settings that must match, topology) against every peer's. Ranks that disagree fail that
// operation on every rank with FailedPrecondition naming two ranks and the field; a call whose
// arguments are rejected (InvalidArgument) still takes part with an error contribution, so
// every rank fails that operation too and the ranks stay in step. Neither aborts anything.
//
// Failure semantics (like NCCL's): an operation that fails (peer lost, timeout, corrupt data)
// aborts the communicator's connections, so every rank's pending operation fails within the
// timeout instead of hanging; later operations fail with FailedPrecondition naming the first
// error. Recreate the communicator to continue.
//
// Communicators made by Split() share their parent's connections and configuration; destroying
// the parent while children live is fine (the connections live until the last one is gone).
//
// Configuration (comm/config.h) is resolved once, in Init: explicit CommConfig fields, else the
// environment, else defaults. Every collective picks its algorithm through the one selection
// table (comm/algorithms.h) with the config's choices; nothing reads the environment later.
//
// Thread-safety: posting from several threads is allowed but ranks must agree on the order of
// operations, so post from one thread per rank. Requests are thread-safe.
#ifndef LBCC_COMM_COMMUNICATOR_H_
#define LBCC_COMM_COMMUNICATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "base/tensor_view.h"
#include "codecs/codec.h"
#include "comm/algorithms.h"
#include "comm/bootstrap.h"
#include "comm/collectives.h"
#include "comm/config.h"
#include "comm/fabric.h"
#include "comm/request.h"
#include "comm/signature.h"
#include "comm/thread_pool.h"

namespace lbcc::comm {

// Per-operation options, in the spirit of Gloo's options objects. Defaults: the communicator's
// timeout, the selection table's algorithm, normal priority.
struct OpOptions {
  absl::Duration timeout = absl::ZeroDuration();  // Zero: the communicator's (CommConfig).
  Algorithm algorithm = Algorithm::kAuto;          // kAuto: CommConfig's, else the table's.
  transport::Priority priority = transport::Priority::kNormal;
  // The raw-buffer collectives: also exchange a textual fingerprint of the call first (one more
  // small all-gather; InvalidArgument naming the first rank that differs), for what the
  // operation's signature does not cover.
  bool verify = false;
  // SparseAllReduce: smallest exchange group in elements (0: CommConfig's, whose default is
  // LBCC_SPARSE_GROUP_ELEMENTS). Every rank must pass the same value.
  int64_t sparse_group_elements = 0;
};

// Reads LBCC_TRANSPORT, LBCC_LISTEN_ADDR and LBCC_TIMEOUT_S.
absl::StatusOr<FabricOptions> FabricOptionsFromEnv();

class AnySourceReceives;
std::shared_ptr<AnySourceReceives> NewAnySourceReceives();

// Where this rank's SparseAllReduce time went, summed over calls (Communicator::
// sparse_profile()). The phases of one call, in order on the worker thread: the operation-header
// round (signatures, before any data), the encode (and posting) of every group, the wait for the
// last group to arrive and be validated after the encode ended, the commit-or-abort decision,
// and the decode of the outputs and commit of the states; `total` is the whole call. `validate`
// is the exchange thread's payload checking, which runs while the wire and the encode do (so it
// is not part of the sum). bench/lbcc_perf --profile prints it per rank.
struct SparseAllReduceProfile {
  int64_t calls = 0;
  absl::Duration header, encode, wire_wait, agreement, decode, total, validate;
  SparseAllReduceProfile& operator+=(const SparseAllReduceProfile& o);
  SparseAllReduceProfile operator-(const SparseAllReduceProfile& o) const;
};

class Communicator {
 public:
  // Joins the job named by `id` as `rank` of `nranks` (blocks until every rank joined or the
  // timeout). Resolves `config` first (ResolveConfig) and checks the environment
  // (CheckEnvironment: warnings, or errors with strict_env). Errors: InvalidArgument (a bad
  // setting, named), DeadlineExceeded, Unavailable (see bootstrap.h, fabric.h).
  static absl::StatusOr<std::unique_ptr<Communicator>> Init(const UniqueId& id, int nranks,
                                                             int rank, CommConfig config = {});
  // The same, stoppable from another thread: once `cancel` is cancelled, a set-up in progress
  // returns its status (Cancelled) promptly (FabricOptions::cancel; elastic epochs superseded
  // while they are set up).
  static absl::StatusOr<std::unique_ptr<Communicator>> Init(const UniqueId& id, int nranks,
                                                             int rank, CommConfig config,
                                                             std::shared_ptr<Cancellation> cancel);
  // The same with every FabricOptions field explicit (ConfigFromFabricOptions).
  static absl::StatusOr<std::unique_ptr<Communicator>> Init(const UniqueId& id, int nranks,
                                                             int rank, FabricOptions options);

  // Joins from the launcher's environment: torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
  // LBCC's root listens on MASTER_PORT + 1 unless LBCC_BOOTSTRAP_ADDR is set) or Open MPI's
  // mpirun (OMPI_COMM_WORLD_RANK/SIZE with LBCC_BOOTSTRAP_ADDR). Rank 0 starts the root.
  static absl::StatusOr<std::unique_ptr<Communicator>> InitFromEnvironment(CommConfig config = {});
  static absl::StatusOr<std::unique_ptr<Communicator>> InitFromEnvironment(FabricOptions options);

  ~Communicator();  // Fails queued operations with Cancelled, waits for the running one.

  int rank() const { return group_.me; }
  int nranks() const { return group_.size(); }
  // This rank's number in the job (the Fabric), and every member's.
  int global_rank() const { return group_.ranks[group_.me]; }
  const std::vector<int>& global_ranks() const { return group_.ranks; }
  const Topology& topology() const { return fabric_->topology(); }
  Fabric* fabric() const { return fabric_.get(); }
  // The resolved configuration: every field but `topology` (see topology()) is set.
  const CommConfig& config() const { return config_; }
  // The algorithm `collective` runs with over `group` for `bytes_per_rank`: `requested` unless
  // kAuto, else config()'s choice unless kAuto, else the selection table's (SelectAlgorithm).
  absl::StatusOr<Algorithm> ChooseAlgorithm(Collective collective, const Group& group,
                                            size_t bytes_per_rank, Algorithm requested) const;

  // Like ncclCommSplit: ranks passing the same color form a new communicator, ordered by (key,
  // rank); a negative color returns nullptr. Collective and blocking.
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key);
  // A communicator over `ranks` (ascending ranks of this one, this rank among them) on this
  // one's connections, made without communicating, unlike Split: every member calls it with
  // the same `ranks` and `id` (2..65535, unused by the job's other communicators). The elastic
  // group's epochs after a departure (comm/elastic/elastic.h).
  absl::StatusOr<std::unique_ptr<Communicator>> Subgroup(const std::vector<int>& ranks,
                                                         uint32_t id) const;

  // Every rank's `mine` into (*out)[i] in rank order. `mine` and `out` must outlive the request.
  RequestPtr AllGatherV(const std::string* mine, std::vector<std::string>* out,
                        OpOptions options = {});
  // All-reduce (sum or avg) of f32, f16 or bf16 host tensors of equal shape (in may equal out).
  RequestPtr AllReduce(const TensorView& in, const TensorView& out, ReduceOp op,
                       OpOptions options = {});
  // out holds nranks() times in, in rank order.
  RequestPtr AllGather(const TensorView& in, const TensorView& out, OpOptions options = {});
  RequestPtr Broadcast(const TensorView& buffer, int root, OpOptions options = {});
  RequestPtr Barrier(OpOptions options = {});

  // SparseLoCo's exchange for a list of tensors. For each tensor, `codec` (a TopKEfCodec, or
  // any codec) encodes `delta` with the tensor's `state` (error feedback), every rank's payloads
  // reach every rank (algorithm from the table: flat direct/ring, or hierarchical over fast
  // islands), and each rank decodes all payloads in rank order into `out` with `decode`
  // (SparseLoCo's mean over the replicas that selected a coordinate, plain mean, or sum). Every
  // rank ends with identical bits. States are committed only when the whole exchange succeeded;
  // on any failure they are aborted (no error-feedback mass is lost) and no `out` is written.
  // A rank whose input is rejected (NaN/Inf, bad shape) still takes part: every rank's request
  // fails with InvalidArgument naming it, and the communicator stays usable.
  // Tensors, states and the codec must outlive the request.
  // CUDA tensors (built with --config=cuda; Unimplemented otherwise): a CUDA `delta` is encoded
  // on its GPU (kernels/device_codec.h) with a state from kernels::NewDeviceState, and only the
  // payload is copied to host memory; a CUDA `out` is written by decoding on its GPU. Both run
  // on `cuda_stream`, after the work queued there before the operation runs; the request
  // completes after that device work has finished.
  struct SparseTensor {
    TensorView delta;             // f32 pseudo-gradient (host or CUDA memory).
    TensorView out;               // f32 aggregate, same shape (host or CUDA memory).
    codecs::CodecState* state;    // The tensor's error feedback (nullptr for stateless codecs).
    void* cuda_stream = nullptr;  // cudaStream_t for CUDA tensors; nullptr: the default stream.
  };
  // options.priority defaults to kBulk here (data-parallel sync yields to pipeline traffic).
  RequestPtr SparseAllReduce(std::vector<SparseTensor> tensors, const codecs::Codec* codec,
                             codecs::DecodeOptions decode = {}, OpOptions options = BulkOptions());
  // The phases' times of every SparseAllReduce that ran so far (thread-safe copy).
  SparseAllReduceProfile sparse_profile() const;
  static OpOptions BulkOptions() {
    OpOptions options;
    options.priority = transport::Priority::kBulk;
    return options;
  }

  // Compressed point-to-point, for pipeline boundaries. Not ordered with collectives: these go
  // straight to the transport at high priority and complete on their own. Messages between two
  // ranks with the same tag arrive in order. `input`, `state` and `codec` must outlive the
  // request; the state is committed once the payload was delivered, aborted otherwise. A CUDA
  // `input` is encoded on its GPU on `cuda_stream` before this call returns (see SparseTensor).
  RequestPtr SendCompressed(const TensorView& input, const codecs::Codec* codec,
                            codecs::CodecState* state, int peer, uint32_t tag,
                            void* cuda_stream = nullptr);
  // Receives a payload from `peer` and decodes it into `out` (f32, same shape as sent): the
  // codec and shape come from the payload. `decode` turns a payload into `out`; default:
  // codecs::DecodeAccumulate (top-k and dense codecs), or for a CUDA `out`
  // kernels::DecodeAccumulateOnDevice on `cuda_stream`. DataLoss for a corrupt payload,
  // InvalidArgument for a shape that does not match `out` (out untouched either way).
  using PayloadDecoder =
      std::function<absl::Status(absl::Span<const uint8_t> payload, const TensorView& out)>;
  RequestPtr RecvCompressed(const TensorView& out, int peer, uint32_t tag,
                            PayloadDecoder decode = nullptr, void* cuda_stream = nullptr);

  // The same collectives over raw host buffers of every DType (f64, i16 and bool included) and
  // every ReduceOp: `count` elements of `type` (or `bytes`), which must outlive the request.
  // Reductions check CheckReduceOp (comm/reduce.h); the algorithms are collectives.h's, one file
  // each under comm/algorithms/ (all-reduce: direct or ring from the selection table). Ordered
  // with the collectives above; Send/Recv/RecvAny are not (like SendCompressed). Errors:
  // collectives.h's.
  RequestPtr AllReduce(const void* in, void* out, size_t count, DType type, ReduceOp op,
                       OpOptions options = {});
  RequestPtr Reduce(const void* in, void* out, size_t count, DType type, ReduceOp op, int root,
                    OpOptions options = {});
  RequestPtr ReduceScatter(const void* in, void* out, size_t count, DType type, ReduceOp op,
                           OpOptions options = {});
  RequestPtr AllToAll(const void* in, void* out, AllToAllLayout layout, OpOptions options = {});
  RequestPtr AllGather(const void* in, void* out, size_t bytes, OpOptions options = {});
  RequestPtr Gather(const void* in, void* out, size_t bytes, int root, OpOptions options = {});
  RequestPtr Scatter(const void* in, void* out, size_t bytes, int root, OpOptions options = {});
  RequestPtr Broadcast(void* buffer, size_t bytes, int root, OpOptions options = {});
  RequestPtr Send(const void* data, size_t bytes, int peer, uint32_t tag);
  RequestPtr Recv(void* data, size_t bytes, int peer, uint32_t tag);
  // A Send's message with `tag` from whichever peer's arrives first (torch's recv_anysource);
  // *source gets its rank (written before the request completes; must outlive it). It posts a
  // receive on every peer that has none waiting for this tag yet; messages those take beyond
  // this call stay queued, in each peer's order, for the next RecvAny or Recv of the tag (one
  // extra copy each). DataLoss when the message's size is not `bytes`.
  RequestPtr RecvAny(void* data, size_t bytes, uint32_t tag, int* source);

  // Runs `op` on the worker thread, in order, with this operation's tag base and deadline. The
  // collectives above are built on it; comm/ adds SparseAllReduce and compressed point-to-point
  // the same way.
  using Op = std::function<absl::Status(const Group& group, transport::Tag tag,
                                        absl::Time deadline)>;
  // `timeout` zero: the communicator's. The signature checked across ranks before `op` runs is
  // `signature` (start one with NewSignature), or just the name and the communicator's settings.
  RequestPtr Post(absl::string_view name, Op op, absl::Duration timeout = absl::ZeroDuration());
  RequestPtr Post(Signature signature, Op op, absl::Duration timeout = absl::ZeroDuration());
  // Like Post, for an operation that runs the operation-header check itself: in its own first
  // round (ExchangeWithHeader, comm/signature.h: the small direct all-reduces) or by calling
  // CheckSignatures (SparseAllReduce, so that a peer lost in the header round goes through the
  // outcome agreement). `op` gets its sequence number and signature and must check every
  // peer's header before it uses any data.
  using HeaderOp =
      std::function<absl::Status(const Group& group, transport::Tag tag, uint64_t sequence,
                                 const Signature& signature, absl::Time deadline)>;
  RequestPtr PostWithHeader(Signature signature, HeaderOp op,
                            absl::Duration timeout = absl::ZeroDuration());
  // Runs `op` in order like Post but without the operation-header exchange: for work of this
  // rank alone on the worker thread (tests that drive the collectives.h tasks directly). Not
  // for collectives: nothing checks that the peers run the same.
  RequestPtr PostUnchecked(absl::string_view name, Op op,
                           absl::Duration timeout = absl::ZeroDuration());
  // A signature for operation `op` holding the communicator's settings that must match.
  Signature NewSignature(absl::string_view op) const;
  // For a call whose arguments were rejected (`why`, not OK): posts an error contribution in
  // the operation's place, so every rank fails its operation at this position with
  // InvalidArgument naming this rank, and returns a request already complete with `why`
  // (RejectedAtPost). Every argument check of the collectives here goes through it.
  RequestPtr PostRejected(absl::string_view name, absl::Status why);

  // Aborts the connections: running and queued operations fail, on every rank. Idempotent;
  // thread-safe (any thread, while operations run). Here the running operation returns as soon
  // as its waits see the closed connections, without waiting for any peer (SparseAllReduce
  // votes abort and does not wait for the peers' votes), and operations queued behind it then
  // complete without running (still in order); all with Cancelled saying the communicator was
  // aborted. Point-to-point
  // operations pending then fail the same way. The peers' operations fail too (Unavailable or
  // Cancelled) once their connections to this rank are closed.
  void Abort();
  // OK while usable; the first failure afterwards.
  absl::Status status() const { return fabric_->aborted(); }

 private:
  Communicator(std::shared_ptr<Fabric> fabric, std::vector<int> ranks, uint32_t comm_id,
               CommConfig config);
  void WorkerLoop();
  // Forgets the transport's per-tag state of the operation whose tag base is `tag`.
  void ReleaseTags(transport::Tag tag);

  struct Pending {
    Signature signature;
    Op op;
    HeaderOp header_op;  // PostWithHeader: runs instead of the header round and `op`.
    absl::Duration timeout;
    uint64_t sequence = 0;
    transport::Tag tag = 0;
    RequestPtr request;
    absl::Status rejection;  // An error contribution (PostRejected) when not OK.
    bool unchecked = false;  // PostUnchecked: no header exchange.
  };
  RequestPtr Enqueue(Pending pending);

  std::shared_ptr<Fabric> fabric_;
  // RecvAny's receives and the messages they took (communicator_dense.cc).
  std::shared_ptr<AnySourceReceives> any_source_ = NewAnySourceReceives();
  const CommConfig config_;  // Resolved in Init; Split() children get a copy.
  Group group_;
  uint32_t comm_id_;
  uint64_t splits_ = 0;  // Splits made so far (only touched by the posting thread).
  // Fields of every operation's signature (nranks, topology hash, LBCC_ALGO, group size).
  std::shared_ptr<const Signature::Fields> settings_;
  uint64_t settings_hash_ = 0;
  // SparseAllReduce's reusable memory; only the worker thread touches it, so steady-state
  // exchanges do not allocate (and do not page-fault fresh buffers) per call.
  std::vector<uint8_t> encode_buffer_;
  std::vector<std::unique_ptr<codecs::DecodeScratch>> decode_scratch_;  // one per tensor
  // SparseAllReduce's exchange phase runs here while the worker encodes (sparse_allreduce.h);
  // one thread, since operations run one at a time.
  ThreadPool pool_{1, "lbcc-exchange"};
  mutable Mutex profile_mu_;
  SparseAllReduceProfile profile_ ABSL_GUARDED_BY(profile_mu_);

  Mutex mu_;
  CondVar cv_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Operations numbered below this were queued when Abort() came: they fail without running.
  uint64_t cancel_below_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread worker_;
};

}  // namespace lbcc::comm

#endif  // LBCC_COMM_COMMUNICATOR_H_
