#include "plugin/staging.h"

#include <utility>

namespace lbcc::plugin {

StagingPool::~StagingPool() {
  MutexLock lock(&mu_);
  for (auto& [size, buffers] : cached_) {
    for (uint8_t* buffer : buffers) gpu_->FreePinned(buffer);
  }
  cached_.clear();
}

size_t StagingPool::ClassOf(size_t bytes) {
  size_t size = kMinStagingBytes;
  while (size < bytes) size *= 2;
  return size;
}

absl::StatusOr<std::optional<StagingBuffer>> StagingPool::Acquire(size_t bytes,
                                                                  bool must_succeed) {
  const size_t size = ClassOf(bytes);
  std::vector<uint8_t*> evicted;
  bool refused = false;
  {
    MutexLock lock(&mu_);
    auto it = cached_.find(size);
    if (it != cached_.end() && !it->second.empty()) {
      uint8_t* buffer = it->second.back();
      it->second.pop_back();
      counters_.in_use_bytes += size;
      return std::optional<StagingBuffer>(StagingBuffer{buffer, size});
    }
    // Room for a new buffer: free cached ones of other classes, largest first.
    for (auto c = cached_.rbegin();
         c != cached_.rend() && counters_.allocated_bytes + size > limit_bytes_; ++c) {
      while (!c->second.empty() && counters_.allocated_bytes + size > limit_bytes_) {
        evicted.push_back(c->second.back());
        c->second.pop_back();
        counters_.allocated_bytes -= c->first;
      }
    }
    if (counters_.allocated_bytes + size > limit_bytes_ && !must_succeed) {
      ++counters_.refusals;
      refused = true;
    } else {
      // Counted now, so that concurrent callers see the room taken.
      counters_.allocated_bytes += size;
      counters_.in_use_bytes += size;
      counters_.peak_allocated_bytes =
          std::max<uint64_t>(counters_.peak_allocated_bytes, counters_.allocated_bytes);
    }
  }
  for (uint8_t* buffer : evicted) gpu_->FreePinned(buffer);
  if (refused) return std::optional<StagingBuffer>();
  absl::StatusOr<void*> pinned = gpu_->AllocPinned(size);
  MutexLock lock(&mu_);
  if (!pinned.ok()) {
    counters_.allocated_bytes -= size;
    counters_.in_use_bytes -= size;
    return pinned.status();
  }
  ++counters_.allocations;
  return std::optional<StagingBuffer>(StagingBuffer{static_cast<uint8_t*>(*pinned), size});
}

void StagingPool::Release(StagingBuffer buffer) {
  if (buffer.data == nullptr) return;
  {
    MutexLock lock(&mu_);
    counters_.in_use_bytes -= buffer.capacity;
    if (counters_.allocated_bytes <= limit_bytes_) {
      cached_[buffer.capacity].push_back(buffer.data);
      return;
    }
    counters_.allocated_bytes -= buffer.capacity;  // Beyond the limit: give it back.
  }
  gpu_->FreePinned(buffer.data);
}

StagingPool::Counters StagingPool::counters() {
  MutexLock lock(&mu_);
  return counters_;
}

}  // namespace lbcc::plugin
