// NCCL's network plugin ABI, versions 8 to 11, declared here field for field so that the plugin
// builds without NCCL's headers (NCCL installs nccl.h but not its ext-net headers). These are the
// layouts NCCL 2.28 loads by dlsym("ncclNetPlugin_vN"); never reorder or retype a field. The
// harness (plugin_harness_test.cc) and abi_test.cc check sizes and offsets, and abi_test.cc
// compares the constants with nccl.h when that header is installed.
//
// What changes between versions (see plugin/README.md for the table):
//   v9:  isend size and irecv sizes become size_t; properties gain forceFlush (after
//        regIsGlobal), vProps, maxP2pBytes, maxCollBytes; makeVDevice is appended.
//   v10: init takes a profiler callback; connect takes a comm config; isend/irecv take profiler
//        handles before the request.
//   v11: init/finalize per communicator with a context that listen/connect take first;
//        properties gain maxMultiRequestSize; finalize and setNetAttr are appended.
//
// Thread-safety: declarations only.
#ifndef LBCC_PLUGIN_NCCL_NET_H_
#define LBCC_PLUGIN_NCCL_NET_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Every name carries an lbcc prefix so that this header and nccl.h can meet in one translation
// unit (abi_test.cc); the values are the ABI.
typedef enum {
  lbccNcclSuccess = 0,
  lbccNcclUnhandledCudaError = 1,
  lbccNcclSystemError = 2,
  lbccNcclInternalError = 3,
  lbccNcclInvalidArgument = 4,
  lbccNcclInvalidUsage = 5,
  lbccNcclRemoteError = 6,
  lbccNcclInProgress = 7,
  lbccNcclNumResults = 8
} lbccNcclResult_t;

typedef enum {
  LBCC_NCCL_LOG_NONE = 0,
  LBCC_NCCL_LOG_VERSION = 1,
  LBCC_NCCL_LOG_WARN = 2,
  LBCC_NCCL_LOG_INFO = 3,
  LBCC_NCCL_LOG_ABORT = 4,
  LBCC_NCCL_LOG_TRACE = 5
} lbccNcclDebugLogLevel;

// Subsystem flags of a log line (NCCL_DEBUG_SUBSYS); the plugin logs under NET.
#define LBCC_NCCL_LOG_INIT 0x1
#define LBCC_NCCL_LOG_NET 0x10

typedef void (*lbccNcclDebugLogger_t)(lbccNcclDebugLogLevel level, unsigned long flags,
                                      const char* file, int line, const char* fmt, ...);
// Profiler events are not emitted by this plugin; the callback is accepted and ignored.
typedef lbccNcclResult_t (*lbccNcclProfilerCallback_t)(void** event_handle, int type,
                                                       void* parent_handle, int64_t plugin_id,
                                                       void* extra_data);

#define LBCC_NCCL_NET_HANDLE_MAXSIZE 128
#define LBCC_NCCL_PTR_HOST 0x1
#define LBCC_NCCL_PTR_CUDA 0x2
#define LBCC_NCCL_PTR_DMABUF 0x4
#define LBCC_NCCL_NET_MAX_REQUESTS 32
#define LBCC_NCCL_NET_MAX_DEVS_PER_NIC 4
#define LBCC_NCCL_NET_DEVICE_INVALID_VERSION 0x0

typedef enum { LBCC_NCCL_NET_DEVICE_HOST = 0, LBCC_NCCL_NET_DEVICE_UNPACK = 1 } lbccNcclNetDeviceType;

// The same layout in v8 to v11.
typedef struct {
  lbccNcclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} lbccNcclNetDeviceHandle_t;

// ---------------------------------------------------------------------------------------------
// v8

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;  // Mbit/s.
  int port;
  float latency;  // Microseconds.
  int maxComms;
  int maxRecvs;
  lbccNcclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v8_t;

typedef struct {
  const char* name;
  lbccNcclResult_t (*init)(lbccNcclDebugLogger_t logFunction);
  lbccNcclResult_t (*devices)(int* ndev);
  lbccNcclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  lbccNcclResult_t (*listen)(int dev, void* handle, void** listenComm);
  lbccNcclResult_t (*connect)(int dev, void* handle, void** sendComm,
                              lbccNcclNetDeviceHandle_t** sendDevComm);
  lbccNcclResult_t (*accept)(void* listenComm, void** recvComm,
                             lbccNcclNetDeviceHandle_t** recvDevComm);
  lbccNcclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  lbccNcclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                  int fd, void** mhandle);
  lbccNcclResult_t (*deregMr)(void* comm, void* mhandle);
  lbccNcclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle,
                            void** request);
  lbccNcclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags,
                            void** mhandles, void** request);
  lbccNcclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                             void** request);
  lbccNcclResult_t (*test)(void* request, int* done, int* sizes);
  lbccNcclResult_t (*closeSend)(void* sendComm);
  lbccNcclResult_t (*closeRecv)(void* recvComm);
  lbccNcclResult_t (*closeListen)(void* listenComm);
  lbccNcclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  lbccNcclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ncclNet_v8_t;

