#include "plugin/emulated_gpu.h"

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace lbcc::plugin {

class GpuEvent {
 public:
  std::atomic<bool> done{false};
  absl::Status status;  // Written before `done` turns true.
};

EmulatedGpu::EmulatedGpu() : worker_([this] { Work(); }) {}

EmulatedGpu::~EmulatedGpu() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    paused_ = false;
    cv_.SignalAll();
  }
  worker_.join();
  MutexLock lock(&mu_);
  for (auto& [address, size] : pinned_) std::free(reinterpret_cast<void*>(address));
}

void EmulatedGpu::AddDeviceMemory(const void* ptr, size_t size, int device) {
  MutexLock lock(&mu_);
  device_[reinterpret_cast<uintptr_t>(ptr)] = {size, device};
}

void EmulatedGpu::RemoveDeviceMemory(const void* ptr) {
  MutexLock lock(&mu_);
  device_.erase(reinterpret_cast<uintptr_t>(ptr));
}

void EmulatedGpu::TreatAllMemoryAsDevice(int device) {
  MutexLock lock(&mu_);
  all_device_ = device;
}

void EmulatedGpu::Pause() {
  MutexLock lock(&mu_);
  paused_ = true;
}

void EmulatedGpu::Resume() {
  MutexLock lock(&mu_);
  paused_ = false;
  cv_.SignalAll();
}

void EmulatedGpu::FailNextCopy(absl::Status error) {
  MutexLock lock(&mu_);
  fail_next_ = std::move(error);
}

EmulatedGpu::Counters EmulatedGpu::counters() {
  MutexLock lock(&mu_);
  Counters counters = counters_;
  counters.queued = queue_.size();
  return counters;
}

bool EmulatedGpu::InDeviceMemoryLocked(const void* ptr, size_t size, int device) const {
  if (all_device_.has_value()) return *all_device_ == device;
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  auto it = device_.upper_bound(address);
  if (it == device_.begin()) return false;
  --it;
  return it->second.device == device && address + size <= it->first + it->second.size;
}

bool EmulatedGpu::InPinnedLocked(const void* ptr, size_t size) const {
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  auto it = pinned_.upper_bound(address);
  if (it == pinned_.begin()) return false;
  --it;
  return address + size <= it->first + it->second;
}

absl::StatusOr<int> EmulatedGpu::DeviceOf(const void* ptr, size_t size) {
  MutexLock lock(&mu_);
  if (all_device_.has_value()) return *all_device_;
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  auto it = device_.upper_bound(address);
  if (it != device_.begin()) {
    --it;
    if (address + size <= it->first + it->second.size) return it->second.device;
  }
  return absl::InvalidArgumentError("not (emulated) device memory");
}

absl::StatusOr<void*> EmulatedGpu::AllocPinned(size_t bytes) {
  void* pinned = std::malloc(bytes > 0 ? bytes : 1);
  if (pinned == nullptr) return absl::ResourceExhaustedError("emulated pinned allocation");
  MutexLock lock(&mu_);
  pinned_[reinterpret_cast<uintptr_t>(pinned)] = bytes;
  ++counters_.pinned_live;
  ++counters_.pinned_allocations;
  counters_.pinned_bytes += bytes;
  return pinned;
}

void EmulatedGpu::FreePinned(void* pinned) {
  {
    MutexLock lock(&mu_);
    auto it = pinned_.find(reinterpret_cast<uintptr_t>(pinned));
    if (it == pinned_.end()) return;  // Not ours: a bug the counters show.
    --counters_.pinned_live;
    counters_.pinned_bytes -= it->second;
    pinned_.erase(it);
  }
  std::free(pinned);
}

absl::StatusOr<GpuEvent*> EmulatedGpu::CopyAsync(int device, void* dst, const void* src,
                                                 size_t bytes, Direction direction) {
  MutexLock lock(&mu_);
  const bool to_host = direction == Direction::kDeviceToHost;
  const void* device_side = to_host ? src : dst;
  const void* host_side = to_host ? dst : src;
  if (bytes > 0 && !InDeviceMemoryLocked(device_side, bytes, device)) {
    return absl::InvalidArgumentError(
        absl::StrCat("emulated copy: ", bytes, " bytes at ", absl::Hex(device_side),
                     " are not device memory of device ", device));
  }
  if (bytes > 0 && !InPinnedLocked(host_side, bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("emulated copy: ", bytes, " bytes at ",
                                                   absl::Hex(host_side),
                                                   " are not a pinned buffer"));
  }
  auto* event = new GpuEvent;
  ++counters_.events_live;
  queue_.push_back({dst, src, bytes, direction, event, std::move(fail_next_)});
  fail_next_.reset();
  cv_.SignalAll();
  return event;
}

absl::StatusOr<bool> EmulatedGpu::Done(GpuEvent* event) {
  if (!event->done.load(std::memory_order_acquire)) return false;
  if (!event->status.ok()) return event->status;
  return true;
}

void EmulatedGpu::Release(GpuEvent* event) {
  delete event;
  MutexLock lock(&mu_);
  --counters_.events_live;
}

void EmulatedGpu::Work() {
  pthread_setname_np(pthread_self(), "lbcc-emu-gpu");
  MutexLock lock(&mu_);
  while (true) {
    while (!stop_ && (paused_ || queue_.empty())) cv_.Wait(&mu_);
    if (queue_.empty()) return;  // Stopping and drained.
    Copy copy = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    if (!copy.fail.has_value()) std::memcpy(copy.dst, copy.src, copy.bytes);
    mu_.Lock();
    if (copy.fail.has_value()) {
      copy.event->status = std::move(*copy.fail);
    } else {
      ++(copy.direction == Direction::kDeviceToHost ? counters_.copies_to_host
                                                    : counters_.copies_to_device);
      counters_.bytes += copy.bytes;
    }
    copy.event->done.store(true, std::memory_order_release);
  }
}

}  // namespace lbcc::plugin
