#include "plugin/net.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "plugin/device.h"
#include "plugin/gpu.h"
#include "plugin/handle.h"
#include "plugin/staging.h"
#include "transport/options.h"

namespace lbcc::plugin {

using transport::Endpoint;
using transport::LinkClass;

namespace {

// First words of every object NCCL holds, so that a pointer of the wrong kind is refused.
constexpr uint32_t kListenMagic = 0x4c4c4331;   // "1CLL"
constexpr uint32_t kSendMagic = 0x4c534331;     // "1CSL"
constexpr uint32_t kRecvMagic = 0x4c524331;     // "1CRL"
constexpr uint32_t kRequestMagic = 0x4c515231;  // "1RQL"
constexpr uint32_t kRegionMagic = 0x4c4d5231;   // "1RML"

// Transport tags: NCCL's int tags map to [0, 2^32); the hello lives above them.
constexpr transport::Tag kHelloTag = transport::Tag{1} << 63;
constexpr uint32_t kHelloMagic = 0x4948424c;  // "LBHI".
constexpr uint16_t kHelloVersion = 1;
constexpr size_t kHelloBytes = 16;

// Connection attempts run on at most this many threads.
constexpr int kConnectThreads = 4;
// One transport Connect() call waits at most this long (doubling up to kMaxSlice) so that
// Shutdown() never waits long for a running attempt.
constexpr absl::Duration kFirstSlice = absl::Seconds(5);
constexpr absl::Duration kMaxSlice = absl::Seconds(60);
// The acceptor thread looks at its stop flag this often.
constexpr absl::Duration kAcceptPoll = absl::Milliseconds(100);

transport::Tag DataTag(int tag) { return static_cast<transport::Tag>(static_cast<uint32_t>(tag)); }

uint64_t RandomId() {
  static std::atomic<uint64_t> counter{0};
  std::random_device device;
  const uint64_t random = (uint64_t{device()} << 32) ^ device();
  return random ^ (counter.fetch_add(1) * 0x9e3779b97f4a7c15ull);
}

std::string Rate(double bytes_per_second) {
  return absl::StrFormat("%.3g Gbit/s", bytes_per_second * 8e-9);
}

// Which objects handed to NCCL are alive, for the calls that free them (close, deregister) and
// the cold paths; hot paths check the magic word only.
enum class Kind { kListen, kSend, kRecv };
struct Registry {
  Mutex mu;
  absl::flat_hash_map<const void*, Kind> live ABSL_GUARDED_BY(mu);
};
Registry& GetRegistry() {
  static Registry* registry = new Registry;  // Never destroyed: comms may outlive everything.
  return *registry;
}
void Register(const void* object, Kind kind) {
  Registry& registry = GetRegistry();
  MutexLock lock(&registry.mu);
  registry.live[object] = kind;
}
std::optional<Kind> Lookup(const void* object) {
  Registry& registry = GetRegistry();
  MutexLock lock(&registry.mu);
  auto it = registry.live.find(object);
  if (it == registry.live.end()) return std::nullopt;
  return it->second;
}
bool Unregister(const void* object, Kind kind) {
  Registry& registry = GetRegistry();
  MutexLock lock(&registry.mu);
  auto it = registry.live.find(object);
  if (it == registry.live.end() || it->second != kind) return false;
  registry.live.erase(it);
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Objects NCCL holds.

struct MemoryRegion {
  uint32_t magic = kRegionMagic;
  const uint8_t* base = nullptr;
  size_t size = 0;
  int type = kPtrHost;
  int gpu_device = -1;  // kPtrCuda: the CUDA device that holds it.
};

struct ListenCore {
  Mutex mu;
  std::deque<std::unique_ptr<Endpoint>> ready ABSL_GUARDED_BY(mu);
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
  absl::flat_hash_map<uint64_t, std::unique_ptr<Endpoint>> greeting ABSL_GUARDED_BY(mu);
  uint64_t next_greeting ABSL_GUARDED_BY(mu) = 0;
  // Closed endpoints, destroyed on the acceptor thread rather than in a transport callback.
  std::vector<std::unique_ptr<Endpoint>> graveyard ABSL_GUARDED_BY(mu);
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
  CommCore(std::unique_ptr<Endpoint> endpoint, bool send, std::shared_ptr<DeviceState> device,
           absl::Duration close_grace)
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
  const std::unique_ptr<Endpoint> endpoint;
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

  void ReleaseStageLocked(Stage* stage) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (stage->event != nullptr) {
      staging()->gpu()->Release(stage->event);
      stage->event = nullptr;
    }
    if (stage->buffer.data != nullptr) {
      staging()->Release(stage->buffer);
      stage->buffer = {};
      --staging_held;
    }
    stage->state = StageState::kNone;
  }

  // Stages whose copy runs become zombies; the others give their buffers back.
  void DropStagesLocked(Request* request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (Stage& stage : request->stages) {
      if (stage.state == StageState::kNone) continue;
      if (stage.event != nullptr) {
        zombies.push_back(stage);
        stage = Stage();
      } else {
        ReleaseStageLocked(&stage);
      }
    }
  }

  void ReapZombiesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (size_t i = 0; i < zombies.size();) {
      absl::StatusOr<bool> done = staging()->gpu()->Done(zombies[i].event);
      if (done.ok() && !*done) {
        ++i;
        continue;
      }
      ReleaseStageLocked(&zombies[i]);
      zombies[i] = zombies.back();
      zombies.pop_back();
    }
  }

  void RetireLocked(Request* request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    DropStagesLocked(request);
    request->in_use = false;
    request->abandoned = false;
    request->queued = false;
    request->slow.store(false, std::memory_order_relaxed);
    free_requests.push_back(request->index);
  }

  void FailLocked(Request* request, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (request->status.ok()) {
      request->status = std::move(status);
      request->failed.store(true, std::memory_order_release);
    }
  }

