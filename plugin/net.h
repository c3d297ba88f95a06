// Net: the one implementation behind every version of the NCCL net plugin (nccl_plugin.cc holds
// the thin per-version adapters). It speaks absl::Status; the adapters convert to ncclResult_t in
// one place.
//
// Object graph (what NCCL holds as void* is marked *):
//
//   Net ── Device (one per network device) ── Transport (UCX; made on first use)
//    │        └── DeviceState (shared): listen comms by comm id, accepted endpoints awaiting
//    │            their hello, measured link figures
//    ├── ConnectorPool: connect attempts (run by a small pool of connector threads)
//    └─ *ListenComm ── ListenCore (shared with the DeviceState): endpoints ready for accept()
//       *SendComm / *RecvComm ── CommCore (shared with transport callbacks): Endpoint, request
//                                 slots*, registered regions*
//
// Files: net_options.h (NetOptions, FromEnv), net_limits.h (what NCCL is told), net.cc (Create,
// Shutdown, Properties), net_connect.cc (Listen, Connect, Accept, CloseListen), net_requests.cc
// (RegMr, Isend, Irecv, Test, CloseSend/CloseRecv); private: net_device.h (Device, the hello),
// connector.h (ConnectorPool), comm_core.h (the objects NCCL holds, CommCore, the registry).
//
// Connection set-up never blocks an NCCL thread: listen() starts the device's transport listener
// and an acceptor thread once per device; connect() queues an attempt on the connector pool and
// returns no comm until it finished (the attempt's id lives in the handle's connect stage);
// the connecting side sends a hello naming the listen comm's id, and the acceptor routes the
// endpoint to that listen comm, whose accept() hands it out.
//
// Messages: an isend is one transport Send under the NCCL tag; an irecv of n buffers is n
// transport Recvs under their tags, one request. The transport matches the k-th receive for a tag
// with the k-th send for that tag, which is NCCL's posting order. A receive buffer may be larger
// than the message; a smaller one fails the request.
//
// Device memory (NCCL_PTR_CUDA, when NetOptions::gpu is set): an isend from device memory takes
// a pinned staging buffer from the StagingPool, queues the device-to-host copy on the plugin's
// stream and hands the staging buffer to the transport once the copy finished (sends leave in
// posting order: later sends wait behind a copy). An irecv into device memory receives into
// staging; Test() queues the host-to-device copy once the message landed and reports the request
// done only after that copy finished, so no flush is needed (iflush returns no request). Copies
// are polled in Isend/Irecv/Test, never waited for. When the pool is full, Isend/Irecv return
// no request (NCCL calls again).
//
// Thread-safety: every function may be called from any thread; comms may be created on one thread
// and driven from another (NCCL's proxy service and progress threads). Hot-path calls (Isend,
// Irecv, Test) take only the comm's own mutex. Calls on one request must not race each other.
//
// Lifetime: Close*() fail pending requests (Cancelled), wait up to close_grace for the transport
// to stop touching their buffers, and free the comm; NCCL must not use its requests afterwards.
// Shutdown() (v11 finalize of the last communicator) closes every transport; comms NCCL did not
// close stay valid to close later.
#ifndef LBCC_PLUGIN_NET_H_
#define LBCC_PLUGIN_NET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "plugin/gpu.h"
#include "plugin/net_limits.h"
#include "plugin/net_options.h"
#include "transport/options.h"
#include "transport/transport.h"

namespace lbcc::plugin {

struct DeviceProperties {
  std::string name;
  std::string pci_path;  // Empty: none (virtual or unknown).
  uint64_t guid = 0;
  int speed_mbits = 0;
  float latency_us = 0;
  int max_comms = 0;
  int max_recvs = 0;
  size_t max_message_bytes = 0;
  int ptr_support = kPtrHost;  // kPtrHost, plus kPtrCuda when device memory is staged.
  // Where the speed came from: "configured", "paced", "measured", "interface" or "default".
  std::string speed_source;
};

class ListenComm;
class SendComm;
class RecvComm;
class Request;
class Device;
class ConnectorPool;

class Net {
 public:
  static absl::StatusOr<std::unique_ptr<Net>> Create(NetOptions options);
  ~Net();  // Shutdown().
  Net(const Net&) = delete;
  Net& operator=(const Net&) = delete;

