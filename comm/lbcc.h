/* LBCC's C API, in the style of NCCL's nccl.h.
 *
 *   lbccUniqueId id;  lbccGetUniqueId(&id);            // on one rank; send id to the others
 *   lbccComm_t comm;  lbccCommInitRankConfig(&comm, nranks, id, rank, NULL);
 *   lbccRequest_t req;
 *   lbccAllReduce(buf, buf, count, lbccFloat32, lbccSum, comm, &req);
 *   lbccWait(req);  lbccRequestFree(req);
 *   lbccCommDestroy(comm);
 *
 * Every function returns an lbccResult_t; lbccGetErrorString names the code and
 * lbccGetLastError(comm) gives the full message of the communicator's last failure (or of the
 * calling thread's last failure when comm is NULL). Pointer arguments are checked first.
 * Operations are non-blocking: they return a request at once (lbccTest / lbccWait); buffers
 * must stay valid until the request is done. Bad arguments are returned by the posting call
 * itself (no request is made); anything that fails once the operation is posted (a payload that
 * does not fit the buffer, a lost peer) is returned by lbccTest / lbccWait, however soon it
 * happens. A failed operation (peer lost, timeout) makes
 * later operations on the communicator fail with lbccRemoteError: destroy and recreate it.
 *
 * Thread-safety: communicators may be used from any thread, but every rank must post
 * collectives in the same order. Requests may be tested from any thread.
 */
#ifndef LBCC_COMM_LBCC_H_
#define LBCC_COMM_LBCC_H_

#include <float.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LBCC_MAJOR 0
#define LBCC_MINOR 1
#define LBCC_PATCH 0
#define LBCC_VERSION_CODE (LBCC_MAJOR * 10000 + LBCC_MINOR * 100 + LBCC_PATCH)

typedef enum {
  lbccSuccess = 0,
  lbccSystemError = 2,      /* Unavailable: a peer or link was lost. */
  lbccInternalError = 3,    /* An LBCC bug. */
  lbccInvalidArgument = 4,  /* Bad argument or configuration. */
  lbccInvalidUsage = 5,     /* Wrong state (e.g. the communicator failed earlier). */
  lbccRemoteError = 6,      /* Another rank failed or rejected its input. */
  lbccInProgress = 7,       /* lbccTest: not done yet. */
  lbccTimeout = 8,          /* A peer did not answer in time. */
  lbccDataLoss = 9,         /* Corrupt or foreign payload. */
  lbccUnimplemented = 10,   /* Not supported for this input (e.g. device memory). */
  lbccCancelled = 11,       /* Aborted or destroyed while pending. */
  /* lbccElastic* only: the group's membership changed during the call (a member left, died
   * or was cut off, or another member's part failed). Nothing was applied: retry the same call
   * with the same inputs; it runs over the new epoch. Retryable; no other code is. */
  lbccMembershipChanged = 12,
  /* lbccElastic* of a pipeline stage only (lbccElasticConfig_t.replica set): another stage of
   * this member's pipeline replica left, so the whole replica is out of the data-parallel group
   * of every shard; this member is no longer one. Not retryable on this group: lbccElasticDestroy
   * it and lbccElasticJoin again (admitted once every stage of the replica is back, all at one
   * outer step). A full replica never gets it. */
  lbccReplicaLeft = 13,
  lbccNumResults = 14
} lbccResult_t;

typedef enum {
  lbccFloat32 = 1,
  lbccFloat16 = 2,
  lbccBfloat16 = 3,
  lbccInt8 = 4,
  lbccUint8 = 5,
  lbccInt32 = 6,
  lbccInt64 = 7
} lbccDataType_t;

typedef enum {
  lbccSum = 0,
  lbccAvg = 1,
  /* Dense reductions (comm/collectives.h): any data type. */
  lbccProd = 2,
  lbccMin = 3,
  lbccMax = 4
} lbccRedOp_t;

/* How SparseAllReduce combines replicas per coordinate. */
typedef enum {
  lbccAggSparseLoCo = 0, /* Mean over the replicas that selected the coordinate. */
  lbccAggMean = 1,       /* Mean over all replicas. */
  lbccAggSum = 2,
  /* A flag OR-ed onto one of the above (cast back to lbccAggregation_t): templar's outer step,
   * each rank's contribution scaled by min(1, median(norms) / (norm + 1e-8)) first. */
  lbccAggClipToMedianNorm = 16
} lbccAggregation_t;

/* Value coding of the top-k codec. */
typedef enum {
  lbccValues2Bit = 0, /* 2-bit bin-mean (SparseLoCo). */
  lbccValues4Bit = 1,
  lbccValues8Bit = 2,
  lbccValuesBf16 = 3,
  lbccValuesFp16 = 4,
  lbccValuesFp32 = 5
} lbccValueCoding_t;