  // Polls the copies of `request`'s stages and moves them on; a receive part whose message
  // landed gets its copy to the device. Never blocks.
  void AdvanceStagesLocked(Request* request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Gpu* gpu = staging() != nullptr ? staging()->gpu() : nullptr;
    for (int i = 0; i < request->parts; ++i) {
      Stage& stage = request->stages[i];
      if (stage.state == StageState::kOnWire && !send && stage.landed) {
        if (request->sizes[i] == 0) {
          stage.state = StageState::kDone;
          continue;
        }
        absl::StatusOr<GpuEvent*> event =
            gpu->CopyAsync(stage.gpu_device, stage.user, stage.buffer.data, request->sizes[i],
                           Gpu::Direction::kHostToDevice);
        if (!event.ok()) {
          FailLocked(request, event.status());
          stage.state = StageState::kDone;
          continue;
        }
        stage.event = *event;
        stage.state = StageState::kCopyToDevice;
      }
      if (stage.state != StageState::kCopyToHost && stage.state != StageState::kCopyToDevice) {
        continue;
      }
      absl::StatusOr<bool> done = gpu->Done(stage.event);
      if (done.ok() && !*done) continue;
      gpu->Release(stage.event);
      stage.event = nullptr;
      if (!done.ok()) {
        FailLocked(request, done.status());
        stage.state = StageState::kDone;
      } else {
        stage.state =
            stage.state == StageState::kCopyToHost ? StageState::kOnWire : StageState::kDone;
      }
      if (stage.state == StageState::kDone && stage.buffer.data != nullptr) {
        staging()->Release(stage.buffer);  // The bytes are in the device buffer.
        stage.buffer = {};
        --staging_held;
      }
    }
  }

  // A failed request's copies that still run go to the zombies.
  void ZombifyCopiesLocked(Request* request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (Stage& stage : request->stages) {
      if (stage.event == nullptr) continue;
      zombies.push_back(stage);
      stage = Stage();
    }
  }

  // Hands the sends at the head of the queue whose bytes are ready to the transport, in order.
  // Appends them to `issue` (called after the lock is dropped).
  void AdvanceSendsLocked(std::vector<Request*>* issue) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (!send_queue.empty()) {
      Request* request = send_queue.front();
      Stage& stage = request->stages[0];
      if (stage.state == StageState::kCopyToHost) AdvanceStagesLocked(request);
      if (stage.state == StageState::kCopyToHost) return;  // Still copying: later ones wait.
      send_queue.pop_front();
      request->queued = false;
      if (!request->status.ok()) {  // The copy failed: nothing to send.
        if (request->abandoned) RetireLocked(request);
        continue;
      }
      if (stage.state == StageState::kOnWire) request->data = stage.buffer.data;
      request->pending.fetch_add(1, std::memory_order_relaxed);
      ++callbacks_outstanding;
      issue->push_back(request);
    }
  }

