// libnccl-net-lbcc.so's exported symbols: ncclNetPlugin_v11, _v10, _v9 and _v8, thin adapters
// over the one implementation in net.h. plugin.lds hides every other symbol.
//
// Each adapter checks NCCL's pointer arguments, converts sizes between versions, calls Net and
// converts the absl::Status to ncclResult_t in ToNccl() (the one conversion; the message goes to
// NCCL's logger as a WARN line).
//
// Init: v8 to v10 call init once per process and never finalize; v11 calls init and finalize
// per communicator. Both hold a reference on one shared Net; the last v11 finalize shuts it down
// and the next init makes a new one. The Net is made from the LBCC_* environment at the first
// init.
#include <atomic>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/mutex.h"
#include "base/version.h"
#include "plugin/handle.h"
#include "plugin/nccl_net.h"
#include "plugin/net.h"

namespace lbcc::plugin {
namespace {

constexpr char kPluginName[] = "LBCC";

// ---------------------------------------------------------------------------------------------
// Logging through NCCL's logger.

std::atomic<lbccNcclDebugLogger_t> g_logger{nullptr};

lbccNcclDebugLogLevel NcclLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kNone:
      return LBCC_NCCL_LOG_NONE;
    case LogLevel::kVersion:
      return LBCC_NCCL_LOG_VERSION;
    case LogLevel::kWarn:
    case LogLevel::kFatal:
      return LBCC_NCCL_LOG_WARN;
    case LogLevel::kInfo:
      return LBCC_NCCL_LOG_INFO;
    case LogLevel::kTrace:
      return LBCC_NCCL_LOG_TRACE;
  }
  return LBCC_NCCL_LOG_INFO;
}

void InstallLogger(lbccNcclDebugLogger_t logger) {
  if (logger == nullptr) return;  // Keep LBCC's own destination (stderr or LBCC_DEBUG_FILE).
  g_logger.store(logger);
  SetLogSink([](LogLevel level, absl::string_view file, int line, absl::string_view message) {
    lbccNcclDebugLogger_t current = g_logger.load();
    if (current == nullptr) return;
    const std::string file_text(file);
    current(NcclLevel(level), LBCC_NCCL_LOG_NET, file_text.c_str(), line, "NET/LBCC %.*s",
            static_cast<int>(message.size()), message.data());
  });
  // Without LBCC_DEBUG, follow NCCL_DEBUG so that NCCL_DEBUG=INFO shows the plugin's INFO lines
  // (NCCL's logger filters by its own level and NCCL_DEBUG_SUBSYS afterwards).
  if (!env::GetForeign("LBCC_DEBUG").has_value()) {
    if (const std::optional<std::string> nccl = env::GetForeign("NCCL_DEBUG")) {
      absl::StatusOr<LogLevel> level = ParseLogLevel(*nccl);
      if (level.ok()) SetLogLevel(*level);
    }
  }
}

void RemoveLogger() {
  SetLogSink(nullptr);
  g_logger.store(nullptr);
}

// ---------------------------------------------------------------------------------------------
// The shared Net, reference counted across inits.

class PluginState {
 public:
  absl::Status Acquire(lbccNcclDebugLogger_t logger) {
    MutexLock lock(&mu_);
    InstallLogger(logger);
    if (net_ == nullptr) {
      absl::Status environment = env::ValidateEnvironment();
      if (!environment.ok()) LBCC_LOG(WARN) << environment.message();
      absl::StatusOr<NetOptions> options = NetOptions::FromEnv();
      if (!options.ok()) return options.status();
      absl::StatusOr<std::unique_ptr<Net>> net = Net::Create(std::move(*options));
      if (!net.ok()) return net.status();
      net_ = std::move(*net);
      LBCC_LOG(INFO) << "LBCC " << LBCC_VERSION_STRING << " net plugin: " << net_->num_devices()
                     << " devices";
    }
    ++refs_;
    return absl::OkStatus();
  }

  void Release() {
    std::unique_ptr<Net> last;
    {
      MutexLock lock(&mu_);
      if (refs_ == 0) return;
      if (--refs_ > 0) return;
      last = std::move(net_);
    }
    last->Shutdown();
    last.reset();
    RemoveLogger();
  }

  // The Net for calls other than init/finalize; FailedPrecondition before init.
  absl::StatusOr<Net*> Get() {
    MutexLock lock(&mu_);
    if (net_ == nullptr) return absl::FailedPreconditionError("the plugin is not initialized");
    return net_.get();
  }