#define LBCC_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[LBCC_UNIQUE_ID_BYTES];
} lbccUniqueId;

typedef struct lbccComm* lbccComm_t;
typedef struct lbccRequest* lbccRequest_t;
typedef struct lbccTopKState* lbccTopKState_t;

#define LBCC_SPLIT_NOCOLOR (-1)

/* ---- Configuration (comm/config.h) ----
 * A communicator's settings, resolved once at init like NCCL's ncclConfig_t: initialise with
 * LBCC_CONFIG_INITIALIZER, set the fields you want; a field left at its initial value (NULL or
 * LBCC_CONFIG_UNDEF_*) takes its environment variable, then that variable's default. Nothing is
 * read from the environment after init; lbccCommSplit children inherit the parent's settings.
 * A bad value fails init with lbccInvalidArgument naming the field (lbccGetLastError(NULL)). */
#define LBCC_CONFIG_MAGIC 0x4c424343u /* "LBCC" */
#define LBCC_CONFIG_UNDEF_INT INT_MIN
#define LBCC_CONFIG_UNDEF_DOUBLE (-DBL_MAX)

typedef struct {
  size_t size;              /* sizeof(lbccConfig_t). */
  unsigned int magic;       /* LBCC_CONFIG_MAGIC. */
  unsigned int version;     /* LBCC_VERSION_CODE of the header the caller was built with. */
  const char* transport;    /* "ucx", "socket" or "loopback"; NULL: LBCC_TRANSPORT. */
  const char* listenAddr;   /* IPv4 address to listen on; NULL: LBCC_LISTEN_ADDR. */
  const char* topologyFile; /* Topology JSON; NULL: LBCC_TOPO_FILE or derived. */
  double timeoutSeconds;    /* > 0; LBCC_CONFIG_UNDEF_DOUBLE: LBCC_TIMEOUT_S. */
  const char* algorithms;   /* "allreduce=ring,..." (LBCC_ALGO's syntax); unnamed collectives
                               and NULL: LBCC_ALGO. */
  int64_t sparseGroupElements; /* >= 1, same on every rank; LBCC_CONFIG_UNDEF_INT:
                                  LBCC_SPARSE_GROUP_ELEMENTS. */
  int strictEnv;            /* 1: unknown LBCC_* variables or invalid values fail init, 0: they
                               are logged; LBCC_CONFIG_UNDEF_INT: LBCC_STRICT_ENV. */
  /* Since LBCC_CONFIG_SIZE_V1 (a caller built with the older, shorter struct leaves them unset). */
  const char* jobSecret;     /* The job secret, 64 hex digits; NULL: LBCC_JOB_SECRET or
                                LBCC_JOB_SECRET_FILE. Set jobSecret or jobSecretFile, not both. */
  const char* jobSecretFile; /* A file holding it; NULL: as above. */
  const char* encrypt;       /* Sealed links, "none" | "slow" | "all"; NULL: LBCC_ENCRYPT. */
  double peerTimeoutSeconds; /* A silent peer fails pending work after about this long, > 0;
                                LBCC_CONFIG_UNDEF_DOUBLE: LBCC_PEER_TIMEOUT_MS. */
} lbccConfig_t;

/* The size of lbccConfig_t before jobSecret: older callers' structs end there. */
#define LBCC_CONFIG_SIZE_V1 offsetof(lbccConfig_t, jobSecret)

#define LBCC_CONFIG_INITIALIZER                                                            \
  {sizeof(lbccConfig_t), LBCC_CONFIG_MAGIC, LBCC_VERSION_CODE, NULL, NULL, NULL,            \
   LBCC_CONFIG_UNDEF_DOUBLE, NULL, LBCC_CONFIG_UNDEF_INT, LBCC_CONFIG_UNDEF_INT, NULL, NULL,  \
   NULL, LBCC_CONFIG_UNDEF_DOUBLE}
/* ---- end of Configuration ---- */

/* Top-k with error feedback (SparseLoCo); see codecs/topk_ef.h. */
typedef struct {
  size_t size;              /* sizeof(lbccTopKConfig_t). */
  double topK;              /* Selected per 4096 elements (64 = 1.56 %). */
  float beta;               /* Error-feedback decay (0.95). */
  float lr;                 /* Outer learning rate applied before compression (1.0). */
  lbccValueCoding_t values; /* lbccValues2Bit. */
} lbccTopKConfig_t;

#define LBCC_TOPK_CONFIG_INITIALIZER {sizeof(lbccTopKConfig_t), 64.0, 0.95f, 1.0f, lbccValues2Bit}

