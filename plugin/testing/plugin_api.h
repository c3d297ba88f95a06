// The built plugin as NCCL sees it: dlopen(RTLD_NOW) of libnccl-net-lbcc.so, dlsym of one
// ncclNetPlugin_vN table, and calls through it, converted to absl::Status so that the harness's
// traffic loops (traffic.h) run unchanged over every version.
//
// A result other than ncclSuccess becomes a Status whose code tells the result apart
// (ncclSystemError: Unavailable, ncclInternalError: Internal, ncclInvalidArgument:
// InvalidArgument, ncclInvalidUsage: FailedPrecondition, ncclRemoteError: Aborted) and whose
// message names the call and the number.
//
// Thread-safety: like the plugin (calls on different comms may run on different threads).
#ifndef LBCC_PLUGIN_TESTING_PLUGIN_API_H_
#define LBCC_PLUGIN_TESTING_PLUGIN_API_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plugin/nccl_net.h"
#include "plugin/testing/traffic.h"

namespace lbcc::plugin::testing {

// The fields every version's properties have, plus the later ones (-1 where a version lacks it).
struct Properties {
  std::string name;
  bool has_pci_path = false;
  uint64_t guid = 0;
  int ptr_support = 0;
  int reg_is_global = 0;
  int force_flush = -1;
  int speed = 0;
  int port = 0;
  float latency = 0;
  int max_comms = 0;
  int max_recvs = 0;
  int net_device_type = -1;
  int net_device_version = -1;
  int vdevs = -1;
  int vdev0 = -1;
  int64_t max_p2p_bytes = -1;
  int64_t max_coll_bytes = -1;
  int max_multi_request_size = -1;
};

absl::Status FromNccl(int result, const char* call);

// Log lines the plugin sent through the logger passed to init (also copied to stderr).
std::vector<std::string> LoggedLines();
bool Logged(const std::string& a, const std::string& b = "");
// The logger function handed to init.
extern "C" void HarnessLogger(lbccNcclDebugLogLevel level, unsigned long flags, const char* file,
                              int line, const char* fmt, ...);

class PluginApi : public NetOps {
 public:
  // dlopen(path, RTLD_NOW | RTLD_LOCAL) and dlsym("ncclNetPlugin_v<version>"), version 8 to 11.
  static absl::StatusOr<std::unique_ptr<PluginApi>> Load(const std::string& path, int version);
  ~PluginApi() override = default;  // The library stays loaded (like NCCL's).

  virtual int version() const = 0;
  virtual const void* table() const = 0;
  virtual std::string name() const = 0;

  // v8-v10: init(logger). v11: init(&ctx, comm_id, config, logger, profiler); `ctx` receives the
  // context (null for older versions).
  virtual absl::Status Init(uint64_t comm_id, void** ctx) = 0;
  // v11 only (Unimplemented for older versions).
  virtual absl::Status Finalize(void* ctx) = 0;
  virtual absl::Status Devices(int* ndev) = 0;
  virtual absl::Status GetProperties(int dev, Properties* props) = 0;
  virtual absl::Status Listen(void* ctx, int dev, void* handle, void** listen_comm) = 0;
  virtual absl::Status Connect(void* ctx, int dev, void* handle, void** send_comm) = 0;
  virtual absl::Status Accept(void* listen_comm, void** recv_comm) = 0;
  virtual absl::Status Iflush(void* recv_comm, void** request) = 0;
  virtual absl::Status CloseSend(void* comm) = 0;
  virtual absl::Status CloseRecv(void* comm) = 0;
  virtual absl::Status CloseListen(void* comm) = 0;
  // Raw isend for sizes the typed path cannot express (v8: negative int sizes).
  virtual int RawIsendV8(void* comm, void* data, int size, int tag, void* mhandle,
                         void** request) = 0;

  // The memory type RegMr registers buffers as (NCCL_PTR_HOST unless set; NCCL_PTR_CUDA for
  // device buffers).
  void set_memory_type(int type) { memory_type_ = type; }
  int memory_type() const { return memory_type_; }

 private:
  int memory_type_ = LBCC_NCCL_PTR_HOST;
};

}  // namespace lbcc::plugin::testing

#endif  // LBCC_PLUGIN_TESTING_PLUGIN_API_H_
