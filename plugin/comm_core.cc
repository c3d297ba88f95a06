#include "plugin/comm_core.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"

namespace lbcc::plugin {

using transport::Endpoint;
using transport::LinkClass;

namespace {

struct Registry {
  Mutex mu;
  absl::flat_hash_map<const void*, ObjectKind> live ABSL_GUARDED_BY(mu);
};
Registry& GetRegistry() {
  static Registry* registry = new Registry;  // Never destroyed: comms may outlive everything.
  return *registry;
}

}  // namespace

uint64_t RandomId() {
  static std::atomic<uint64_t> counter{0};
  std::random_device device;
  const uint64_t random = (uint64_t{device()} << 32) ^ device();
  return random ^ (counter.fetch_add(1) * 0x9e3779b97f4a7c15ull);
}

std::string Rate(double bytes_per_second) {
  return absl::StrFormat("%.3g Gbit/s", bytes_per_second * 8e-9);
}

void RegisterObject(const void* object, ObjectKind kind) {
  Registry& registry = GetRegistry();
  MutexLock lock(&registry.mu);
  registry.live[object] = kind;
}

std::optional<ObjectKind> LookupObject(const void* object) {
  Registry& registry = GetRegistry();
  MutexLock lock(&registry.mu);
  auto it = registry.live.find(object);
  if (it == registry.live.end()) return std::nullopt;
  return it->second;
}

bool UnregisterObject(const void* object, ObjectKind kind) {
  Registry& registry = GetRegistry();
  MutexLock lock(&registry.mu);
  auto it = registry.live.find(object);
  if (it == registry.live.end() || it->second != kind) return false;
  registry.live.erase(it);
  return true;
}

// ---------------------------------------------------------------------------------------------
// CommCore: requests, their staged parts and the send queue.

void CommCore::ReleaseStageLocked(Stage* stage) {
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

void CommCore::DropStagesLocked(Request* request) {
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

void CommCore::ReapZombiesLocked() {
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

void CommCore::RetireLocked(Request* request) {
  DropStagesLocked(request);
  request->in_use = false;
  request->abandoned = false;
  request->queued = false;
  request->slow.store(false, std::memory_order_relaxed);
  free_requests.push_back(request->index);
}

void CommCore::FailLocked(Request* request, absl::Status status) {
  if (request->status.ok()) {
    request->status = std::move(status);
    request->failed.store(true, std::memory_order_release);
  }
}

void CommCore::AdvanceStagesLocked(Request* request) {
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

void CommCore::ZombifyCopiesLocked(Request* request) {
  for (Stage& stage : request->stages) {
    if (stage.event == nullptr) continue;
    zombies.push_back(stage);
    stage = Stage();
  }
}

void CommCore::AdvanceSendsLocked(std::vector<Request*>* issue) {
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

void CommCore::Complete(Request* request, int part, absl::Status status, size_t size) {
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

// ---------------------------------------------------------------------------------------------
// Helpers of Net's calls.

void IssueSends(const std::shared_ptr<CommCore>& core, const std::vector<Request*>& issue) {
  for (Request* request : issue) {
    const size_t size = request->size;
    core->endpoint->Send(DataTag(request->tag), absl::MakeConstSpan(request->data, size), {},
                         [core, request, size](absl::Status status) {
                           core->Complete(request, 0, std::move(status), size);
                         });
  }
}

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
  std::optional<ObjectKind> kind = LookupObject(comm);
  if (kind == ObjectKind::kSend) return static_cast<SendComm*>(comm)->core.get();
  if (kind == ObjectKind::kRecv) return static_cast<RecvComm*>(comm)->core.get();
  return absl::InvalidArgumentError("not an open send or receive comm of this plugin");
}

absl::Status CheckRegion(CommCore* core, void* mhandle, const void* data, size_t size) {
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

}  // namespace lbcc::plugin