lbccResult_t lbccGetVersion(int* version);
const char* lbccGetErrorString(lbccResult_t result);
/* The full message of comm's last failure; comm NULL: the calling thread's last failure. */
const char* lbccGetLastError(lbccComm_t comm);

/* Starts a bootstrap root on LBCC_LISTEN_ADDR that waits LBCC_TIMEOUT_S for the ranks. */
lbccResult_t lbccGetUniqueId(lbccUniqueId* uniqueId);
/* The same with the root on config's listenAddr for its timeoutSeconds, authenticating ranks with
 * its job secret (each unset field: its variable); config NULL: as lbccGetUniqueId. */
lbccResult_t lbccGetUniqueIdConfig(lbccUniqueId* uniqueId, const lbccConfig_t* config);
/* Joins the job named by commId as `rank` of `nranks` (blocks until all joined or the timeout).
 * config NULL: every setting from the environment. */
lbccResult_t lbccCommInitRankConfig(lbccComm_t* comm, int nranks, lbccUniqueId commId, int rank,
                                    const lbccConfig_t* config);
/* The same as lbccCommInitRankConfig (kept for callers written before it). */
lbccResult_t lbccCommInitRank(lbccComm_t* comm, int nranks, lbccUniqueId commId, int rank,
                              const lbccConfig_t* config);
/* From torchrun's or mpirun's environment (see comm/communicator.h). */
lbccResult_t lbccCommInitFromEnv(lbccComm_t* comm, const lbccConfig_t* config);
lbccResult_t lbccCommSplit(lbccComm_t comm, int color, int key, lbccComm_t* newcomm);
lbccResult_t lbccCommDestroy(lbccComm_t comm);
lbccResult_t lbccCommAbort(lbccComm_t comm);
lbccResult_t lbccCommCount(const lbccComm_t comm, int* count);
lbccResult_t lbccCommUserRank(const lbccComm_t comm, int* rank);
/* Bytes this rank sent and received on fast and slow links (all communicators of its job). */
lbccResult_t lbccCommLinkBytes(const lbccComm_t comm, uint64_t* fastSent, uint64_t* fastRecv,
                               uint64_t* slowSent, uint64_t* slowRecv);

lbccResult_t lbccAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           lbccDataType_t datatype, lbccRedOp_t op, lbccComm_t comm,
                           lbccRequest_t* request);
lbccResult_t lbccAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           lbccDataType_t datatype, lbccComm_t comm, lbccRequest_t* request);
lbccResult_t lbccBroadcast(void* buff, size_t count, lbccDataType_t datatype, int root,
                           lbccComm_t comm, lbccRequest_t* request);
lbccResult_t lbccBarrier(lbccComm_t comm, lbccRequest_t* request);

/* Dense reduce, reduce-scatter and all-to-all of every data type (integers too) with every
 * lbccRedOp_t (lbccAvg: floating types only); see comm/collectives.h.
 * lbccReduce: the reduction of count elements lands in recvbuff on root only.
 * lbccReduceScatter: sendbuff holds nranks * recvcount elements; block r, reduced, lands in
 * rank r's recvbuff. lbccAllToAll: block j (count elements) of sendbuff goes to rank j, whose
 * recvbuff block i receives rank i's. */
lbccResult_t lbccReduce(const void* sendbuff, void* recvbuff, size_t count,
                        lbccDataType_t datatype, lbccRedOp_t op, int root, lbccComm_t comm,
                        lbccRequest_t* request);
lbccResult_t lbccReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               lbccDataType_t datatype, lbccRedOp_t op, lbccComm_t comm,
                               lbccRequest_t* request);
lbccResult_t lbccAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                          lbccDataType_t datatype, lbccComm_t comm, lbccRequest_t* request);

/* Error-feedback state of one tensor for lbccSparseAllReduce. */
lbccResult_t lbccTopKStateCreate(lbccTopKState_t* state);
lbccResult_t lbccTopKStateDestroy(lbccTopKState_t state);

/* SparseLoCo exchange of `ntensors` f32 tensors: deltas[i] (shape dims[i][0..ranks[i])) is
 * compressed with states[i], every rank's payloads are averaged per `aggregation` into outs[i].
 * States are committed only if the exchange succeeded. */
lbccResult_t lbccSparseAllReduce(int ntensors, const float* const* deltas, float* const* outs,
                                 const int* ranks, const int64_t* const* dims,
                                 lbccTopKState_t* states, const lbccTopKConfig_t* config,
                                 lbccAggregation_t aggregation, lbccComm_t comm,
                                 lbccRequest_t* request);

/* Dense quantizer of compressed point-to-point; see codecs/dense_quant.h. */
typedef enum {
  lbccDenseInt8 = 1, /* Blockwise absmax int8. */
  lbccDenseInt4 = 2, /* Blockwise absmax 4-bit. */
  lbccDenseFp16 = 3,
  lbccDenseBf16 = 4
} lbccDenseFormat_t;

