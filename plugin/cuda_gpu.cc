// Gpu over the CUDA runtime (built with --config=cuda only): cudaPointerGetAttributes,
// cudaHostAlloc, one non-blocking stream per device, cudaMemcpyAsync and cudaEventQuery.
#include <cuda_runtime.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "kernels/cuda_status.h"
#include "plugin/gpu.h"

namespace lbcc::plugin {

using ::lbcc::kernels::FromCuda;

class GpuEvent {
 public:
  cudaEvent_t event = nullptr;
};

namespace {

// Makes `device` current on this thread for the scope and restores the caller's device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = previous_ == device ? absl::OkStatus()
                                  : FromCuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

class CudaGpu final : public Gpu {
 public:
  explicit CudaGpu(int devices) : streams_(devices, nullptr) {}
  ~CudaGpu() override {
    // Streams and events die with the CUDA context at exit; destroying them here could run after
    // the runtime was torn down (the plugin lives until the process ends).
  }

  absl::string_view name() const override { return "cuda"; }

  absl::StatusOr<int> DeviceOf(const void* ptr, size_t) override {
    cudaPointerAttributes attributes{};
    const cudaError_t error = cudaPointerGetAttributes(&attributes, ptr);
    if (error != cudaSuccess) {
      cudaGetLastError();  // Clear the sticky-free error of an unknown pointer.
      return absl::InvalidArgumentError(absl::StrCat("not CUDA memory: ", cudaGetErrorName(error)));
    }
    if (attributes.type != cudaMemoryTypeDevice) {
      return absl::InvalidArgumentError(
          absl::StrCat("memory of CUDA type ", static_cast<int>(attributes.type),
                       " is not device memory (NCCL_PTR_CUDA)"));
    }
    return attributes.device;
  }

  absl::StatusOr<void*> AllocPinned(size_t bytes) override {
    void* pinned = nullptr;
    const absl::Status status = FromCuda(
        cudaHostAlloc(&pinned, bytes > 0 ? bytes : 1, cudaHostAllocPortable),
        absl::StrCat("cudaHostAlloc of ", bytes, " bytes"));
    if (!status.ok()) {
      return status.code() == absl::StatusCode::kInternal
                 ? absl::ResourceExhaustedError(status.message())
                 : status;
    }
    return pinned;
  }

  void FreePinned(void* pinned) override { cudaFreeHost(pinned); }

  absl::StatusOr<GpuEvent*> CopyAsync(int device, void* dst, const void* src, size_t bytes,
                                      Direction direction) override {
    if (device < 0 || device >= static_cast<int>(streams_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device));
    }
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    cudaStream_t stream;
    {
      MutexLock lock(&mu_);
      if (streams_[device] == nullptr) {
        const absl::Status made = FromCuda(
            cudaStreamCreateWithFlags(&streams_[device], cudaStreamNonBlocking),
            "cudaStreamCreateWithFlags");
        if (!made.ok()) {
          streams_[device] = nullptr;
          return made;
        }
      }
      stream = streams_[device];
    }
    const cudaMemcpyKind kind = direction == Direction::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                                      : cudaMemcpyHostToDevice;
    if (absl::Status copied = FromCuda(cudaMemcpyAsync(dst, src, bytes, kind, stream),
                                       "cudaMemcpyAsync");
        !copied.ok()) {
      return copied;
    }
    GpuEvent* event = TakeEvent();
    if (event == nullptr) {
      event = new GpuEvent;
      if (absl::Status made = FromCuda(
              cudaEventCreateWithFlags(&event->event, cudaEventDisableTiming), "cudaEventCreate");
          !made.ok()) {
        delete event;
        cudaStreamSynchronize(stream);  // The copy must not outlive the caller's buffers.
        return made;
      }
    }
    if (absl::Status recorded = FromCuda(cudaEventRecord(event->event, stream), "cudaEventRecord");
        !recorded.ok()) {
      Release(event);
      cudaStreamSynchronize(stream);
      return recorded;
    }
    return event;
  }

  absl::StatusOr<bool> Done(GpuEvent* event) override {
    const cudaError_t error = cudaEventQuery(event->event);
    if (error == cudaSuccess) return true;
    if (error == cudaErrorNotReady) return false;
    return FromCuda(error, "cudaEventQuery");
  }

  void Release(GpuEvent* event) override {
    MutexLock lock(&mu_);
    events_.push_back(event);
  }

 private:
  GpuEvent* TakeEvent() {
    MutexLock lock(&mu_);
    if (events_.empty()) return nullptr;
    GpuEvent* event = events_.back();
    events_.pop_back();
    return event;
  }

  Mutex mu_;
  std::vector<cudaStream_t> streams_ ABSL_GUARDED_BY(mu_);
  std::vector<GpuEvent*> events_ ABSL_GUARDED_BY(mu_);  // Created, free for reuse.
};

}  // namespace

bool BuiltWithCuda() { return true; }

absl::StatusOr<std::unique_ptr<Gpu>> NewCudaGpu() {
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("no CUDA device: cudaGetDeviceCount: ", cudaGetErrorName(error)));
  }
  if (devices <= 0) return absl::UnavailableError("no CUDA device");
  return std::unique_ptr<Gpu>(new CudaGpu(devices));
}

}  // namespace lbcc::plugin
