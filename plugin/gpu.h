// Gpu: the few CUDA calls the plugin needs to stage NCCL_PTR_CUDA buffers through pinned host
// memory: which device owns a pointer, pinned allocations, and asynchronous copies between
// device and pinned host memory whose completion is polled, never waited for.
//
// Implementations: NewCudaGpu() (cuda_gpu.cc, CUDA runtime; built only with --config=cuda,
// otherwise cuda_gpu_stub.cc returns Unimplemented) and EmulatedGpu (emulated_gpu.h: host
// memcpy on a thread standing in for a stream, with a pause so that tests can see a copy that
// has not finished yet).
//
// Copies to and from one device run in the order they were queued (one plugin-owned stream per
// device, never NCCL's or the application's).
//
// Thread-safety: every method may be called from any thread.
#ifndef LBCC_PLUGIN_GPU_H_
#define LBCC_PLUGIN_GPU_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lbcc::plugin {

// Completion of one queued copy; owned by the Gpu that made it (Release gives it back).
class GpuEvent;

class Gpu {
 public:
  enum class Direction { kDeviceToHost, kHostToDevice };

  virtual ~Gpu() = default;

  // "cuda" or "emulated".
  virtual absl::string_view name() const = 0;

  // The device whose memory holds [ptr, ptr + size). InvalidArgument when it is not device
  // memory (host, managed or unknown memory).
  virtual absl::StatusOr<int> DeviceOf(const void* ptr, size_t size) = 0;

  // Page-locked host memory usable by every device's copies; FreePinned takes it back.
  // ResourceExhausted when the allocation fails.
  virtual absl::StatusOr<void*> AllocPinned(size_t bytes) = 0;
  virtual void FreePinned(void* pinned) = 0;

  // Queues a copy of `bytes` between device memory of `device` and pinned memory (from
  // AllocPinned), on the plugin's stream for `device`, and returns its completion. Both buffers
  // must stay valid until Done() said true. Does not change the calling thread's current device.
  // Internal / Unavailable when CUDA refuses.
  virtual absl::StatusOr<GpuEvent*> CopyAsync(int device, void* dst, const void* src,
                                              size_t bytes, Direction direction) = 0;

  // Whether the copy behind `event` finished; never blocks. An error means the copy failed.
  virtual absl::StatusOr<bool> Done(GpuEvent* event) = 0;

  // Gives the event back. Its copy must be done (Done() said true, or it returned an error).
  virtual void Release(GpuEvent* event) = 0;
};

// The CUDA runtime implementation. Unimplemented when the plugin was built without CUDA;
// Unavailable when no CUDA device is visible (cudaGetDeviceCount is 0 or fails).
absl::StatusOr<std::unique_ptr<Gpu>> NewCudaGpu();

// Whether this build carries the CUDA implementation (--config=cuda).
bool BuiltWithCuda();

}  // namespace lbcc::plugin

#endif  // LBCC_PLUGIN_GPU_H_