  // A transport callback for part `part` of `request`.
  void Complete(Request* request, int part, absl::Status status, size_t size) {
    MutexLock lock(&mu);
    if (status.ok()) {
      request->sizes[part] = size;
      request->stages[part].landed = true;
    } else if (request->status.ok()) {
      request->status = std::move(status);
      request->failed.store(true, std::memory_order_release);
    }
    const int left = request->pending.fetch_sub(1, std::memory_order_acq_rel) - 1;
    if (left == 0 && request->abandoned) RetireLocked(request);
    if (--callbacks_outstanding == 0) idle.SignalAll();
  }
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

namespace {

// Hands sends to the transport (without the comm's lock): each was counted in pending and
// callbacks_outstanding by AdvanceSendsLocked or Isend.
void IssueSends(const std::shared_ptr<CommCore>& core, const std::vector<Request*>& issue) {
  for (Request* request : issue) {
    const size_t size = request->size;
    core->endpoint->Send(DataTag(request->tag), absl::MakeConstSpan(request->data, size), {},
                         [core, request, size](absl::Status status) {
                           core->Complete(request, 0, std::move(status), size);
                         });
  }
}

// Records the link's probed figures on its device and says what kind of link it is.
void NoteNewLink(DeviceState* device, const Endpoint& endpoint, absl::string_view what) {
  const transport::LinkCounters counters = endpoint.counters();
  {
    MutexLock lock(&device->mu);
    const double slowest =
        std::min(counters.probed_send_bytes_per_second, counters.probed_recv_bytes_per_second);
    if (counters.link_class == LinkClass::kSlow && slowest > 0 &&
        (device->slowest_slow_bytes_per_second == 0 ||
         slowest < device->slowest_slow_bytes_per_second)) {
      device->slowest_slow_bytes_per_second = slowest;
    }
    if (counters.probed_rtt_seconds > 0 &&
        (device->shortest_rtt_seconds == 0 ||
         counters.probed_rtt_seconds < device->shortest_rtt_seconds)) {
      device->shortest_rtt_seconds = counters.probed_rtt_seconds;
    }
  }
  std::string probe;
  if (counters.probed_send_bytes_per_second > 0) {
    probe = absl::StrCat(", probed ", Rate(counters.probed_send_bytes_per_second), " up, ",
                         Rate(counters.probed_recv_bytes_per_second), " down");
  }
  if (counters.probed_rtt_seconds > 0) {
    absl::StrAppend(&probe, absl::StrFormat(", rtt %.0f us", counters.probed_rtt_seconds * 1e6));
  }
  LBCC_LOG(INFO) << "dev " << device->index << " (" << device->name << "): " << what << " "
                 << endpoint.peer_address() << ": " << LinkClassName(counters.link_class)
                 << " link, " << counters.stripes << " stripes" << probe;
}

absl::Status CloseComm(CommCore* core, absl::string_view what) {
  {
    MutexLock lock(&core->mu);
    core->closed = true;
  }
  // Pending requests fail with Cancelled; their callbacks follow once the transport no longer
  // touches NCCL's buffers, which NCCL frees after this returns: wait for them.
  core->endpoint->Close();
  {
    MutexLock lock(&core->mu);
    const absl::Time deadline = absl::Now() + core->close_grace;
    while (core->callbacks_outstanding > 0) {
      if (core->idle.WaitWithDeadline(&core->mu, deadline) &&
          core->callbacks_outstanding > 0) {
        LBCC_LOG(WARN) << "closing " << what << " to " << core->endpoint->peer_address() << ": "
                       << core->callbacks_outstanding << " transfers did not finish within "
                       << absl::FormatDuration(core->close_grace);
        break;
      }
    }
    // Copies between NCCL's device buffers and staging still running: wait for them (polling;
    // at most the grace), then give every staging buffer back.
    if (core->staging() != nullptr) {
      core->send_queue.clear();
      for (Request& request : core->requests) {
        if (request.in_use) core->ZombifyCopiesLocked(&request);
      }
      core->ReapZombiesLocked();
      while (!core->zombies.empty() && absl::Now() < deadline) {
        core->mu.Unlock();
        absl::SleepFor(absl::Microseconds(200));
        core->mu.Lock();
        core->ReapZombiesLocked();
      }
      if (!core->zombies.empty()) {
        LBCC_LOG(WARN) << "closing " << what << ": " << core->zombies.size()
                       << " GPU copies did not finish within "
                       << absl::FormatDuration(core->close_grace) << "; their staging is leaked";
        core->zombies.clear();
      }
      for (Request& request : core->requests) {
        if (request.in_use) core->DropStagesLocked(&request);
      }
    }
  }
  const transport::LinkCounters c = core->endpoint->counters();
  const uint64_t bytes = core->send ? c.bytes_sent : c.bytes_received;
  const uint64_t messages = core->send ? c.messages_sent : c.messages_received;
  const uint64_t chunks = core->send ? c.chunks_sent : c.chunks_received;
  const double rate = core->send ? c.send_bytes_per_second : c.recv_bytes_per_second;
  LBCC_LOG(INFO) << "closed " << what << " to " << core->endpoint->peer_address() << ": "
                 << LinkClassName(c.link_class) << " link, " << messages << " messages, " << bytes
                 << " bytes, " << chunks << " chunks over " << c.stripes << " stripes, "
                 << c.pacing_waits << " pacing waits, " << Rate(rate) << " while busy";
  return absl::OkStatus();
}

absl::StatusOr<CommCore*> CoreOf(void* comm) {
  if (comm == nullptr) return absl::InvalidArgumentError("null comm");
  std::optional<Kind> kind = Lookup(comm);
  if (kind == Kind::kSend) return static_cast<SendComm*>(comm)->core.get();
  if (kind == Kind::kRecv) return static_cast<RecvComm*>(comm)->core.get();
  return absl::InvalidArgumentError("not an open send or receive comm of this plugin");
}

// With core->mu held: whether `mhandle` (if any) is a region of this comm covering the buffer.
absl::Status CheckRegion(CommCore* core, void* mhandle, const void* data, size_t size)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core->mu) {
  if (mhandle == nullptr) return absl::OkStatus();
  auto* region = static_cast<MemoryRegion*>(mhandle);
  if (!core->regions.contains(region)) {
    return absl::InvalidArgumentError("memory handle was not registered on this comm");
  }
  const auto* begin = static_cast<const uint8_t*>(data);
  if (size > 0 && (begin < region->base || begin + size > region->base + region->size)) {
    return absl::InvalidArgumentError("buffer lies outside its registered region");
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Device: a transport, its listener and the acceptor thread that routes incoming connections.

class Device {
 public:
  Device(int index, DeviceSpec spec, const NetOptions* options,
         std::shared_ptr<StagingPool> staging)
      : spec_(std::move(spec)),
        options_(options),
        state_(std::make_shared<DeviceState>(index, spec_.name, std::move(staging))) {}
  ~Device() { Shutdown(); }

  const DeviceSpec& spec() const { return spec_; }
  const std::shared_ptr<DeviceState>& state() const { return state_; }

  // The transport connections go out through: the device's one transport, also for connections
  // to its own listener (NCCL connects a process to itself; the transport keeps both ends apart).
  absl::StatusOr<transport::Transport*> TransportForConnect() {
    MutexLock lock(&mu_);
    return GetTransportLocked();
  }

  // Starts the listener and the acceptor once; returns the address peers connect to.
  absl::StatusOr<std::string> EnsureListening() {
    MutexLock lock(&mu_);
    if (!address_.empty()) return address_;
    LBCC_ASSIGN_OR_RETURN(transport::Transport * transport, GetTransportLocked());
    LBCC_ASSIGN_OR_RETURN(address_, transport->Listen(spec_.listen_address),
                          _.Prepend(absl::StrCat("device ", spec_.name, ": ")));
    acceptor_ = std::thread([this, transport] { AcceptLoop(transport); });
    LBCC_LOG(INFO) << "dev " << state_->index << " (" << spec_.name << ") listens on " << address_
                   << " over " << transport->backend();
    return address_;
  }

  // Shuts the transport down without destroying it: connection attempts blocked in it on the
  // connector threads and the acceptor's Accept() return Cancelled at once.
  void Interrupt() {
    stop_.store(true);
    MutexLock lock(&mu_);
    if (transport_ != nullptr) transport_->Shutdown();
  }

  void Shutdown() {
    std::unique_ptr<transport::Transport> transport;
    {
      MutexLock lock(&mu_);
      if (shut_down_) return;
      shut_down_ = true;
      transport = std::move(transport_);
    }
    stop_.store(true);
    if (acceptor_.joinable()) acceptor_.join();
    std::vector<std::unique_ptr<Endpoint>> endpoints;
    std::vector<std::shared_ptr<ListenCore>> listeners;
    {
      MutexLock lock(&state_->mu);
      state_->stopped = true;
      for (auto& [id, endpoint] : state_->greeting) endpoints.push_back(std::move(endpoint));
      state_->greeting.clear();
      for (auto& endpoint : state_->graveyard) endpoints.push_back(std::move(endpoint));
      state_->graveyard.clear();
      for (auto& [id, listener] : state_->listeners) listeners.push_back(listener);
    }
    for (auto& listener : listeners) {
      MutexLock lock(&listener->mu);
      for (auto& endpoint : listener->ready) endpoints.push_back(std::move(endpoint));
      listener->ready.clear();
    }
    endpoints.clear();  // Closes them.
    // Closes every endpoint they made: open comms fail with Cancelled.
    transport.reset();
  }

 private:
  absl::StatusOr<transport::Transport*> GetTransportLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shut_down_) return absl::CancelledError("plugin shut down");
    if (transport_ == nullptr) {
      // UCX's tcp transport takes the listen address's family first (transport/options.h).
      transport::TransportOptions options = options_->transport;
      const absl::Status family = transport::PinUcxAddressFamily(
          absl::StartsWith(spec_.listen_address, "["), !spec_.ifname.empty(), &options);
      if (!family.ok()) return Annotate(family, absl::StrCat("device ", spec_.name));
      LBCC_ASSIGN_OR_RETURN(transport_, options_->make_transport(options),
                            _.Prepend(absl::StrCat("device ", spec_.name, ": ")));
    }
    return transport_.get();
  }

  void AcceptLoop(transport::Transport* transport) {
    pthread_setname_np(pthread_self(), "lbcc-net-accept");
    while (!stop_.load()) {
      absl::StatusOr<std::unique_ptr<Endpoint>> endpoint = transport->Accept(kAcceptPoll);
      {
        std::vector<std::unique_ptr<Endpoint>> dead;
        {
          MutexLock lock(&state_->mu);
          dead.swap(state_->graveyard);
        }
      }
      if (endpoint.ok()) {
        Greet(std::move(*endpoint));
      } else if (endpoint.status().code() != absl::StatusCode::kDeadlineExceeded) {
        if (!stop_.load()) {
          LBCC_LOG(WARN) << "dev " << state_->index << ": accepting stopped: "
                         << endpoint.status();
        }
        return;
      }
    }
  }

  // Waits (without blocking) for the connecting side's hello, which names the listen comm.
  void Greet(std::unique_ptr<Endpoint> endpoint) {
    Endpoint* raw = endpoint.get();
    uint64_t id;
    {
      MutexLock lock(&state_->mu);
      id = state_->next_greeting++;
      state_->greeting.emplace(id, std::move(endpoint));
    }
    auto buffer = std::make_shared<std::array<uint8_t, kHelloBytes>>();
    // The endpoint stays in `greeting` (or moves to a listen comm) until the callback ran, and
    // only this thread destroys endpoints of the graveyard, so `raw` is valid here.
    raw->Recv(kHelloTag, absl::MakeSpan(*buffer),
              [state = state_, id, buffer](absl::StatusOr<size_t> length) {
                OnHello(state.get(), id, *buffer, std::move(length));
              });
  }

  static void OnHello(DeviceState* state, uint64_t id,
                      const std::array<uint8_t, kHelloBytes>& hello,
                      absl::StatusOr<size_t> length) {
    MutexLock lock(&state->mu);
    auto it = state->greeting.find(id);
    if (it == state->greeting.end()) return;  // Shut down meanwhile.
    std::unique_ptr<Endpoint> endpoint = std::move(it->second);
    state->greeting.erase(it);
    uint32_t magic = 0;
    uint16_t version = 0;
    uint64_t comm_id = 0;
    std::memcpy(&magic, hello.data(), 4);
    std::memcpy(&version, hello.data() + 4, 2);
    std::memcpy(&comm_id, hello.data() + 8, 8);
    std::shared_ptr<ListenCore> listener;
    if (!length.ok()) {
      LBCC_LOG(INFO) << "dev " << state->index << ": connection from "
                     << endpoint->peer_address() << " ended before its hello: " << length.status();
    } else if (*length != kHelloBytes || magic != kHelloMagic || version != kHelloVersion) {
      LBCC_LOG(WARN) << "dev " << state->index << ": connection from "
                     << endpoint->peer_address() << " sent no LBCC hello; closing it";
    } else {
      auto found = state->listeners.find(comm_id);
      if (found != state->listeners.end()) {
        listener = found->second;
      } else {
        LBCC_LOG(INFO) << "dev " << state->index << ": connection from "
                       << endpoint->peer_address() << " for a closed listen comm; closing it";
      }
    }
    if (listener != nullptr) {
      MutexLock listener_lock(&listener->mu);
      if (!listener->closed) {
        listener->ready.push_back(std::move(endpoint));
        return;
      }
    }
    endpoint->Close();
    state->graveyard.push_back(std::move(endpoint));
  }

  const DeviceSpec spec_;
  const NetOptions* const options_;
  const std::shared_ptr<DeviceState> state_;

  Mutex mu_;
  std::unique_ptr<transport::Transport> transport_ ABSL_GUARDED_BY(mu_);
  std::string address_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread acceptor_;
  std::atomic<bool> stop_{false};
};

// ---------------------------------------------------------------------------------------------
// Connection attempts.

struct Net::Attempt {
  uint64_t id = 0;
  Device* device = nullptr;
  ListenHandle handle;
  bool done = false;
  absl::StatusOr<std::unique_ptr<Endpoint>> result = absl::UnknownError("attempt pending");
};

class Net::ConnectorPool {
 public:
  explicit ConnectorPool(Net* net) : net_(net) {}
  ~ConnectorPool() { Stop(); }