typedef struct {
  size_t size;              /* sizeof(lbccDenseConfig_t). */
  lbccDenseFormat_t format; /* lbccDenseInt8. */
  int64_t block;            /* Elements per scale for the int formats (256). */
  int stochastic;           /* Seeded stochastic rounding (0). */
} lbccDenseConfig_t;

#define LBCC_DENSE_CONFIG_INITIALIZER {sizeof(lbccDenseConfig_t), lbccDenseInt8, 256, 0}

/* Compressed point-to-point of an f32 tensor of shape dims[0..ndims) (config NULL: int8). The
 * receiver learns codec and shape from the payload and checks the shape against its own;
 * a mismatch fails the receive with lbccInvalidArgument and leaves buff untouched. Messages
 * between two ranks with the same tag arrive in order; not ordered with collectives. */
lbccResult_t lbccSendCompressed(const float* buff, int ndims, const int64_t* dims,
                                const lbccDenseConfig_t* config, int peer, uint32_t tag,
                                lbccComm_t comm, lbccRequest_t* request);
lbccResult_t lbccRecvCompressed(float* buff, int ndims, const int64_t* dims, int peer,
                                uint32_t tag, lbccComm_t comm, lbccRequest_t* request);

/* ---- Pipeline activations: the subspace codec between two stages (comm/activations.h) ----
 *
 * Forward, a stage sends activations h [tokens x d] as k coefficients c = U^T (h - T[y]) plus
 * the token ids y; the next stage rebuilds h = U c + T[y]. Backward, it sends the gradient as
 * U^T g and the receiver rebuilds U (U^T g). U (d x k, orthonormal) and T (V x d) form a basis,
 * identical on both stages (the same seed and spec, or the same file), named on the wire by its
 * content hash and version. A receive takes the bases it accepts, newest first: a payload of
 * another basis fails the request with lbccInvalidUsage (the message names both), corrupt bytes
 * with lbccDataLoss, another shape with lbccInvalidArgument (buffers untouched on error).
 * After a basis change (a new version, e.g. after an embedding shift) keep the previous handle
 * until the backwards of microbatches whose forward used it are done: send each backward with
 * the basis of its forward and accept both bases when receiving. Single bases only (M = 1):
 * a mixture basis is lbccUnimplemented here (use the C++ ActivationChannel). Messages between
 * two ranks with the same tag arrive in order; not ordered with collectives. */
typedef struct lbccBasis* lbccBasis_t;

typedef struct {
  size_t size;        /* sizeof(lbccBasisSpec_t): set by LBCC_BASIS_SPEC_INITIALIZER. */
  int64_t modelDim;   /* d */
  int64_t rank;       /* k, 1 <= k <= d */
  int64_t vocabSize;  /* V: token ids in [0, V) travel with activations; 0: no ids */
  int withTable;      /* Generate T (V x d) with entries N(0, tableStddev^2). */
  double tableStddev; /* 1.0 */
  uint64_t seed;
  uint32_t version;
} lbccBasisSpec_t;

#define LBCC_BASIS_SPEC_INITIALIZER {sizeof(lbccBasisSpec_t), 0, 0, 0, 0, 1.0, 0, 0}

/* How a send codes the coefficients. */
typedef struct {
  size_t size;                  /* sizeof(lbccActivationConfig_t). */
  lbccDataType_t coefficients;  /* lbccFloat32, lbccBfloat16 (default), lbccFloat16, lbccInt8. */
  int64_t int8Block;            /* Coefficients per fp32 scale with lbccInt8 (32). */
} lbccActivationConfig_t;

#define LBCC_ACTIVATION_CONFIG_INITIALIZER \
  {sizeof(lbccActivationConfig_t), lbccBfloat16, 32}

/* A seeded basis: the same spec gives the same bits on every x86-64 machine. */
lbccResult_t lbccBasisCreateFromSeed(const lbccBasisSpec_t* spec, lbccBasis_t* basis);
/* A basis file (written by lbcc.SubspaceBasis.save or codecs::SubspaceBasis::Save). */
lbccResult_t lbccBasisLoad(const char* path, lbccBasis_t* basis);
/* Requests that use the basis keep what they need: destroying it while they run is fine. */
lbccResult_t lbccBasisDestroy(lbccBasis_t basis);
/* Any output may be NULL. */
lbccResult_t lbccBasisGetInfo(const lbccBasis_t basis, int64_t* modelDim, int64_t* rank,
                              int64_t* vocabSize, uint64_t* hash, uint32_t* version);

/* Sends activations h [tokens x d] and ids [tokens] (NULL when V = 0), encoded against `basis`
 * (config NULL: bf16 coefficients). h and ids are read before the call returns. */