  // At unload or exit: shut the transports down before UCX's own destructors run (this library
  // depends on UCX, so its destructors run first). The Net object stays: another thread may
  // still be inside one of its calls, which then fail with Cancelled.
  void ShutdownAtExit() {
    MutexLock lock(&mu_);
    if (net_ != nullptr) net_->Shutdown();
  }

 private:
  Mutex mu_;
  std::unique_ptr<Net> net_ ABSL_GUARDED_BY(mu_);
  int refs_ ABSL_GUARDED_BY(mu_) = 0;
};

std::atomic<PluginState*> g_state{nullptr};

PluginState& State() {
  static PluginState* state = [] {
    auto* made = new PluginState;  // Never destroyed: see ShutdownAtExit.
    g_state.store(made);
    return made;
  }();
  return *state;
}

__attribute__((destructor)) void UnloadPlugin() {
  if (PluginState* state = g_state.load()) state->ShutdownAtExit();
}

// Strings NCCL keeps pointers to (device names, PCI paths): interned for the process lifetime.
const char* Intern(const std::string& text) {
  static Mutex* mu = new Mutex;
  static std::set<std::string>* strings = new std::set<std::string>;
  MutexLock lock(mu);
  return strings->insert(text).first->c_str();
}

// v11 per-communicator context.
struct Context {
  static constexpr uint32_t kMagic = 0x4c435458;  // "XTCL".
  uint32_t magic = kMagic;
  uint64_t comm_id = 0;
};

// ---------------------------------------------------------------------------------------------
// The one conversion from Status to ncclResult_t.

lbccNcclResult_t ToNccl(const absl::Status& status, const char* call) {
  if (status.ok()) return lbccNcclSuccess;
  LBCC_LOG(WARN) << call << ": " << status;
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kResourceExhausted:
      return lbccNcclSystemError;  // The network or the peer.
    default:
      return lbccNcclInternalError;  // Misuse by the caller, or an LBCC bug.
  }
}

