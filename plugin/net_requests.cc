// Net's calls on send and receive comms: memory registration, isend, irecv, test and close.
#include "plugin/net.h"

#include <array>
#include <atomic>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "plugin/comm_core.h"
#include "plugin/gpu.h"
#include "plugin/staging.h"

namespace lbcc::plugin {

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

namespace {

// closeSend / closeRecv: forgets `comm` (InvalidArgument when it is not an open comm of `kind`),
// closes its core and frees it.
template <typename Comm>
absl::Status CloseDataComm(Comm* comm, ObjectKind kind, absl::string_view call,
                           absl::string_view what) {
  if (comm == nullptr || !UnregisterObject(comm, kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": not an open ", what, " of this plugin"));
  }
  absl::Status status = CloseComm(comm->core.get(), what);
  comm->magic = 0;
  delete comm;
  return status;
}

}  // namespace

absl::Status Net::CloseSend(SendComm* comm) {
  return CloseDataComm(comm, ObjectKind::kSend, "closeSend", "send comm");
}

absl::Status Net::CloseRecv(RecvComm* comm) {
  return CloseDataComm(comm, ObjectKind::kRecv, "closeRecv", "receive comm");
}

}  // namespace lbcc::plugin
