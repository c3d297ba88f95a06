// StagingPool: pinned host buffers for staging NCCL_PTR_CUDA messages, reused and bounded.
//
// Buffers come in power-of-two size classes (at least kMinStagingBytes). A released buffer is
// cached for reuse; the bytes allocated (cached plus in use) stay within the limit
// (LBCC_PLUGIN_STAGING_BYTES): to grow, the pool first frees cached buffers of other classes;
// when that is not enough, Acquire returns nullopt and the caller reports "no request yet"
// (NCCL calls again). One exception keeps every comm moving: a caller holding no staging
// buffer (`must_succeed`) always gets one, beyond the limit if it must, so that the oldest
// request of each comm can always be staged (the pool can then never deadlock two comms that
// wait for each other's messages). Buffers allocated beyond the limit are freed on release.
//
// Thread-safety: thread-safe.
#ifndef LBCC_PLUGIN_STAGING_H_
#define LBCC_PLUGIN_STAGING_H_

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "plugin/gpu.h"

namespace lbcc::plugin {

inline constexpr size_t kMinStagingBytes = size_t{64} << 10;

struct StagingBuffer {
  uint8_t* data = nullptr;
  size_t capacity = 0;  // Its size class.
};

class StagingPool {
 public:
  StagingPool(std::shared_ptr<Gpu> gpu, size_t limit_bytes)
      : gpu_(std::move(gpu)), limit_bytes_(limit_bytes) {}
  ~StagingPool();  // Frees the cached buffers; buffers still out are leaked, not freed under use.
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A buffer of at least `bytes`, or nullopt when the limit leaves no room (never when
  // `must_succeed`). ResourceExhausted when the pinned allocation itself fails.
  absl::StatusOr<std::optional<StagingBuffer>> Acquire(size_t bytes, bool must_succeed);
  void Release(StagingBuffer buffer);

  struct Counters {
    uint64_t allocated_bytes = 0;  // Cached plus in use.
    uint64_t in_use_bytes = 0;
    uint64_t peak_allocated_bytes = 0;
    uint64_t allocations = 0;      // Pinned allocations made, ever.
    uint64_t refusals = 0;         // Acquire calls answered nullopt.
  };
  Counters counters();
  size_t limit_bytes() const { return limit_bytes_; }
  Gpu* gpu() const { return gpu_.get(); }

 private:
  static size_t ClassOf(size_t bytes);

  const std::shared_ptr<Gpu> gpu_;
  const size_t limit_bytes_;
  Mutex mu_;
  std::map<size_t, std::vector<uint8_t*>> cached_ ABSL_GUARDED_BY(mu_);  // By size class.
  Counters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lbcc::plugin

#endif  // LBCC_PLUGIN_STAGING_H_