  absl::StatusOr<uint64_t> Start(Device* device, ListenHandle handle) {
    MutexLock lock(&mu_);
    if (stop_) return absl::CancelledError("plugin shut down");
    auto attempt = std::make_shared<Attempt>();
    attempt->id = next_id_++;
    attempt->device = device;
    attempt->handle = std::move(handle);
    attempts_[attempt->id] = attempt;
    queue_.push_back(attempt);
    if (idle_ == 0 && static_cast<int>(threads_.size()) < kConnectThreads) {
      threads_.emplace_back([this] { Work(); });
    } else {
      cv_.Signal();
    }
    return attempt->id;
  }

  // The attempt's outcome once done (and forgets it), nullopt while it runs. InvalidArgument for
  // an id this pool does not know.
  absl::StatusOr<std::optional<absl::StatusOr<std::unique_ptr<Endpoint>>>> Poll(uint64_t id) {
    MutexLock lock(&mu_);
    if (stop_) return absl::CancelledError("plugin shut down");
    auto it = attempts_.find(id);
    if (it == attempts_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("connect: the handle names attempt ", id, ", which this plugin does not "
                       "know (a handle reused after its connect finished?)"));
    }
    if (!it->second->done) return std::optional<absl::StatusOr<std::unique_ptr<Endpoint>>>();
    std::shared_ptr<Attempt> attempt = std::move(it->second);
    attempts_.erase(it);
    return std::optional<absl::StatusOr<std::unique_ptr<Endpoint>>>(std::move(attempt->result));
  }