lbccResult_t lbccSendActivations(const float* h, const int32_t* ids, int64_t tokens,
                                 lbccBasis_t basis, const lbccActivationConfig_t* config,
                                 int peer, uint32_t tag, lbccComm_t comm, lbccRequest_t* request);
/* Receives activations into h [tokens x d] and ids [tokens] (may be NULL) with whichever of
 * bases[0..nbases) the payload names (the current basis first). */
lbccResult_t lbccRecvActivations(float* h, int32_t* ids, int64_t tokens, const lbccBasis_t* bases,
                                 int nbases, int peer, uint32_t tag, lbccComm_t comm,
                                 lbccRequest_t* request);
/* Sends the gradient of a received microbatch, grads [tokens x d], encoded against the basis
 * its forward used. grads is read before the call returns. */
lbccResult_t lbccSendActivationGrads(const float* grads, int64_t tokens, lbccBasis_t basis,
                                     const lbccActivationConfig_t* config, int peer, uint32_t tag,
                                     lbccComm_t comm, lbccRequest_t* request);
/* Receives a gradient into grads [tokens x d] (keep the previous basis in `bases` while
 * backwards of its forwards are in flight). */
lbccResult_t lbccRecvActivationGrads(float* grads, int64_t tokens, const lbccBasis_t* bases,
                                     int nbases, int peer, uint32_t tag, lbccComm_t comm,
                                     lbccRequest_t* request);

/* ---- The lossy boundary: table refresh and table updates (comm/activations.h) ----
 *
 * Two designs of the boundary (codecs/subspace_training.h). Lossy: nothing is constrained and
 * the basis' table T is the synced token-embedding table itself, refreshed after every
 * SparseLoCo outer step. Constrained: the embedding shift (T absorbs E's out-of-subspace part).
 * lbccBasisRefreshTable makes the next basis (version + 1) from the embedding every rank holds
 * after the outer step; ranks passing the same bits get the same basis (hash and version), so
 * nothing else travels. A later stage holds no embedding: it keeps a copy of the table and
 * follows it with lbccRecvTableUpdate, to which the stage holding the embedding sends the
 * elements the outer step changed (lbccSendTableUpdate, a table delta: positions as a bitmap
 * or gaps, values bit-exact, checksummed) instead of the dense table. Messages share the
 * activations' path (same ordering rules; use a tag of their own or keep the order). */
typedef enum {
  LBCC_TABLE_LOSSY = 0,       /* T := the embedding [V x d] bit for bit; embedding untouched. */
  LBCC_TABLE_CONSTRAINED = 1  /* The embedding shift; embedding modified in place. */
} lbccTableRefreshMode_t;

/* *next = a new handle for the basis after the outer step (destroy it with lbccBasisDestroy;
 * `basis` stays valid: keep it while backwards of its forwards are in flight). embedding is
 * [V x d] float, V and d the basis' (lbccBasisGetInfo). Blocking (a copy, or the shift with
 * portable arithmetic: identical bits on every x86-64 machine). lbccInvalidUsage for a basis
 * without vocabulary or at version UINT32_MAX; lbccInvalidArgument for a bad mode or
 * non-finite lossy table. Nothing is modified on error. */
lbccResult_t lbccBasisRefreshTable(lbccBasis_t basis, float* embedding,
                                   lbccTableRefreshMode_t mode, lbccBasis_t* next);
/* Sends the elements of after[0..count) whose bits differ from before[0..count). Both are read
 * before the call returns; *bytes (may be NULL) then holds the message's size. */
lbccResult_t lbccSendTableUpdate(const float* before, const float* after, size_t count, int peer,
                                 uint32_t tag, lbccComm_t comm, size_t* bytes,
                                 lbccRequest_t* request);
/* Receives a table update into table[0..count), which must stay valid until the request is
 * done, as must bytes (may be NULL: the message's size, written when the request succeeds).
 * The request fails with lbccDataLoss for a corrupt or foreign message and lbccInvalidArgument
 * for an update of another count; table is untouched then. */
lbccResult_t lbccRecvTableUpdate(float* table, size_t count, int peer, uint32_t tag,
                                 lbccComm_t comm, size_t* bytes, lbccRequest_t* request);

