// EmulatedGpu: the Gpu interface (gpu.h) on the host, so that the plugin's staging of device
// memory (pinned buffers, copies, completion polling, pooling) is tested without a GPU.
//
// "Device memory" is host memory the test declares with AddDeviceMemory (or every pointer, with
// TreatAllMemoryAsDevice). Pinned buffers are host allocations the emulator tracks. A copy is a
// memcpy run by one worker thread in queue order, standing in for a stream; its event turns done
// after the memcpy. Every copy is checked like CUDA would: the device side must lie in declared
// device memory of that device and the host side in a live pinned buffer (InvalidArgument from
// CopyAsync otherwise). Pause() holds the worker, so a test can observe requests whose copy has
// not finished; FailNextCopy() makes a copy's event report an error.
//
// Thread-safety: thread-safe.
#ifndef LBCC_PLUGIN_EMULATED_GPU_H_
#define LBCC_PLUGIN_EMULATED_GPU_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "base/mutex.h"
#include "plugin/gpu.h"

namespace lbcc::plugin {

class EmulatedGpu final : public Gpu {
 public:
  EmulatedGpu();
  ~EmulatedGpu() override;  // Runs the copies still queued (even when paused).

  // Test set-up: [ptr, ptr + size) is memory of `device`, until RemoveDeviceMemory(ptr).
  void AddDeviceMemory(const void* ptr, size_t size, int device);
  void RemoveDeviceMemory(const void* ptr);
  // Every pointer DeviceOf is asked about is memory of `device` (for the harness, whose buffers
  // are plain host memory).
  void TreatAllMemoryAsDevice(int device);

  // Holds / releases the copy worker. While paused, queued copies do not run.
  void Pause();
  void Resume();
  // The next queued copy does not run; its event reports `error`.
  void FailNextCopy(absl::Status error);

  struct Counters {
    uint64_t copies_to_host = 0;    // Finished device -> host copies.
    uint64_t copies_to_device = 0;  // Finished host -> device copies.
    uint64_t bytes = 0;             // Bytes they copied.
    uint64_t queued = 0;            // Queued, not yet run.
    uint64_t pinned_live = 0;       // Pinned buffers allocated and not freed.
    uint64_t pinned_bytes = 0;      // Their bytes.
    uint64_t pinned_allocations = 0;  // AllocPinned calls that succeeded, ever.
    uint64_t events_live = 0;       // Events handed out and not released.
  };
  Counters counters();

  // Gpu.
  absl::string_view name() const override { return "emulated"; }
  absl::StatusOr<int> DeviceOf(const void* ptr, size_t size) override;
  absl::StatusOr<void*> AllocPinned(size_t bytes) override;
  void FreePinned(void* pinned) override;
  absl::StatusOr<GpuEvent*> CopyAsync(int device, void* dst, const void* src, size_t bytes,
                                      Direction direction) override;
  absl::StatusOr<bool> Done(GpuEvent* event) override;
  void Release(GpuEvent* event) override;

 private:
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
    Direction direction;
    GpuEvent* event;
    std::optional<absl::Status> fail;
  };
  struct Range {
    size_t size;
    int device;
  };

  bool InDeviceMemoryLocked(const void* ptr, size_t size, int device) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool InPinnedLocked(const void* ptr, size_t size) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Work();

  Mutex mu_;
  CondVar cv_;
  std::map<uintptr_t, Range> device_ ABSL_GUARDED_BY(mu_);
  std::optional<int> all_device_ ABSL_GUARDED_BY(mu_);
  std::map<uintptr_t, size_t> pinned_ ABSL_GUARDED_BY(mu_);
  std::deque<Copy> queue_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> fail_next_ ABSL_GUARDED_BY(mu_);
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Counters counters_ ABSL_GUARDED_BY(mu_);
  std::thread worker_;
};

}  // namespace lbcc::plugin

#endif  // LBCC_PLUGIN_EMULATED_GPU_H_