  bool stopping() const { return stop_flag_.load(); }

  // New attempts fail and running ones give up after their current Connect() call.
  void RequestStop() {
    MutexLock lock(&mu_);
    stop_ = true;
    stop_flag_.store(true);
    cv_.SignalAll();
  }

  void Stop() {
    std::vector<std::thread> threads;
    {
      MutexLock lock(&mu_);
      stop_ = true;
      stop_flag_.store(true);
      cv_.SignalAll();
      threads.swap(threads_);
    }
    for (std::thread& thread : threads) thread.join();
    // Results nobody collected are endpoints of transports about to close: drop them first.
    absl::flat_hash_map<uint64_t, std::shared_ptr<Attempt>> attempts;
    {
      MutexLock lock(&mu_);
      attempts.swap(attempts_);
      queue_.clear();
    }
  }

 private:
  void Work() {
    pthread_setname_np(pthread_self(), "lbcc-net-conn");
    MutexLock lock(&mu_);
    while (true) {
      while (queue_.empty() && !stop_) {
        ++idle_;
        cv_.Wait(&mu_);
        --idle_;
      }
      if (stop_) return;
      std::shared_ptr<Attempt> attempt = std::move(queue_.front());
      queue_.pop_front();
      mu_.Unlock();
      absl::StatusOr<std::unique_ptr<Endpoint>> result =
          net_->RunAttempt(attempt->device, attempt->handle.address, attempt->handle.comm_id);
      mu_.Lock();
      attempt->result = std::move(result);
      attempt->done = true;
    }
  }

  Net* const net_;
  Mutex mu_;
  CondVar cv_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Attempt>> attempts_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Attempt>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> stop_flag_{false};
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

// ---------------------------------------------------------------------------------------------
// Net.

Net::Net(NetOptions options) : options_(std::move(options)), instance_(RandomId()) {}

absl::StatusOr<std::unique_ptr<Net>> Net::Create(NetOptions options) {
  if (options.devices.empty()) return absl::InvalidArgumentError("no network device");
  if (!options.make_transport) return absl::InvalidArgumentError("no transport factory");
  std::unique_ptr<Net> net(new Net(std::move(options)));
  std::shared_ptr<StagingPool> staging;
  if (net->options_.gpu != nullptr) {
    staging = std::make_shared<StagingPool>(net->options_.gpu, net->options_.staging_bytes);
  }
  for (size_t i = 0; i < net->options_.devices.size(); ++i) {
    net->devices_.push_back(std::make_unique<Device>(
        static_cast<int>(i), net->options_.devices[i], &net->options_, staging));
  }
  net->connector_ = std::make_unique<ConnectorPool>(net.get());
  return net;
}

Net::~Net() { Shutdown(); }

void Net::Shutdown() {
  // Attempts first: they use the devices' transports. Shutting the transports down makes a
  // running attempt return at once rather than at the end of its slice; then the connector
  // threads are joined, and only then are the transports destroyed.
  if (connector_ != nullptr) connector_->RequestStop();
  for (auto& device : devices_) device->Interrupt();
  if (connector_ != nullptr) connector_->Stop();
  for (auto& device : devices_) device->Shutdown();
}

int Net::num_devices() const { return static_cast<int>(devices_.size()); }

absl::StatusOr<DeviceProperties> Net::Properties(int dev) const {
  if (dev < 0 || dev >= num_devices()) {
    return absl::InvalidArgumentError(absl::StrCat("device ", dev, " of ", num_devices()));
  }
  const Device& device = *devices_[dev];
  const DeviceSpec& spec = device.spec();
  DeviceProperties props;
  props.name = spec.name;
  props.pci_path = InterfacePciPath(spec.ifname);
  props.guid = static_cast<uint64_t>(dev);
  props.max_comms = 1 << 20;
  props.max_recvs = kMaxRecvs;
  props.max_message_bytes = kMaxMessageBytes;
  props.ptr_support = kPtrHost | (options_.gpu != nullptr ? kPtrCuda : 0);

  double slowest = 0;
  double rtt = 0;
  {
    DeviceState* state = device.state().get();
    MutexLock lock(&state->mu);
    slowest = state->slowest_slow_bytes_per_second;
    rtt = state->shortest_rtt_seconds;
  }
  const std::optional<LinkClass> configured =
      spec.link_class.has_value() ? spec.link_class : options_.transport.link_class;
  const double pace = options_.transport.scheduler.pace_bytes_per_second;
  double speed = 0;
  if (options_.speed_mbits > 0) {
    speed = options_.speed_mbits;
    props.speed_source = "configured";
  } else if (configured == LinkClass::kSlow && pace > 0) {
    speed = pace * 8e-6;
    props.speed_source = "paced";
  } else if (slowest > 0) {
    speed = slowest * 8e-6;
    props.speed_source = "measured";
  } else if (const int interface_speed = InterfaceSpeedMbits(spec.ifname); interface_speed > 0) {
    speed = interface_speed;
    props.speed_source = "interface";
  } else {
    speed = 10000;
    props.speed_source = "default";
  }
  props.speed_mbits = static_cast<int>(std::clamp(speed, 1.0, static_cast<double>(INT_MAX)));
  if (options_.latency_us > 0) {
    props.latency_us = static_cast<float>(options_.latency_us);
  } else if (rtt > 0) {
    props.latency_us = static_cast<float>(rtt / 2 * 1e6);
  }
  return props;
}

absl::StatusOr<ListenComm*> Net::Listen(int dev, absl::Span<uint8_t> handle) {
  if (dev < 0 || dev >= num_devices()) {
    return absl::InvalidArgumentError(absl::StrCat("listen on device ", dev, " of ",
                                                   num_devices()));
  }
  if (handle.size() < kHandleBytes) return absl::InvalidArgumentError("handle buffer too small");
  Device* device = devices_[dev].get();
  LBCC_ASSIGN_OR_RETURN(const std::string address, device->EnsureListening());
  auto comm = std::make_unique<ListenComm>();
  comm->device = device->state();
  comm->core = std::make_shared<ListenCore>();
  comm->close_grace = options_.close_grace;
  {
    MutexLock lock(&comm->device->mu);
    if (comm->device->stopped) return absl::CancelledError("plugin shut down");
    do {
      comm->comm_id = RandomId();
    } while (comm->comm_id == 0 || comm->device->listeners.contains(comm->comm_id));
    comm->device->listeners[comm->comm_id] = comm->core;
  }
  absl::Status encoded = EncodeListenHandle({address, comm->comm_id}, handle);
  if (!encoded.ok()) {
    MutexLock lock(&comm->device->mu);
    comm->device->listeners.erase(comm->comm_id);
    return encoded;
  }
  Register(comm.get(), Kind::kListen);
  return comm.release();
}

absl::StatusOr<SendComm*> Net::Connect(int dev, absl::Span<uint8_t> handle) {
  if (handle.size() < kHandleBytes) return absl::InvalidArgumentError("handle buffer too small");
  if (dev < 0 || dev >= num_devices()) {
    return absl::InvalidArgumentError(absl::StrCat("connect on device ", dev, " of ",
                                                   num_devices()));
  }
  std::optional<ConnectStage> stage = ReadConnectStage(handle);
  if (!stage.has_value() || stage->net_instance != instance_) {
    absl::StatusOr<ListenHandle> decoded = DecodeListenHandle(handle);
    if (!decoded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("connect: not a listen handle of this plugin: ",
                       decoded.status().message()));
    }
    LBCC_ASSIGN_OR_RETURN(const uint64_t id,
                          connector_->Start(devices_[dev].get(), std::move(*decoded)));
    WriteConnectStage(handle, {instance_, id});
    return nullptr;
  }
  LBCC_ASSIGN_OR_RETURN(auto outcome, connector_->Poll(stage->attempt_id));
  if (!outcome.has_value()) return nullptr;  // Still connecting.
  ClearConnectStage(handle);
  LBCC_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> endpoint, std::move(*outcome));
  Device* device = devices_[dev].get();
  NoteNewLink(device->state().get(), *endpoint, "send comm to");
  auto comm = std::make_unique<SendComm>();
  comm->core = std::make_shared<CommCore>(std::move(endpoint), /*send=*/true, device->state(),
                                          options_.close_grace);
  comm->core->self = comm->core;
  Register(comm.get(), Kind::kSend);
  return comm.release();
}