/* ---- Elastic membership (comm/elastic/elastic.h, docs/elastic.md) ----
 * Members join and leave a running SparseLoCo job without stopping it. A membership service
 * (lbcc-master, or lbccElasticMasterCreate in one process) keeps the member list and an epoch;
 * every collective runs over the members of one epoch. The loop of a member:
 *
 *   lbccElastic_t g;  lbccElasticJoin(&g, &config, nstate, state, stateBytes);
 *   for (;;) {
 *     do rc = lbccElasticBoundary(g); while (rc == lbccMembershipChanged);  // newcomers synced
 *     ... inner steps, pseudo-gradient into delta ...
 *     do rc = lbccElasticSparseAllReduce(..., g); while (rc == lbccMembershipChanged);
 *     ... outer step on the shared state ...
 *   }
 *   lbccElasticLeave(g);  lbccElasticDestroy(g);
 *
 * lbccMembershipChanged is the one retryable code: the error-feedback states are as before the
 * call, and the retry over the new epoch gives every member the same bits. Other codes:
 * lbccReplicaLeft (a pipeline stage: another stage of its replica left; join again, see
 * below), lbccSystemError (the membership service is lost), lbccInvalidUsage (evicted, refused
 * as stale, or left: join again), lbccInvalidArgument (bad input; a wrong job id), lbccDataLoss
 * (shared states differ), lbccTimeout (not admitted in time). Calls are blocking and come from
 * one thread per group; the message is lbccGetLastError(NULL).
 *
 * Pipeline replicas as units: the data-parallel group of each pipeline stage (a model shard:
 * stage s of every pipeline replica plus every full replica) is its own job on its own master,
 * and the masters of one model's shards share an lbccElasticUnits_t (in one process:
 * lbccElasticMasterCreateConfig with lbccElasticMasterConfig_t.units). Each stage joins its
 * shard's job with lbccElasticConfig_t.replica (a name unique in the model), .stage and
 * .replicaStages. A stage that leaves, dies, is cut off or is evicted takes its whole replica
 * out of every shard's group: the other stages' calls return lbccReplicaLeft (the message names
 * the replica and the stage that left), the full replicas' calls lbccMembershipChanged (retry).
 * A stage that joins waits at its master until every stage of its replica is back; they are
 * admitted at one outer step (the same lbccElasticQuery step), each receiving its shard's state:
 *
 *   rc = lbccElasticSparseAllReduce(..., g);
 *   if (rc == lbccReplicaLeft) {      // this stage's replica is out of the group
 *     lbccElasticDestroy(g);  reset this stage's error feedback (a newcomer's starts at zero);
 *     do rc = lbccElasticJoin(&g, &config, ...); while (rc == lbccTimeout);  // the replica
 *   }                                                                         // is back
 *
 * Config structs: fields are only ever appended, and the library accepts the size of every
 * earlier layout of a struct (the fields past it take their initial values), so a caller built
 * with an older lbcc.h keeps working; a size it does not know is lbccInvalidArgument. */
typedef struct lbccElastic* lbccElastic_t;
typedef struct lbccElasticMaster* lbccElasticMaster_t;
typedef struct lbccElasticUnits* lbccElasticUnits_t;

typedef struct {
  size_t size;               /* sizeof(lbccElasticConfig_t). */
  unsigned int magic;        /* LBCC_CONFIG_MAGIC. */
  unsigned int version;      /* LBCC_VERSION_CODE. */
  const char* masterAddr;    /* "host:port"; NULL: LBCC_MASTER_ADDR. */
  const char* jobId;         /* Must be the master's; not NULL. */
  const char* name;          /* For logs and messages; NULL: host:pid. */
  double opTimeoutSeconds;   /* One exchange; LBCC_CONFIG_UNDEF_DOUBLE: 300. */
  double joinTimeoutSeconds; /* Waiting to be admitted; LBCC_CONFIG_UNDEF_DOUBLE: 600. */
  double peerTimeoutSeconds; /* Master silence; LBCC_CONFIG_UNDEF_DOUBLE: LBCC_PEER_TIMEOUT_MS. */
  int64_t stateStep;         /* Shared state of this committed step, or -1: none. */
  const lbccConfig_t* comm;  /* The per-epoch communicators' settings; NULL: defaults. */
  /* Appended with pipeline units (a caller's struct that ends at `comm` still works: a full
   * replica). A pipeline stage: stage `stage` (0-based, < replicaStages) of pipeline replica
   * `replica`, which has `replicaStages` >= 1 stages, each in its shard's job on masters that
   * share an lbccElasticUnits_t. NULL replica (and replicaStages 0): a full replica. Other
   * combinations are lbccInvalidArgument naming the field. */
  const char* replica;
  int stage;
  int replicaStages;
} lbccElasticConfig_t;

#define LBCC_ELASTIC_CONFIG_INITIALIZER                                                       \
  {sizeof(lbccElasticConfig_t), LBCC_CONFIG_MAGIC, LBCC_VERSION_CODE, NULL, NULL, NULL,        \
   LBCC_CONFIG_UNDEF_DOUBLE, LBCC_CONFIG_UNDEF_DOUBLE, LBCC_CONFIG_UNDEF_DOUBLE, -1, NULL,     \
   NULL, 0, 0}

