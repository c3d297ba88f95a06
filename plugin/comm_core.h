// The objects the plugin hands NCCL as void* (listen, send and receive comms, requests, memory
// regions) and the state they share with transport callbacks: CommCore (a comm's endpoint,
// request slots, registered regions, staged parts and send queue), ListenCore (endpoints ready
// for accept()) and DeviceState (what a device shares with its comms). Private to Net (net.h).
//
// Thread-safety: CommCore's mutable state is guarded by its mu (the *Locked methods need it
// held); DeviceState and ListenCore guard theirs by their own mu; the object registry is
// thread-safe. A Request's atomics are read without the lock by Test()'s fast path.
#ifndef LBCC_PLUGIN_COMM_CORE_H_
#define LBCC_PLUGIN_COMM_CORE_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "plugin/gpu.h"
#include "plugin/net_limits.h"
#include "plugin/staging.h"
#include "transport/transport.h"

namespace lbcc::plugin {

// First words of every object NCCL holds, so that a pointer of the wrong kind is refused.
inline constexpr uint32_t kListenMagic = 0x4c4c4331;   // "1CLL"
inline constexpr uint32_t kSendMagic = 0x4c534331;     // "1CSL"
inline constexpr uint32_t kRecvMagic = 0x4c524331;     // "1CRL"
inline constexpr uint32_t kRequestMagic = 0x4c515231;  // "1RQL"
inline constexpr uint32_t kRegionMagic = 0x4c4d5231;   // "1RML"

// Transport tags: NCCL's int tags map to [0, 2^32); the hello (net_device.h) lives above them.
inline transport::Tag DataTag(int tag) {
  return static_cast<transport::Tag>(static_cast<uint32_t>(tag));
}

// A random 64-bit id (listen comms, the Net instance).
uint64_t RandomId();

// "1.23 Gbit/s", for log lines.
std::string Rate(double bytes_per_second);

// Which objects handed to NCCL are alive, for the calls that free them (close, deregister) and
// the cold paths; hot paths check the magic word only.
enum class ObjectKind { kListen, kSend, kRecv };
void RegisterObject(const void* object, ObjectKind kind);
std::optional<ObjectKind> LookupObject(const void* object);
// False when `object` is not alive as `kind`; otherwise forgets it.
bool UnregisterObject(const void* object, ObjectKind kind);

struct MemoryRegion {
  uint32_t magic = kRegionMagic;
  const uint8_t* base = nullptr;
  size_t size = 0;
  int type = kPtrHost;
  int gpu_device = -1;  // kPtrCuda: the CUDA device that holds it.
};

struct ListenCore {
  Mutex mu;
  std::deque<std::unique_ptr<transport::Endpoint>> ready ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;
};

// What a device shares with transport callbacks and comms; no threads, no transport.
struct DeviceState {
  DeviceState(int index, std::string name, std::shared_ptr<StagingPool> staging)
      : index(index), name(std::move(name)), staging(std::move(staging)) {}
  const int index;
  const std::string name;
  // Pinned buffers for NCCL_PTR_CUDA messages; null when the plugin takes host memory only.
  const std::shared_ptr<StagingPool> staging;
  Mutex mu;
  absl::flat_hash_map<uint64_t, std::shared_ptr<ListenCore>> listeners ABSL_GUARDED_BY(mu);
  // Accepted endpoints whose hello has not arrived yet.
  absl::flat_hash_map<uint64_t, std::unique_ptr<transport::Endpoint>> greeting
      ABSL_GUARDED_BY(mu);
  uint64_t next_greeting ABSL_GUARDED_BY(mu) = 0;
  // Closed endpoints, destroyed on the acceptor thread rather than in a transport callback.
  std::vector<std::unique_ptr<transport::Endpoint>> graveyard ABSL_GUARDED_BY(mu);
  bool stopped ABSL_GUARDED_BY(mu) = false;
  // Measured on this device's links (probe at connect): the slowest slow link and the shortest
  // round trip; 0 when none.
  double slowest_slow_bytes_per_second ABSL_GUARDED_BY(mu) = 0;
  double shortest_rtt_seconds ABSL_GUARDED_BY(mu) = 0;
};

struct CommCore;

// One part of a request whose bytes go through a pinned staging buffer (device memory):
//   send: kCopyToHost (device -> staging) -> kOnWire (transport Send from staging) -> kDone;
//   recv: kOnWire (transport Recv into staging) -> kCopyToDevice (staging -> device) -> kDone.
// Copies are polled (Gpu::Done) from Isend/Irecv/Test on NCCL's threads, never waited for.
enum class StageState : uint8_t { kNone, kCopyToHost, kOnWire, kCopyToDevice, kDone };
struct Stage {
  StageState state = StageState::kNone;
  StagingBuffer buffer;
  GpuEvent* event = nullptr;  // The copy in flight, if any.
  int gpu_device = -1;
  uint8_t* user = nullptr;  // The device buffer: the source of a send, the target of a receive.
  bool landed = false;      // Receive: the transport placed the message in the buffer.
};

class Request {
 public:
  uint32_t magic = kRequestMagic;
  CommCore* core = nullptr;  // The comm that owns this slot.
  int index = 0;
  // Guarded by core->mu.
  bool in_use = false;
  bool abandoned = false;  // Test() returned an error while parts were pending.
  int parts = 0;
  // Send: waits in the comm's send queue (behind a send whose staging copy runs) and has not
  // been handed to the transport yet.
  bool queued = false;
  int tag = 0;                    // Send: the NCCL tag.
  const uint8_t* data = nullptr;  // Send: the host buffer (host memory) to hand over.
  size_t size = 0;                // Send: the message size.
  std::array<Stage, kMaxRecvs> stages;
  // Set while the request has staged or queued parts: Test() then takes the slow path, which
  // polls the copies. Written under core->mu.
  std::atomic<bool> slow{false};
  // Transport callbacks not yet run, and whether one failed. Written under core->mu; read without
  // it by Test()'s fast path, so that NCCL's polling does not contend with the callbacks.
  std::atomic<int> pending{0};
  std::atomic<bool> failed{false};
  absl::Status status;
  std::array<size_t, kMaxRecvs> sizes{};
};

struct CommCore {
  CommCore(std::unique_ptr<transport::Endpoint> endpoint, bool send,
           std::shared_ptr<DeviceState> device, absl::Duration close_grace)
      : send(send),
        endpoint(std::move(endpoint)),
        device(std::move(device)),
        close_grace(close_grace),
        requests(send ? kMaxRequests * kMaxRecvs : kMaxRequests) {
    for (int i = static_cast<int>(requests.size()) - 1; i >= 0; --i) {
      requests[i].core = this;
      requests[i].index = i;
      free_requests.push_back(i);
    }
  }
  ~CommCore() {
    for (MemoryRegion* region : regions) delete region;
  }