#define LBCC_NCCL_CHECK_ARG(cond, call)                                               \
  do {                                                                                \
    if (!(cond)) return ToNccl(absl::InvalidArgumentError("bad argument: " #cond), call); \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Calls shared by every version.

lbccNcclResult_t InitCommon(lbccNcclDebugLogger_t logger) {
  return ToNccl(State().Acquire(logger), "init");
}

lbccNcclResult_t Devices(int* ndev) {
  LBCC_NCCL_CHECK_ARG(ndev != nullptr, "devices");
  absl::StatusOr<Net*> net = State().Get();
  if (!net.ok()) return ToNccl(net.status(), "devices");
  *ndev = (*net)->num_devices();
  return lbccNcclSuccess;
}

// Fills the fields every version has; the caller fills the rest.
template <typename Props>
lbccNcclResult_t FillCommonProperties(int dev, Props* props, DeviceProperties* out) {
  LBCC_NCCL_CHECK_ARG(props != nullptr, "getProperties");
  absl::StatusOr<Net*> net = State().Get();
  if (!net.ok()) return ToNccl(net.status(), "getProperties");
  absl::StatusOr<DeviceProperties> properties = (*net)->Properties(dev);
  if (!properties.ok()) return ToNccl(properties.status(), "getProperties");
  *out = std::move(*properties);
  std::memset(props, 0, sizeof(Props));
  props->name = const_cast<char*>(Intern(out->name));
  props->pciPath = out->pci_path.empty() ? nullptr : const_cast<char*>(Intern(out->pci_path));
  props->guid = out->guid;
  props->ptrSupport = out->ptr_support;
  props->regIsGlobal = 0;
  props->speed = out->speed_mbits;
  props->port = 0;
  props->latency = out->latency_us;
  props->maxComms = out->max_comms;
  props->maxRecvs = out->max_recvs;
  props->netDeviceType = LBCC_NCCL_NET_DEVICE_HOST;
  props->netDeviceVersion = LBCC_NCCL_NET_DEVICE_INVALID_VERSION;
  return lbccNcclSuccess;
}

template <typename Props>
lbccNcclResult_t FillV9Properties(int dev, Props* props) {
  DeviceProperties out;
  lbccNcclResult_t result = FillCommonProperties(dev, props, &out);
  if (result != lbccNcclSuccess) return result;
  props->forceFlush = 0;
  props->vProps.ndevs = 1;
  props->vProps.devs[0] = dev;
  props->maxP2pBytes = out.max_message_bytes;
  props->maxCollBytes = out.max_message_bytes;
  return lbccNcclSuccess;
}

lbccNcclResult_t GetPropertiesV8(int dev, ncclNetProperties_v8_t* props) {
  DeviceProperties out;
  return FillCommonProperties(dev, props, &out);
}

lbccNcclResult_t GetPropertiesV9(int dev, ncclNetProperties_v9_t* props) {
  return FillV9Properties(dev, props);
}

lbccNcclResult_t GetPropertiesV11(int dev, ncclNetProperties_v11_t* props) {
  lbccNcclResult_t result = FillV9Properties(dev, props);
  if (result == lbccNcclSuccess) props->maxMultiRequestSize = 1;
  return result;
}

lbccNcclResult_t Listen(int dev, void* handle, void** listen_comm) {
  LBCC_NCCL_CHECK_ARG(handle != nullptr && listen_comm != nullptr, "listen");
  *listen_comm = nullptr;
  absl::StatusOr<Net*> net = State().Get();
  if (!net.ok()) return ToNccl(net.status(), "listen");
  absl::StatusOr<ListenComm*> comm =
      (*net)->Listen(dev, absl::MakeSpan(static_cast<uint8_t*>(handle), kHandleBytes));
  if (!comm.ok()) return ToNccl(comm.status(), "listen");
  *listen_comm = *comm;
  return lbccNcclSuccess;
}

lbccNcclResult_t Connect(int dev, void* handle, void** send_comm) {
  LBCC_NCCL_CHECK_ARG(handle != nullptr && send_comm != nullptr, "connect");
  *send_comm = nullptr;
  absl::StatusOr<Net*> net = State().Get();
  if (!net.ok()) return ToNccl(net.status(), "connect");
  absl::StatusOr<SendComm*> comm =
      (*net)->Connect(dev, absl::MakeSpan(static_cast<uint8_t*>(handle), kHandleBytes));
  if (!comm.ok()) return ToNccl(comm.status(), "connect");
  *send_comm = *comm;
  return lbccNcclSuccess;
}

lbccNcclResult_t Accept(void* listen_comm, void** recv_comm, lbccNcclNetDeviceHandle_t**) {
  LBCC_NCCL_CHECK_ARG(recv_comm != nullptr, "accept");
  *recv_comm = nullptr;
  absl::StatusOr<RecvComm*> comm = Net::Accept(static_cast<ListenComm*>(listen_comm));
  if (!comm.ok()) return ToNccl(comm.status(), "accept");
  *recv_comm = *comm;
  return lbccNcclSuccess;
}

lbccNcclResult_t RegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  LBCC_NCCL_CHECK_ARG(mhandle != nullptr, "regMr");
  *mhandle = nullptr;
  absl::StatusOr<void*> region = Net::RegMr(comm, data, size, type);
  if (!region.ok()) return ToNccl(region.status(), "regMr");
  *mhandle = *region;
  return lbccNcclSuccess;
}

lbccNcclResult_t DeregMr(void* comm, void* mhandle) {
  return ToNccl(Net::DeregMr(comm, mhandle), "deregMr");
}

lbccNcclResult_t Isend(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                       void** request) {
  LBCC_NCCL_CHECK_ARG(request != nullptr, "isend");
  *request = nullptr;
  absl::StatusOr<Request*> sent =
      Net::Isend(static_cast<SendComm*>(send_comm), data, size, tag, mhandle);
  if (!sent.ok()) return ToNccl(sent.status(), "isend");
  *request = *sent;
  return lbccNcclSuccess;
}

lbccNcclResult_t Irecv(void* recv_comm, int n, void** data, const size_t* sizes, int* tags,
                       void** mhandles, void** request) {
  LBCC_NCCL_CHECK_ARG(request != nullptr, "irecv");
  *request = nullptr;
  absl::StatusOr<Request*> posted =
      Net::Irecv(static_cast<RecvComm*>(recv_comm), n, data, sizes, tags, mhandles);
  if (!posted.ok()) return ToNccl(posted.status(), "irecv");
  *request = *posted;
  return lbccNcclSuccess;
}

// No flush is ever needed, so no request: host memory needs none, and a receive into CUDA memory
// is staged (net.h): test() reports it done only after the copy from the pinned staging buffer
// into the device buffer finished, so the data already sits in GPU memory in the GPU's own order.
// (GPUDirect plugins flush because a NIC's PCIe writes may still be in flight; a finished
// cudaMemcpyAsync has none.)
lbccNcclResult_t Iflush(void* recv_comm, int, void**, int*, void**, void** request) {
  LBCC_NCCL_CHECK_ARG(recv_comm != nullptr && request != nullptr, "iflush");
  *request = nullptr;
  return lbccNcclSuccess;
}

lbccNcclResult_t Test(void* request, int* done, int* sizes) {
  LBCC_NCCL_CHECK_ARG(done != nullptr, "test");
  bool finished = false;
  absl::Status status = Net::Test(static_cast<Request*>(request), &finished, sizes);
  *done = finished ? 1 : 0;
  return ToNccl(status, "test");
}

lbccNcclResult_t CloseSend(void* comm) {
  return ToNccl(Net::CloseSend(static_cast<SendComm*>(comm)), "closeSend");
}
lbccNcclResult_t CloseRecv(void* comm) {
  return ToNccl(Net::CloseRecv(static_cast<RecvComm*>(comm)), "closeRecv");
}
lbccNcclResult_t CloseListen(void* comm) {
  return ToNccl(Net::CloseListen(static_cast<ListenComm*>(comm)), "closeListen");
}

// ---------------------------------------------------------------------------------------------
// Per-version adapters.

lbccNcclResult_t InitV8(lbccNcclDebugLogger_t logger) { return InitCommon(logger); }

lbccNcclResult_t InitV10(lbccNcclDebugLogger_t logger, lbccNcclProfilerCallback_t) {
  return InitCommon(logger);
}

lbccNcclResult_t InitV11(void** ctx, uint64_t comm_id, ncclNetCommConfig_v11_t*,
                         lbccNcclDebugLogger_t logger, lbccNcclProfilerCallback_t) {
  LBCC_NCCL_CHECK_ARG(ctx != nullptr, "init");
  *ctx = nullptr;
  lbccNcclResult_t result = InitCommon(logger);
  if (result != lbccNcclSuccess) return result;
  auto* context = new Context;
  context->comm_id = comm_id;
  *ctx = context;
  return lbccNcclSuccess;
}

lbccNcclResult_t FinalizeV11(void* ctx) {
  auto* context = static_cast<Context*>(ctx);
  if (context == nullptr || context->magic != Context::kMagic) {
    return ToNccl(absl::InvalidArgumentError("finalize: not a context of this plugin"),
                  "finalize");
  }
  context->magic = 0;
  delete context;
  State().Release();
  return lbccNcclSuccess;
}

lbccNcclResult_t SetNetAttrV11(void* ctx, ncclNetAttr_v11_t*) {
  // Traffic hints (peers, flows, collective) do not change how LBCC schedules a link.
  auto* context = static_cast<Context*>(ctx);
  if (context == nullptr || context->magic != Context::kMagic) {
    return ToNccl(absl::InvalidArgumentError("setNetAttr: not a context of this plugin"),
                  "setNetAttr");
  }
  return lbccNcclSuccess;
}

lbccNcclResult_t CheckContext(void* ctx, const char* call) {
  auto* context = static_cast<Context*>(ctx);
  if (context != nullptr && context->magic != Context::kMagic) {
    return ToNccl(absl::InvalidArgumentError("not a context of this plugin"), call);
  }
  return lbccNcclSuccess;
}

lbccNcclResult_t ListenV11(void* ctx, int dev, void* handle, void** listen_comm) {
  if (lbccNcclResult_t r = CheckContext(ctx, "listen"); r != lbccNcclSuccess) return r;
  return Listen(dev, handle, listen_comm);
}

lbccNcclResult_t ConnectV8(int dev, void* handle, void** send_comm, lbccNcclNetDeviceHandle_t**) {
  return Connect(dev, handle, send_comm);
}

lbccNcclResult_t ConnectV10(int dev, ncclNetCommConfig_v10_t*, void* handle, void** send_comm,
                            lbccNcclNetDeviceHandle_t**) {
  return Connect(dev, handle, send_comm);
}

lbccNcclResult_t ConnectV11(void* ctx, int dev, void* handle, void** send_comm,
                            lbccNcclNetDeviceHandle_t**) {
  if (lbccNcclResult_t r = CheckContext(ctx, "connect"); r != lbccNcclSuccess) return r;
  return Connect(dev, handle, send_comm);
}

lbccNcclResult_t IsendV8(void* send_comm, void* data, int size, int tag, void* mhandle,
                         void** request) {
  if (size < 0) {
    if (request != nullptr) *request = nullptr;
    return ToNccl(absl::InvalidArgumentError(absl::StrCat("isend of ", size, " bytes")), "isend");
  }
  return Isend(send_comm, data, static_cast<size_t>(size), tag, mhandle, request);
}

lbccNcclResult_t IsendV9(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                         void** request) {
  return Isend(send_comm, data, size, tag, mhandle, request);
}

lbccNcclResult_t IsendV10(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                          void*, void** request) {
  return Isend(send_comm, data, size, tag, mhandle, request);
}

lbccNcclResult_t IrecvV8(void* recv_comm, int n, void** data, int* sizes, int* tags,
                         void** mhandles, void** request) {
  if (request != nullptr) *request = nullptr;
  if (n < 1 || n > kMaxRecvs || sizes == nullptr) {
    return ToNccl(absl::InvalidArgumentError(absl::StrCat("irecv of ", n, " buffers")), "irecv");
  }
  size_t wide[kMaxRecvs];
  for (int i = 0; i < n; ++i) {
    if (sizes[i] < 0) {
      return ToNccl(absl::InvalidArgumentError(absl::StrCat("irecv buffer of ", sizes[i],
                                                            " bytes")),
                    "irecv");
    }
    wide[i] = static_cast<size_t>(sizes[i]);
  }
  return Irecv(recv_comm, n, data, wide, tags, mhandles, request);
}

lbccNcclResult_t IrecvV9(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                         void** mhandles, void** request) {
  return Irecv(recv_comm, n, data, sizes, tags, mhandles, request);
}

lbccNcclResult_t IrecvV10(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                          void** mhandles, void**, void** request) {
  return Irecv(recv_comm, n, data, sizes, tags, mhandles, request);
}

}  // namespace
}  // namespace lbcc::plugin