absl::StatusOr<std::unique_ptr<Endpoint>> Net::RunAttempt(Device* device,
                                                          const std::string& address,
                                                          uint64_t comm_id) {
  LBCC_ASSIGN_OR_RETURN(transport::Transport * transport, device->TransportForConnect());
  transport::ConnectOptions connect_options;
  if (device->spec().link_class.has_value()) {
    connect_options.has_link_class = true;
    connect_options.link_class = *device->spec().link_class;
  }
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  absl::Duration slice = kFirstSlice;
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    absl::StatusOr<std::unique_ptr<Endpoint>> endpoint =
        transport->Connect(address, std::max(std::min(slice, left), absl::Milliseconds(1)),
                           connect_options);
    if (endpoint.ok()) {
      auto hello = std::make_shared<std::array<uint8_t, kHelloBytes>>();
      std::memcpy(hello->data(), &kHelloMagic, 4);
      std::memcpy(hello->data() + 4, &kHelloVersion, 2);
      std::memcpy(hello->data() + 8, &comm_id, 8);
      (*endpoint)->Send(kHelloTag, absl::MakeConstSpan(*hello), {transport::Priority::kHigh},
                        [hello](absl::Status) {});
      return endpoint;
    }
    const absl::StatusCode code = endpoint.status().code();
    const bool retry = code == absl::StatusCode::kDeadlineExceeded ||
                       code == absl::StatusCode::kUnavailable;
    if (!retry || connector_->stopping() || absl::Now() >= deadline) {
      return absl::Status(code, absl::StrCat("connect to ", address, " (dev ", device->spec().name,
                                             "): ", endpoint.status().message()));
    }
    slice = std::min(slice * 2, kMaxSlice);
  }
}

absl::StatusOr<RecvComm*> Net::Accept(ListenComm* listen) {
  if (listen == nullptr || Lookup(listen) != Kind::kListen) {
    return absl::InvalidArgumentError("not an open listen comm of this plugin");
  }
  std::unique_ptr<Endpoint> endpoint;
  {
    MutexLock lock(&listen->core->mu);
    if (listen->core->ready.empty()) return nullptr;
    endpoint = std::move(listen->core->ready.front());
    listen->core->ready.pop_front();
  }
  NoteNewLink(listen->device.get(), *endpoint, "receive comm from");
  auto comm = std::make_unique<RecvComm>();
  comm->core = std::make_shared<CommCore>(std::move(endpoint), /*send=*/false, listen->device,
                                          listen->close_grace);
  comm->core->self = comm->core;
  Register(comm.get(), Kind::kRecv);
  return comm.release();
}