/* Connects to the master, joins and waits until admitted (an outer-step boundary). The shared
 * state: `nstate` host buffers (parameters, outer-optimizer state) of the same sizes on every
 * member, valid until lbccElasticDestroy; a newcomer's are overwritten by its first
 * lbccElasticBoundary. */
lbccResult_t lbccElasticJoin(lbccElastic_t* group, const lbccElasticConfig_t* config, int nstate,
                             void* const* state, const size_t* stateBytes);
/* The start of an outer step: adopts the newest epoch; newcomers receive the shared state. */
lbccResult_t lbccElasticBoundary(lbccElastic_t group);
/* lbccSparseAllReduce over the epoch's members (arguments as there), blocking. The states are
 * committed only when every member of the epoch succeeded; otherwise outs must be ignored.
 * After a success, leave outs unwritten and allocated until the next call on the group (it may
 * forward them from there to a member whose exchange failed). */
lbccResult_t lbccElasticSparseAllReduce(int ntensors, const float* const* deltas,
                                        float* const* outs, const int* ranks,
                                        const int64_t* const* dims, lbccTopKState_t* states,
                                        const lbccTopKConfig_t* config,
                                        lbccAggregation_t aggregation, lbccElastic_t group);
/* Leaves at once; the others go on without a timeout. Idempotent. */
lbccResult_t lbccElasticLeave(lbccElastic_t group);
/* The current epoch, this member's rank and the epoch's size, the job's committed steps. Any
 * output pointer may be NULL. */
lbccResult_t lbccElasticQuery(const lbccElastic_t group, uint64_t* epoch, int* rank, int* size,
                              uint64_t* step);
/* Leaves if still a member and frees the group. */
lbccResult_t lbccElasticDestroy(lbccElastic_t group);

/* The membership service in this process (what lbcc-master runs). `listenAddr` "host:port"
 * (port 0: any; NULL: 127.0.0.1:0), `peerTimeoutSeconds` <= 0: LBCC_PEER_TIMEOUT_MS. A master
 * of its own units (see lbccElasticMasterCreateConfig). */
lbccResult_t lbccElasticMasterCreate(lbccElasticMaster_t* master, const char* listenAddr,
                                     const char* jobId, int minMembers,
                                     double peerTimeoutSeconds);

/* Pipeline units shared by the masters of one model's shard jobs (in this process). The masters
 * keep what they need: destroying the handle once they are created is fine. */
lbccResult_t lbccElasticUnitsCreate(lbccElasticUnits_t* units);
lbccResult_t lbccElasticUnitsDestroy(lbccElasticUnits_t units);

typedef struct {
  size_t size;               /* sizeof(lbccElasticMasterConfig_t). */
  unsigned int magic;        /* LBCC_CONFIG_MAGIC. */
  unsigned int version;      /* LBCC_VERSION_CODE. */
  const char* listenAddr;    /* "host:port" (port 0: any); NULL: 127.0.0.1:0. */
  const char* jobId;         /* Members must present it; not NULL, not empty. */
  int minMembers;            /* >= 1: the first epoch forms once this many joined. */
  double peerTimeoutSeconds; /* > 0; LBCC_CONFIG_UNDEF_DOUBLE: LBCC_PEER_TIMEOUT_MS. */
  const char* bootstrapHost; /* The per-epoch bootstrap roots' address; NULL: listenAddr's host. */
  double setupTimeoutSeconds; /* An epoch's set-up, > 0; LBCC_CONFIG_UNDEF_DOUBLE: peer timeout
                                 + 5 s. */
  lbccElasticUnits_t units;  /* Shared with the masters of the model's other shards; NULL: the
                                master's own (units span this job only). */
} lbccElasticMasterConfig_t;

#define LBCC_ELASTIC_MASTER_CONFIG_INITIALIZER                                                \
  {sizeof(lbccElasticMasterConfig_t), LBCC_CONFIG_MAGIC, LBCC_VERSION_CODE, NULL, NULL, 1,     \
   LBCC_CONFIG_UNDEF_DOUBLE, NULL, LBCC_CONFIG_UNDEF_DOUBLE, NULL}

/* lbccElasticMasterCreate with every option; bad fields are lbccInvalidArgument naming them. */
lbccResult_t lbccElasticMasterCreateConfig(lbccElasticMaster_t* master,
                                           const lbccElasticMasterConfig_t* config);
/* "host:port" members connect to; valid until lbccElasticMasterDestroy. */
const char* lbccElasticMasterAddress(const lbccElasticMaster_t master);
lbccResult_t lbccElasticMasterQuery(const lbccElasticMaster_t master, uint64_t* epoch,
                                    int* members, uint64_t* committedSteps);
