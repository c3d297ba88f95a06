// Internal to the Link (link.cc, link_recv.cc): what its sealed chunks need beside their
// SecureChannel. A process-wide crypto pool that seals and opens chunks off the Link's mutex and
// the backends' progress threads, reusable scratch buffers for sealed bytes, and the header bytes
// a chunk's seal binds. One implementation each.
//
// Thread-safety: ScratchPool and CryptoPool are process-wide and thread-safe; a Scratch belongs to
// whoever holds it.
#ifndef LBCC_TRANSPORT_LINK_CRYPTO_H_
#define LBCC_TRANSPORT_LINK_CRYPTO_H_

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "transport/lane.h"

namespace lbcc::transport::link_internal {

// Scratch for sealed bytes, not zero-filled (it is written in full before it is read).
struct Scratch {
  std::unique_ptr<uint8_t[]> bytes;
  size_t capacity = 0;
};

// Scratch buffers kept for reuse: a fresh megabyte per chunk (allocated, faulted in, given back
// to the system) costs about as much as sealing it. Capacities are size classes (a power of two
// plus room for a sealed chunk's overhead), so that the last chunks of messages of every length
// share them; at most kMaxCachedBytes are kept.
class ScratchPool {
 public:
  static ScratchPool& Get() {
    static ScratchPool* const pool = new ScratchPool;  // Never destroyed: used by pool threads.
    return *pool;
  }

  std::shared_ptr<Scratch> Take(size_t size) {
    const size_t capacity = Capacity(size);
    auto scratch = std::make_unique<Scratch>();
    scratch->capacity = capacity;
    if (capacity <= kMaxClassBytes) {
      MutexLock lock(&mu_);
      auto it = free_.find(capacity);
      if (it != free_.end() && !it->second.empty()) {
        scratch->bytes = std::move(it->second.back());
        it->second.pop_back();
        cached_bytes_ -= capacity;
      }
    }
    if (scratch->bytes == nullptr) scratch->bytes.reset(new uint8_t[capacity]);
    return std::shared_ptr<Scratch>(scratch.release(), [](Scratch* s) { Get().Give(s); });
  }

 private:
  static constexpr size_t kSlack = 64;  // >= SecureChannel::kOverhead.
  static constexpr size_t kMaxClassBytes = (size_t{8} << 20) + kSlack;
  static constexpr size_t kMaxCachedBytes = size_t{64} << 20;

  static size_t Capacity(size_t size) {
    size_t base = 4096;
    while (base + kSlack < size) base <<= 1;
    return base + kSlack;
  }

  void Give(Scratch* scratch) {
    std::unique_ptr<Scratch> owned(scratch);
    if (scratch->capacity > kMaxClassBytes) return;
    MutexLock lock(&mu_);
    if (cached_bytes_ + scratch->capacity > kMaxCachedBytes) return;
    cached_bytes_ += scratch->capacity;
    free_[scratch->capacity].push_back(std::move(scratch->bytes));
  }

  Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<std::unique_ptr<uint8_t[]>>> free_ ABSL_GUARDED_BY(mu_);
  size_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// The crypto pool: a few threads per process that seal and open chunks of every Link, so that
// neither a Link's mutex nor a backend's progress thread waits for the cipher. One queue for all
// threads (a task never waits behind a busy thread while another is idle), and opens before
// seals: an open completes a receive (and returns its window) now, a seal only adds to what is
// already queued for the wire. The threads only run the cipher and hand chunks to lanes; they
// never progress a backend (the lane wakes the backend's own thread), which would hold a
// thread the cipher needs on a machine with few cores. A forked child (which has none of the
// parent's threads) makes its own pool on first use.
class CryptoPool {
 public:
  enum class Kind { kOpen, kSeal };

  static CryptoPool& Get() {
    CryptoPool* pool = g_pool.load(std::memory_order_acquire);
    if (pool != nullptr) return *pool;
    static Mutex* const mu = new Mutex;
    MutexLock lock(mu);
    pool = g_pool.load(std::memory_order_acquire);
    if (pool == nullptr) {
      static const bool registered = [] {
        return pthread_atfork(nullptr, nullptr,
                              [] { g_pool.store(nullptr, std::memory_order_release); }) == 0;
      }();
      (void)registered;
      pool = new CryptoPool(
          std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 4));
      g_pool.store(pool, std::memory_order_release);
    }
    return *pool;
  }

  void Post(Kind kind, absl::AnyInvocable<void()> task) {
    MutexLock lock(&mu_);
    (kind == Kind::kOpen ? opens_ : seals_).push_back(std::move(task));
    if (idle_ > 0) cv_.Signal();
  }

 private:
  explicit CryptoPool(int threads) {
    for (int i = 0; i < threads; ++i) {
      std::thread thread([this] { Run(); });
      pthread_setname_np(thread.native_handle(), "lbcc-crypto");
      thread.detach();  // Never joined: tasks may run at exit, the pool is never destroyed.
    }
  }

  void Run() {
    while (true) {
      absl::AnyInvocable<void()> task;
      {
        MutexLock lock(&mu_);
        while (opens_.empty() && seals_.empty()) {
          ++idle_;
          cv_.Wait(&mu_);
          --idle_;
        }
        std::deque<absl::AnyInvocable<void()>>& queue = opens_.empty() ? seals_ : opens_;
        task = std::move(queue.front());
        queue.pop_front();
      }
      task();
    }
  }

  // Never destroyed: tasks may run at exit.
  static inline std::atomic<CryptoPool*> g_pool{nullptr};

  Mutex mu_;
  CondVar cv_;
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<absl::AnyInvocable<void()>> opens_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::AnyInvocable<void()>> seals_ ABSL_GUARDED_BY(mu_);
};

// The bytes of a chunk header: what its seal authenticates.
inline absl::Span<const uint8_t> HeaderBytes(const ChunkHeader& header) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(&header), sizeof(header));
}

}  // namespace lbcc::transport::link_internal

#endif  // LBCC_TRANSPORT_LINK_CRYPTO_H_