absl::StatusOr<void*> Net::RegMr(void* comm, void* data, size_t size, int type) {
  LBCC_ASSIGN_OR_RETURN(CommCore * core, CoreOf(comm));
  if (data == nullptr && size > 0) return absl::InvalidArgumentError("null buffer");
  auto region = std::make_unique<MemoryRegion>();
  region->base = static_cast<const uint8_t*>(data);
  region->size = size;
  region->type = type;
  if (type == kPtrCuda) {
    if (core->staging() == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "memory type NCCL_PTR_CUDA is not supported: ",
          BuiltWithCuda() ? "no CUDA device was visible when the plugin started"
                          : "this build of the plugin takes host memory (NCCL_PTR_HOST) only"));
    }
    LBCC_ASSIGN_OR_RETURN(region->gpu_device, core->staging()->gpu()->DeviceOf(data, size),
                          _.Prepend("regMr(NCCL_PTR_CUDA): "));
  } else if (type != kPtrHost) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory type ", type, " is not supported (NCCL_PTR_HOST",
        core->staging() != nullptr ? " and NCCL_PTR_CUDA" : "", " only)"));
  }
  MutexLock lock(&core->mu);
  if (core->closed) return absl::FailedPreconditionError("comm is closing");
  core->regions.insert(region.get());
  return static_cast<void*>(region.release());
}

absl::Status Net::DeregMr(void* comm, void* mhandle) {
  LBCC_ASSIGN_OR_RETURN(CommCore * core, CoreOf(comm));
  auto* region = static_cast<MemoryRegion*>(mhandle);
  MutexLock lock(&core->mu);
  if (region == nullptr || !core->regions.contains(region)) {
    return absl::InvalidArgumentError("memory handle is not registered on this comm");
  }
  core->regions.erase(region);
  region->magic = 0;
  delete region;
  return absl::OkStatus();
}

absl::StatusOr<Request*> Net::Isend(SendComm* comm, const void* data, size_t size, int tag,
                                    void* mhandle) {
  if (comm == nullptr || comm->magic != kSendMagic) {
    return absl::InvalidArgumentError("isend: not a send comm of this plugin");
  }
  if (size > kMaxMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("isend of ", size, " bytes; the largest is ", kMaxMessageBytes));
  }
  if (data == nullptr && size > 0) return absl::InvalidArgumentError("isend: null buffer");
  CommCore* core = comm->core.get();
  Request* request;
  std::vector<Request*> issue;
  {
    MutexLock lock(&core->mu);
    if (core->closed) return absl::FailedPreconditionError("isend on a closing comm");
    LBCC_RETURN_IF_ERROR(CheckRegion(core, mhandle, data, size));
    const auto* region = static_cast<const MemoryRegion*>(mhandle);
    const bool staged = region != nullptr && region->type == kPtrCuda && size > 0;
    if (core->staging() != nullptr) core->ReapZombiesLocked();
    if (core->free_requests.empty()) return nullptr;  // NCCL calls again later.
    StagingBuffer buffer;
    if (staged) {
      LBCC_ASSIGN_OR_RETURN(std::optional<StagingBuffer> got,
                            core->staging()->Acquire(size, core->staging_held == 0));
      if (!got.has_value()) return nullptr;  // The pool is full: NCCL calls again later.
      buffer = *got;
      ++core->staging_held;
    }
    request = &core->requests[core->free_requests.back()];
    core->free_requests.pop_back();
    request->in_use = true;
    request->abandoned = false;
    request->parts = 1;
    request->pending.store(0, std::memory_order_relaxed);
    request->failed.store(false, std::memory_order_relaxed);
    request->status = absl::OkStatus();
    request->sizes[0] = 0;
    request->tag = tag;
    request->data = static_cast<const uint8_t*>(data);
    request->size = size;
    if (staged) {
      Stage& stage = request->stages[0];
      stage.buffer = buffer;
      stage.gpu_device = region->gpu_device;
      stage.user = static_cast<uint8_t*>(const_cast<void*>(data));
      absl::StatusOr<GpuEvent*> event =
          core->staging()->gpu()->CopyAsync(region->gpu_device, buffer.data, data, size,
                                            Gpu::Direction::kDeviceToHost);
      if (!event.ok()) {
        core->RetireLocked(request);
        return event.status();
      }
      stage.event = *event;
      stage.state = StageState::kCopyToHost;
    }
    if (staged || !core->send_queue.empty()) {
      // Behind (or itself) a copy: the send leaves once every earlier one has.
      request->queued = true;
      request->slow.store(true, std::memory_order_relaxed);
      core->send_queue.push_back(request);
      core->AdvanceSendsLocked(&issue);
    } else {
      request->pending.store(1, std::memory_order_relaxed);
      ++core->callbacks_outstanding;
      issue.push_back(request);
    }
  }
  IssueSends(comm->core, issue);
  return request;
}

