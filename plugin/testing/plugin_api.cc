#include "plugin/testing/plugin_api.h"

#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace lbcc::plugin::testing {
namespace {

std::mutex g_log_mu;
std::vector<std::string>* g_log_lines = new std::vector<std::string>;

template <typename Props>
void CopyCommon(const Props& in, Properties* out) {
  out->name = in.name != nullptr ? in.name : "";
  out->has_pci_path = in.pciPath != nullptr;
  out->guid = in.guid;
  out->ptr_support = in.ptrSupport;
  out->reg_is_global = in.regIsGlobal;
  out->speed = in.speed;
  out->port = in.port;
  out->latency = in.latency;
  out->max_comms = in.maxComms;
  out->max_recvs = in.maxRecvs;
  out->net_device_type = static_cast<int>(in.netDeviceType);
  out->net_device_version = in.netDeviceVersion;
}

template <typename Props>
void CopyV9(const Props& in, Properties* out) {
  CopyCommon(in, out);
  out->force_flush = in.forceFlush;
  out->vdevs = in.vProps.ndevs;
  out->vdev0 = in.vProps.devs[0];
  out->max_p2p_bytes = static_cast<int64_t>(in.maxP2pBytes);
  out->max_coll_bytes = static_cast<int64_t>(in.maxCollBytes);
}

template <int V>
struct Types;
template <>
struct Types<8> {
  using Net = ncclNet_v8_t;
  using Props = ncclNetProperties_v8_t;
};
template <>
struct Types<9> {
  using Net = ncclNet_v9_t;
  using Props = ncclNetProperties_v9_t;
};
template <>
struct Types<10> {
  using Net = ncclNet_v10_t;
  using Props = ncclNetProperties_v10_t;
};
template <>
struct Types<11> {
  using Net = ncclNet_v11_t;
  using Props = ncclNetProperties_v11_t;
};

template <int V>
class VersionedApi final : public PluginApi {
 public:
  using Net = typename Types<V>::Net;
  explicit VersionedApi(const Net* net) : net_(net) {}

  int version() const override { return V; }
  const void* table() const override { return net_; }
  std::string name() const override { return net_->name != nullptr ? net_->name : ""; }

  absl::Status Init(uint64_t comm_id, void** ctx) override {
    if constexpr (V == 11) {
      ncclNetCommConfig_v11_t config{-1};
      return FromNccl(net_->init(ctx, comm_id, &config, HarnessLogger, nullptr), "init");
    } else if constexpr (V == 10) {
      if (ctx != nullptr) *ctx = nullptr;
      return FromNccl(net_->init(HarnessLogger, nullptr), "init");
    } else {
      if (ctx != nullptr) *ctx = nullptr;
      return FromNccl(net_->init(HarnessLogger), "init");
    }
  }

  absl::Status Finalize(void* ctx) override {
    if constexpr (V == 11) {
      return FromNccl(net_->finalize(ctx), "finalize");
    } else {
      return absl::UnimplementedError("no finalize before v11");
    }
  }

  absl::Status Devices(int* ndev) override { return FromNccl(net_->devices(ndev), "devices"); }

  absl::Status GetProperties(int dev, Properties* props) override {
    typename Types<V>::Props raw{};
    absl::Status status = FromNccl(net_->getProperties(dev, &raw), "getProperties");
    if (!status.ok()) return status;
    if constexpr (V == 8) {
      CopyCommon(raw, props);
    } else {
      CopyV9(raw, props);
    }
    if constexpr (V == 11) props->max_multi_request_size = raw.maxMultiRequestSize;
    return absl::OkStatus();
  }

  absl::Status Listen(void* ctx, int dev, void* handle, void** listen_comm) override {
    if constexpr (V == 11) {
      return FromNccl(net_->listen(ctx, dev, handle, listen_comm), "listen");
    } else {
      return FromNccl(net_->listen(dev, handle, listen_comm), "listen");
    }
  }

  absl::Status Connect(void* ctx, int dev, void* handle, void** send_comm) override {
    lbccNcclNetDeviceHandle_t* dev_comm = nullptr;
    if constexpr (V == 11) {
      return FromNccl(net_->connect(ctx, dev, handle, send_comm, &dev_comm), "connect");
    } else if constexpr (V == 10) {
      ncclNetCommConfig_v10_t config{-1};
      return FromNccl(net_->connect(dev, &config, handle, send_comm, &dev_comm), "connect");
    } else {
      return FromNccl(net_->connect(dev, handle, send_comm, &dev_comm), "connect");
    }
  }

  absl::Status Accept(void* listen_comm, void** recv_comm) override {
    lbccNcclNetDeviceHandle_t* dev_comm = nullptr;
    return FromNccl(net_->accept(listen_comm, recv_comm, &dev_comm), "accept");
  }

  absl::Status RegMr(void* comm, void* data, size_t size, void** mhandle) override {
    return FromNccl(net_->regMr(comm, data, size, memory_type(), mhandle), "regMr");
  }

  absl::Status DeregMr(void* comm, void* mhandle) override {
    return FromNccl(net_->deregMr(comm, mhandle), "deregMr");
  }