  int num_devices() const;

  // Speed: LBCC_PLUGIN_SPEED_MBITS; else, for a device configured slow, LBCC_SLOW_PACE_MBITS;
  // else the slowest rate the transport probed on a slow link of this device so far; else the
  // interface's speed; else 10000. Latency: LBCC_PLUGIN_LATENCY_US; else half the shortest
  // probed round trip; else 0. InvalidArgument for a bad device.
  absl::StatusOr<DeviceProperties> Properties(int dev) const;

  // Writes the listen handle into handle[0, 128) and returns a new listen comm. Starts the
  // device's transport and listener on first use (Unavailable when that fails).
  absl::StatusOr<ListenComm*> Listen(int dev, absl::Span<uint8_t> handle);

  // Connects to the listen comm `handle` names. Returns nullptr while the attempt runs: call again
  // with the same handle buffer. Errors: InvalidArgument (bad device, not an LBCC handle, stale
  // attempt), Unavailable / DeadlineExceeded (the peer cannot be reached), Cancelled (shut down).
  absl::StatusOr<SendComm*> Connect(int dev, absl::Span<uint8_t> handle);

  // Closes every transport and stops the helper threads. Idempotent.
  void Shutdown();

  // --- Calls that need no Net (the objects carry their state) -------------------------------

  // Returns the next connection made to `listen`, or nullptr when none is ready yet.
  static absl::StatusOr<RecvComm*> Accept(ListenComm* listen);

  // `comm` is a SendComm* or RecvComm*. kPtrHost; kPtrCuda when NetOptions::gpu is set (the
  // pointer must be device memory of one CUDA device); InvalidArgument otherwise. The region
  // stays valid until DeregMr or the comm's close.
  static absl::StatusOr<void*> RegMr(void* comm, void* data, size_t size, int type);
  // Tolerated while requests using the region are in flight (they do not depend on it).
  static absl::Status DeregMr(void* comm, void* mhandle);

  // `data` must stay valid until the request completes. Returns nullptr when kMaxRequests *
  // kMaxRecvs sends are in flight (call again later). `mhandle` may be null; otherwise it must
  // come from RegMr on this comm and cover the buffer.
  static absl::StatusOr<Request*> Isend(SendComm* comm, const void* data, size_t size, int tag,
                                        void* mhandle);
  // n in [1, kMaxRecvs] buffers under one request; nullptr when kMaxRequests are in flight.
  static absl::StatusOr<Request*> Irecv(RecvComm* comm, int n, void* const* data,
                                        const size_t* sizes, const int* tags,
                                        void* const* mhandles);
  // *done = true once every part finished; then sizes[i] (if sizes is not null) holds each
  // part's length and the request is retired. Errors of the transfer are returned (the request
  // is retired then too): Cancelled, Unavailable, InvalidArgument (message larger than buffer).
  static absl::Status Test(Request* request, bool* done, int* sizes);

  static absl::Status CloseSend(SendComm* comm);
  static absl::Status CloseRecv(RecvComm* comm);
  static absl::Status CloseListen(ListenComm* comm);

 private:
  explicit Net(NetOptions options);
  absl::StatusOr<std::unique_ptr<transport::Endpoint>> RunAttempt(Device* device,
                                                                  const std::string& address,
                                                                  uint64_t comm_id);

  const NetOptions options_;
  const uint64_t instance_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::unique_ptr<ConnectorPool> connector_;
};

}  // namespace lbcc::plugin

#endif  // LBCC_PLUGIN_NET_H_