absl::StatusOr<Request*> Net::Irecv(RecvComm* comm, int n, void* const* data,
                                    const size_t* sizes, const int* tags,
                                    void* const* mhandles) {
  if (comm == nullptr || comm->magic != kRecvMagic) {
    return absl::InvalidArgumentError("irecv: not a receive comm of this plugin");
  }
  if (n < 1 || n > kMaxRecvs) {
    return absl::InvalidArgumentError(
        absl::StrCat("irecv of ", n, " buffers; between 1 and ", kMaxRecvs));
  }
  if (data == nullptr || sizes == nullptr || tags == nullptr) {
    return absl::InvalidArgumentError("irecv: null array");
  }
  for (int i = 0; i < n; ++i) {
    if (data[i] == nullptr && sizes[i] > 0) return absl::InvalidArgumentError("irecv: null buffer");
  }
  CommCore* core = comm->core.get();
  Request* request;
  std::array<uint8_t*, kMaxRecvs> targets{};
  {
    MutexLock lock(&core->mu);
    if (core->closed) return absl::FailedPreconditionError("irecv on a closing comm");
    std::array<const MemoryRegion*, kMaxRecvs> regions{};
    for (int i = 0; i < n; ++i) {
      void* mhandle = mhandles != nullptr ? mhandles[i] : nullptr;
      LBCC_RETURN_IF_ERROR(CheckRegion(core, mhandle, data[i], sizes[i]));
      regions[i] = static_cast<const MemoryRegion*>(mhandle);
    }
    if (core->staging() != nullptr) core->ReapZombiesLocked();
    if (core->free_requests.empty()) return nullptr;
    // Staging for the parts in device memory; all or none (NCCL calls again when none).
    std::array<StagingBuffer, kMaxRecvs> buffers{};
    const bool must_succeed = core->staging_held == 0;
    for (int i = 0; i < n; ++i) {
      if (regions[i] == nullptr || regions[i]->type != kPtrCuda || sizes[i] == 0) continue;
      absl::StatusOr<std::optional<StagingBuffer>> got =
          core->staging()->Acquire(sizes[i], must_succeed);
      if (!got.ok() || !got->has_value()) {
        for (int k = 0; k < i; ++k) core->staging()->Release(buffers[k]);
        if (!got.ok()) return got.status();
        return nullptr;
      }
      buffers[i] = **got;
    }
    request = &core->requests[core->free_requests.back()];
    core->free_requests.pop_back();
    request->in_use = true;
    request->abandoned = false;
    request->parts = n;
    request->pending.store(n, std::memory_order_relaxed);
    request->failed.store(false, std::memory_order_relaxed);
    request->status = absl::OkStatus();
    request->sizes.fill(0);
    bool staged = false;
    for (int i = 0; i < n; ++i) {
      targets[i] = static_cast<uint8_t*>(data[i]);
      if (buffers[i].data == nullptr) continue;
      Stage& stage = request->stages[i];
      stage = Stage();
      stage.buffer = buffers[i];
      stage.gpu_device = regions[i]->gpu_device;
      stage.user = targets[i];
      stage.state = StageState::kOnWire;
      ++core->staging_held;
      targets[i] = buffers[i].data;
      staged = true;
    }
    for (int i = 0; i < n; ++i) request->stages[i].landed = false;
    request->slow.store(staged, std::memory_order_relaxed);
    core->callbacks_outstanding += n;
  }
  for (int i = 0; i < n; ++i) {
    core->endpoint->Recv(DataTag(tags[i]), absl::MakeSpan(targets[i], sizes[i]),
                         [core = comm->core, request, i](absl::StatusOr<size_t> length) {
                           if (length.ok()) {
                             core->Complete(request, i, absl::OkStatus(), *length);
                           } else {
                             core->Complete(request, i, length.status(), 0);
                           }
                         });
  }
  return request;
}

absl::Status Net::Test(Request* request, bool* done, int* sizes) {
  if (request == nullptr || request->magic != kRequestMagic || done == nullptr) {
    return absl::InvalidArgumentError("test: not a request of this plugin");
  }
  // Fast path: still running, nothing failed, no copies to poll. (A retired request has no
  // parts pending, so misuse is still caught below.)
  if (!request->slow.load(std::memory_order_acquire) &&
      request->pending.load(std::memory_order_acquire) > 0 &&
      !request->failed.load(std::memory_order_acquire)) {
    *done = false;
    return absl::OkStatus();
  }
  CommCore* core = request->core;
  std::vector<Request*> issue;
  absl::Status status;
  {
    MutexLock lock(&core->mu);
    if (!request->in_use || request->abandoned) {
      return absl::FailedPreconditionError("test: the request is not in flight");
    }
    if (request->slow.load(std::memory_order_relaxed)) {
      if (core->send) {
        core->AdvanceSendsLocked(&issue);
      } else {
        core->AdvanceStagesLocked(request);
      }
      core->ReapZombiesLocked();
    }
    bool copying = request->queued;
    for (int i = 0; i < request->parts; ++i) copying |= request->stages[i].event != nullptr;
    const bool pending = request->pending.load(std::memory_order_relaxed) > 0;
    if (!request->status.ok()) {
      // A part failed: report it now. Running copies finish as zombies; the slot is retired
      // once the transport returned the other parts.
      core->ZombifyCopiesLocked(request);
      *done = true;
      status = std::move(request->status);
      if (pending) {
        request->status = status;
        request->abandoned = true;
      } else {
        request->status = absl::OkStatus();
        core->RetireLocked(request);
      }
    } else if (pending || copying) {
      *done = false;
    } else {
      *done = true;
      if (sizes != nullptr) {
        for (int i = 0; i < request->parts; ++i) sizes[i] = static_cast<int>(request->sizes[i]);
      }
      core->RetireLocked(request);
    }
  }
  if (!issue.empty()) {
    // The request holds a raw pointer to its core; the callbacks need the shared owner.
    if (std::shared_ptr<CommCore> owner = core->self.lock()) IssueSends(owner, issue);
  }
  return status;
}

absl::Status Net::CloseSend(SendComm* comm) {
  if (comm == nullptr || !Unregister(comm, Kind::kSend)) {
    return absl::InvalidArgumentError("closeSend: not an open send comm of this plugin");
  }
  absl::Status status = CloseComm(comm->core.get(), "send comm");
  comm->magic = 0;
  delete comm;
  return status;
}

absl::Status Net::CloseRecv(RecvComm* comm) {
  if (comm == nullptr || !Unregister(comm, Kind::kRecv)) {
    return absl::InvalidArgumentError("closeRecv: not an open receive comm of this plugin");
  }
  absl::Status status = CloseComm(comm->core.get(), "receive comm");
  comm->magic = 0;
  delete comm;
  return status;
}

absl::Status Net::CloseListen(ListenComm* comm) {
  if (comm == nullptr || !Unregister(comm, Kind::kListen)) {
    return absl::InvalidArgumentError("closeListen: not an open listen comm of this plugin");
  }
  {
    MutexLock lock(&comm->device->mu);
    comm->device->listeners.erase(comm->comm_id);
  }
  std::deque<std::unique_ptr<Endpoint>> unaccepted;
  {
    MutexLock lock(&comm->core->mu);
    comm->core->closed = true;
    unaccepted.swap(comm->core->ready);
  }
  unaccepted.clear();  // Connections nobody accepted: their peers see the link close.
  comm->magic = 0;
  delete comm;
  return absl::OkStatus();
}

}  // namespace lbcc::plugin