  const bool send;
  std::weak_ptr<CommCore> self;  // Set once by the comm that owns this core.
  const std::unique_ptr<transport::Endpoint> endpoint;
  const std::shared_ptr<DeviceState> device;
  const absl::Duration close_grace;

  Mutex mu;
  CondVar idle;  // Signalled when callbacks_outstanding reaches 0.
  std::vector<Request> requests;  // Never resized: NCCL holds pointers into it.
  std::vector<int> free_requests ABSL_GUARDED_BY(mu);
  int callbacks_outstanding ABSL_GUARDED_BY(mu) = 0;
  bool closed ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_set<MemoryRegion*> regions ABSL_GUARDED_BY(mu);
  // Staging buffers this comm holds (in requests and zombies). A comm holding none may always
  // take one (StagingPool's must_succeed), so each comm's oldest request can always progress.
  int staging_held ABSL_GUARDED_BY(mu) = 0;
  // Stages of retired requests whose copy still runs: their buffers return to the pool once the
  // copy finished (the GPU must not write into a buffer someone else uses).
  std::vector<Stage> zombies ABSL_GUARDED_BY(mu);
  // Sends not handed to the transport yet, in posting order: a send whose staging copy runs
  // holds back the sends posted after it, so the transport sees NCCL's order.
  std::deque<Request*> send_queue ABSL_GUARDED_BY(mu);

  StagingPool* staging() const { return device->staging.get(); }

  void ReleaseStageLocked(Stage* stage) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Stages whose copy runs become zombies; the others give their buffers back.
  void DropStagesLocked(Request* request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void ReapZombiesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void RetireLocked(Request* request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void FailLocked(Request* request, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Polls the copies of `request`'s stages and moves them on; a receive part whose message
  // landed gets its copy to the device. Never blocks.
  void AdvanceStagesLocked(Request* request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // A failed request's copies that still run go to the zombies.
  void ZombifyCopiesLocked(Request* request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Hands the sends at the head of the queue whose bytes are ready to the transport, in order.
  // Appends them to `issue` (called after the lock is dropped).
  void AdvanceSendsLocked(std::vector<Request*>* issue) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // A transport callback for part `part` of `request`.
  void Complete(Request* request, int part, absl::Status status, size_t size);
};

class ListenComm {
 public:
  uint32_t magic = kListenMagic;
  uint64_t comm_id = 0;
  std::shared_ptr<DeviceState> device;
  std::shared_ptr<ListenCore> core;
  absl::Duration close_grace;
};

class SendComm {
 public:
  uint32_t magic = kSendMagic;
  std::shared_ptr<CommCore> core;
};

class RecvComm {
 public:
  uint32_t magic = kRecvMagic;
  std::shared_ptr<CommCore> core;
};

// Hands sends to the transport (without the comm's lock): each was counted in pending and
// callbacks_outstanding by AdvanceSendsLocked or Isend.
void IssueSends(const std::shared_ptr<CommCore>& core, const std::vector<Request*>& issue);

// Records the link's probed figures on its device and says what kind of link it is.
void NoteNewLink(DeviceState* device, const transport::Endpoint& endpoint, absl::string_view what);

// Closes the comm's endpoint, waits (at most the close grace) for the transport and the GPU
// copies to stop touching NCCL's buffers, gives the staging buffers back and logs the counters.
absl::Status CloseComm(CommCore* core, absl::string_view what);

// The core of an open send or receive comm; InvalidArgument for anything else.
absl::StatusOr<CommCore*> CoreOf(void* comm);

// With core->mu held: whether `mhandle` (if any) is a region of this comm covering the buffer.
absl::Status CheckRegion(CommCore* core, void* mhandle, const void* data, size_t size)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core->mu);

}  // namespace lbcc::plugin

#endif  // LBCC_PLUGIN_COMM_CORE_H_