// ---------------------------------------------------------------------------------------------
// v9

typedef struct {
  int ndevs;
  int devs[LBCC_NCCL_NET_MAX_DEVS_PER_NIC];
} ncclNetVDeviceProps_v9_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  lbccNcclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v9_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
} ncclNetProperties_v9_t;

typedef struct {
  const char* name;
  lbccNcclResult_t (*init)(lbccNcclDebugLogger_t logFunction);
  lbccNcclResult_t (*devices)(int* ndev);
  lbccNcclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t* props);
  lbccNcclResult_t (*listen)(int dev, void* handle, void** listenComm);
  lbccNcclResult_t (*connect)(int dev, void* handle, void** sendComm,
                              lbccNcclNetDeviceHandle_t** sendDevComm);
  lbccNcclResult_t (*accept)(void* listenComm, void** recvComm,
                             lbccNcclNetDeviceHandle_t** recvDevComm);
  lbccNcclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  lbccNcclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                  int fd, void** mhandle);
  lbccNcclResult_t (*deregMr)(void* comm, void* mhandle);
  lbccNcclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                            void** request);
  lbccNcclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                            void** mhandles, void** request);
  lbccNcclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                             void** request);
  lbccNcclResult_t (*test)(void* request, int* done, int* sizes);
  lbccNcclResult_t (*closeSend)(void* sendComm);
  lbccNcclResult_t (*closeRecv)(void* recvComm);
  lbccNcclResult_t (*closeListen)(void* listenComm);
  lbccNcclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  lbccNcclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  lbccNcclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
} ncclNet_v9_t;

// ---------------------------------------------------------------------------------------------
// v10

typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v10_t;
typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

typedef struct {
  int trafficClass;  // -1: undefined.
} ncclNetCommConfig_v10_t;

typedef struct {
  const char* name;
  lbccNcclResult_t (*init)(lbccNcclDebugLogger_t logFunction,
                           lbccNcclProfilerCallback_t profFunction);
  lbccNcclResult_t (*devices)(int* ndev);
  lbccNcclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  lbccNcclResult_t (*listen)(int dev, void* handle, void** listenComm);
  lbccNcclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t* config, void* handle,
                              void** sendComm, lbccNcclNetDeviceHandle_t** sendDevComm);
  lbccNcclResult_t (*accept)(void* listenComm, void** recvComm,
                             lbccNcclNetDeviceHandle_t** recvDevComm);
  lbccNcclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  lbccNcclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                  int fd, void** mhandle);
  lbccNcclResult_t (*deregMr)(void* comm, void* mhandle);
  lbccNcclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                            void* phandle, void** request);
  lbccNcclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                            void** mhandles, void** phandles, void** request);
  lbccNcclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                             void** request);
  lbccNcclResult_t (*test)(void* request, int* done, int* sizes);
  lbccNcclResult_t (*closeSend)(void* sendComm);
  lbccNcclResult_t (*closeRecv)(void* recvComm);
  lbccNcclResult_t (*closeListen)(void* listenComm);
  lbccNcclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  lbccNcclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  lbccNcclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v10_t* props);
} ncclNet_v10_t;

// ---------------------------------------------------------------------------------------------
// v11

typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v11_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v11_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  lbccNcclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v11_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
} ncclNetProperties_v11_t;

typedef struct {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
} ncclNetCommAttr_v11_t;

typedef struct {
  ncclNetCommAttr_v11_t sendCommAttr;
  ncclNetCommAttr_v11_t recvCommAttr;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
} ncclNetAttr_v11_t;

typedef struct {
  const char* name;
  lbccNcclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config,
                           lbccNcclDebugLogger_t logFunction,
                           lbccNcclProfilerCallback_t profFunction);
  lbccNcclResult_t (*devices)(int* ndev);
  lbccNcclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  lbccNcclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  lbccNcclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                              lbccNcclNetDeviceHandle_t** sendDevComm);
  lbccNcclResult_t (*accept)(void* listenComm, void** recvComm,
                             lbccNcclNetDeviceHandle_t** recvDevComm);
  lbccNcclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  lbccNcclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                  int fd, void** mhandle);
  lbccNcclResult_t (*deregMr)(void* comm, void* mhandle);
  lbccNcclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                            void* phandle, void** request);
  lbccNcclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                            void** mhandles, void** phandles, void** request);
  lbccNcclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                             void** request);
  lbccNcclResult_t (*test)(void* request, int* done, int* sizes);
  lbccNcclResult_t (*closeSend)(void* sendComm);
  lbccNcclResult_t (*closeRecv)(void* recvComm);
  lbccNcclResult_t (*closeListen)(void* listenComm);
  lbccNcclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  lbccNcclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  lbccNcclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v11_t* props);
  lbccNcclResult_t (*finalize)(void* ctx);
  lbccNcclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v11_t* netAttr);
} ncclNet_v11_t;

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // LBCC_PLUGIN_NCCL_NET_H_
