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
  lbccNumResults = 12
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

typedef enum { lbccSum = 0, lbccAvg = 1 } lbccRedOp_t;

/* How SparseAllReduce combines replicas per coordinate. */
typedef enum {
  lbccAggSparseLoCo = 0, /* Mean over the replicas that selected the coordinate. */
  lbccAggMean = 1,       /* Mean over all replicas. */
  lbccAggSum = 2
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
  const char* transport;    /* "ucx" or "loopback"; NULL: LBCC_TRANSPORT. */
  const char* listenAddr;   /* IPv4 address to listen on; NULL: LBCC_LISTEN_ADDR. */
  const char* topologyFile; /* Topology JSON; NULL: LBCC_TOPO_FILE or derived. */
  double timeoutSeconds;    /* > 0; LBCC_CONFIG_UNDEF_DOUBLE: LBCC_TIMEOUT_S. */
  const char* algorithms;   /* "allreduce=ring,..." (LBCC_ALGO's syntax); unnamed collectives
                               and NULL: LBCC_ALGO. */
  int64_t sparseGroupElements; /* >= 1, same on every rank; LBCC_CONFIG_UNDEF_INT:
                                  LBCC_SPARSE_GROUP_ELEMENTS. */
  int strictEnv;            /* 1: unknown LBCC_* variables or invalid values fail init, 0: they
                               are logged; LBCC_CONFIG_UNDEF_INT: LBCC_STRICT_ENV. */
} lbccConfig_t;

#define LBCC_CONFIG_INITIALIZER                                                            \
  {sizeof(lbccConfig_t), LBCC_CONFIG_MAGIC, LBCC_VERSION_CODE, NULL, NULL, NULL,            \
   LBCC_CONFIG_UNDEF_DOUBLE, NULL, LBCC_CONFIG_UNDEF_INT, LBCC_CONFIG_UNDEF_INT}
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

/* lbccSuccess when done (and the operation succeeded), lbccInProgress while running, the
 * operation's error otherwise. */
lbccResult_t lbccTest(lbccRequest_t request);
lbccResult_t lbccWait(lbccRequest_t request);
lbccResult_t lbccRequestFree(lbccRequest_t request);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* LBCC_COMM_LBCC_H_ */