  absl::Status Isend(void* comm, void* data, size_t size, int tag, void* mhandle,
                     void** request) override {
    if constexpr (V == 8) {
      return FromNccl(net_->isend(comm, data, static_cast<int>(size), tag, mhandle, request),
                      "isend");
    } else if constexpr (V == 9) {
      return FromNccl(net_->isend(comm, data, size, tag, mhandle, request), "isend");
    } else {
      return FromNccl(net_->isend(comm, data, size, tag, mhandle, nullptr, request), "isend");
    }
  }

  absl::Status Irecv(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                     void** request) override {
    if constexpr (V == 8) {
      int narrow[8];
      for (int i = 0; i < n && i < 8; ++i) narrow[i] = static_cast<int>(sizes[i]);
      return FromNccl(net_->irecv(comm, n, data, narrow, tags, mhandles, request), "irecv");
    } else if constexpr (V == 9) {
      return FromNccl(net_->irecv(comm, n, data, sizes, tags, mhandles, request), "irecv");
    } else {
      void* phandles[8] = {};
      return FromNccl(net_->irecv(comm, n, data, sizes, tags, mhandles, phandles, request),
                      "irecv");
    }
  }

  absl::Status Iflush(void* recv_comm, void** request) override {
    return FromNccl(net_->iflush(recv_comm, 0, nullptr, nullptr, nullptr, request), "iflush");
  }

  absl::Status Test(void* request, bool* done, int* sizes) override {
    int finished = 0;
    absl::Status status = FromNccl(net_->test(request, &finished, sizes), "test");
    *done = finished != 0;
    return status;
  }

  absl::Status CloseSend(void* comm) override {
    return FromNccl(net_->closeSend(comm), "closeSend");
  }
  absl::Status CloseRecv(void* comm) override {
    return FromNccl(net_->closeRecv(comm), "closeRecv");
  }
  absl::Status CloseListen(void* comm) override {
    return FromNccl(net_->closeListen(comm), "closeListen");
  }

  int RawIsendV8(void* comm, void* data, int size, int tag, void* mhandle,
                 void** request) override {
    if constexpr (V == 8) {
      return net_->isend(comm, data, size, tag, mhandle, request);
    } else {
      return -1;
    }
  }

 private:
  const Net* const net_;
};

}  // namespace

absl::Status FromNccl(int result, const char* call) {
  const std::string what = absl::StrCat(call, " returned ncclResult_t ", result);
  switch (result) {
    case lbccNcclSuccess:
      return absl::OkStatus();
    case lbccNcclSystemError:
      return absl::UnavailableError(absl::StrCat(what, " (ncclSystemError)"));
    case lbccNcclInternalError:
      return absl::InternalError(absl::StrCat(what, " (ncclInternalError)"));
    case lbccNcclInvalidArgument:
      return absl::InvalidArgumentError(absl::StrCat(what, " (ncclInvalidArgument)"));
    case lbccNcclInvalidUsage:
      return absl::FailedPreconditionError(absl::StrCat(what, " (ncclInvalidUsage)"));
    case lbccNcclRemoteError:
      return absl::AbortedError(absl::StrCat(what, " (ncclRemoteError)"));
    default:
      return absl::UnknownError(what);
  }
}

extern "C" void HarnessLogger(lbccNcclDebugLogLevel level, unsigned long flags, const char* file,
                              int line, const char* fmt, ...) {
  char text[2048];
  va_list args;
  va_start(args, fmt);
  vsnprintf(text, sizeof(text), fmt, args);
  va_end(args);
  std::string entry = absl::StrCat("[nccl-log level=", static_cast<int>(level), " flags=0x",
                                   absl::Hex(flags), " ", file != nullptr ? file : "?", ":",
                                   line, "] ", text);
  std::lock_guard<std::mutex> lock(g_log_mu);
  std::fprintf(stderr, "%s\n", entry.c_str());
  g_log_lines->push_back(std::move(entry));
}

std::vector<std::string> LoggedLines() {
  std::lock_guard<std::mutex> lock(g_log_mu);
  return *g_log_lines;
}

bool Logged(const std::string& a, const std::string& b) {
  for (const std::string& line : LoggedLines()) {
    if (absl::StrContains(line, a) && absl::StrContains(line, b)) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<PluginApi>> PluginApi::Load(const std::string& path, int version) {
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    return absl::NotFoundError(absl::StrCat("dlopen(", path, ", RTLD_NOW): ", dlerror()));
  }
  const std::string symbol = absl::StrCat("ncclNetPlugin_v", version);
  void* table = dlsym(library, symbol.c_str());
  if (table == nullptr) return absl::NotFoundError(absl::StrCat(symbol, " not exported"));
  switch (version) {
    case 8:
      return std::make_unique<VersionedApi<8>>(static_cast<const ncclNet_v8_t*>(table));
    case 9:
      return std::make_unique<VersionedApi<9>>(static_cast<const ncclNet_v9_t*>(table));
    case 10:
      return std::make_unique<VersionedApi<10>>(static_cast<const ncclNet_v10_t*>(table));
    case 11:
      return std::make_unique<VersionedApi<11>>(static_cast<const ncclNet_v11_t*>(table));
    default:
      return absl::InvalidArgumentError(absl::StrCat("no plugin version ", version));
  }
}

}  // namespace lbcc::plugin::testing