/* Stops the service (members fail with lbccSystemError naming it) and frees it. */
lbccResult_t lbccElasticMasterDestroy(lbccElasticMaster_t master);
/* ---- end of Elastic membership ---- */

/* ---- Context parallelism: the K/V ring of ring attention (comm/context_ring.h) ----
 *
 * Every rank holds one chunk of a sequence and its block of K and V (and any further tensors),
 * each float [tokens x dim]. Forward, for rounds r = 1 .. nranks-1, lbccContextRingNextForward
 * hands out the block of rank (rank - r) mod nranks while the ring already relays it to the
 * successor (compute on it meanwhile). Backward, lbccContextRingPassGradient(r) adds this rank's
 * gradient for block (rank + r) mod nranks to the partial sum from the successor and sends it
 * to the predecessor; lbccContextRingEndBackward gives every other rank's gradient for this
 * rank's block, summed. Each pass is a collective (ordered with the others, its signature
 * checked on every rank: a mismatch is lbccInvalidUsage everywhere, a rejected argument
 * lbccInvalidArgument everywhere); a lost peer fails every rank's pending call. Blocking calls;
 * one thread per ring. */
typedef struct lbccContextRing* lbccContextRing_t;

typedef enum {
  LBCC_RING_RAW_F32 = 0,    /* float bytes as they are: bit-exact */
  LBCC_RING_DENSE_BF16 = 1, /* dense bf16 (the uncompressed reference) */
  LBCC_RING_DENSE_FP16 = 2,
  LBCC_RING_SUBSPACE = 3    /* coefficients of a mixture of subspaces (codecs/subspace_codec.h) */
} lbccRingCodecKind_t;

typedef struct {
  size_t size;                  /* sizeof(lbccRingCodec_t). */
  lbccRingCodecKind_t kind;
  /* LBCC_RING_SUBSPACE: a basis file (vocabulary 0; any number of components), or NULL for the
   * seeded basis below (same seed: same bits on every rank). */
  const char* basisPath;
  int64_t rank;                 /* k per component (seeded) */
  int64_t components;           /* M (seeded) */
  uint64_t seed;
  uint32_t version;
  lbccDataType_t coefficients;  /* lbccFloat32, lbccBfloat16 (default), lbccFloat16, lbccInt8 */
  int64_t int8Block;            /* 32 */
  int64_t mixtureBlock;         /* tokens per component choice (64) */
} lbccRingCodec_t;

#define LBCC_RING_CODEC_INITIALIZER \
  {sizeof(lbccRingCodec_t), LBCC_RING_RAW_F32, NULL, 0, 1, 0, 0, lbccBfloat16, 32, 64}

/* A ring over `comm` for blocks of `ntensors` tensors, each [tokens x dim] with codecs[i].
 * Communicates nothing. `comm` must outlive the ring. */
lbccResult_t lbccContextRingCreate(lbccComm_t comm, int ntensors, const lbccRingCodec_t* codecs,
                                   int64_t tokens, int64_t dim, lbccContextRing_t* ring);
/* A pass still running is cancelled (its peers fail) and waited for. */
lbccResult_t lbccContextRingDestroy(lbccContextRing_t ring);
/* Bytes one tensor's payload puts on a link per round (forward, backward); either may be NULL. */
lbccResult_t lbccContextRingPayloadBytes(lbccContextRing_t ring, int tensor, size_t* forward,
                                         size_t* backward);
/* mine[i]: this rank's tensor i (read during the call); mineOut NULL, or ntensors buffers that
 * get the block as the other ranks decode it (a lossy codec's constrained K/V). */
lbccResult_t lbccContextRingBeginForward(lbccContextRing_t ring, const float* const* mine,
                                         float* const* mineOut);
/* *source (may be NULL) gets the rank whose block was written into out[0..ntensors). */
lbccResult_t lbccContextRingNextForward(lbccContextRing_t ring, float* const* out, int* source);
lbccResult_t lbccContextRingEndForward(lbccContextRing_t ring);
lbccResult_t lbccContextRingBeginBackward(lbccContextRing_t ring);
/* contribution[i]: this rank's gradient for tensor i of block *owner (may be NULL). */
lbccResult_t lbccContextRingPassGradient(lbccContextRing_t ring,
                                         const float* const* contribution, int* owner);
lbccResult_t lbccContextRingEndBackward(lbccContextRing_t ring, float* const* out);
/* ---- end of Context parallelism ---- */

/* ---- Requests ---- */

/* lbccSuccess when done (and the operation succeeded), lbccInProgress while running, the
 * operation's error otherwise. */
lbccResult_t lbccTest(lbccRequest_t request);
lbccResult_t lbccWait(lbccRequest_t request);
lbccResult_t lbccRequestFree(lbccRequest_t request);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* LBCC_COMM_LBCC_H_ */