// ---------------------------------------------------------------------------------------------
// The exported tables. Optional entries NCCL checks for null stay null: DMA-BUF (not advertised;
// CUDA memory is staged, never registered with the NIC), device offload (getDeviceMr, irecvConsumed: host plugins report NCCL_NET_DEVICE_HOST)
// and virtual NICs (makeVDevice: NCCL then uses the physical devices).

using namespace lbcc::plugin;  // NOLINT: the tables below name many adapters.

extern "C" {

__attribute__((visibility("default"))) ncclNet_v8_t ncclNetPlugin_v8 = {
    kPluginName, InitV8,   Devices,   GetPropertiesV8, Listen,    ConnectV8,  Accept,
    RegMr,       nullptr,  DeregMr,   IsendV8,         IrecvV8,   Iflush,     Test,
    CloseSend,   CloseRecv, CloseListen, nullptr,      nullptr,
};

__attribute__((visibility("default"))) ncclNet_v9_t ncclNetPlugin_v9 = {
    kPluginName, InitV8,    Devices,     GetPropertiesV9, Listen, ConnectV8, Accept,
    RegMr,       nullptr,   DeregMr,     IsendV9,         IrecvV9, Iflush,   Test,
    CloseSend,   CloseRecv, CloseListen, nullptr,         nullptr, nullptr,
};

__attribute__((visibility("default"))) ncclNet_v10_t ncclNetPlugin_v10 = {
    kPluginName, InitV10,   Devices,     GetPropertiesV9, Listen,   ConnectV10, Accept,
    RegMr,       nullptr,   DeregMr,     IsendV10,        IrecvV10, Iflush,     Test,
    CloseSend,   CloseRecv, CloseListen, nullptr,         nullptr,  nullptr,
};

__attribute__((visibility("default"))) ncclNet_v11_t ncclNetPlugin_v11 = {
    kPluginName, InitV11,   Devices,     GetPropertiesV11, ListenV11, ConnectV11, Accept,
    RegMr,       nullptr,   DeregMr,     IsendV10,         IrecvV10,  Iflush,     Test,
    CloseSend,   CloseRecv, CloseListen, nullptr,          nullptr,   nullptr,    FinalizeV11,
    SetNetAttrV11,
};

}  // extern "C"
