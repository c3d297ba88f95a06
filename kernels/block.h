// The thread-block model the kernels are written in, and its host emulation.
//
// A block-level algorithm (kernels/topk_select.h, kernels/topk_aggregate.h) is a template over a
// Block type and is written as a sequence of phases:
//
//   b.Phase([&](int tid, Local& mine) { ... });   // every thread runs the lambda, then all
//                                                 // threads meet at a barrier
//   b.ExclusiveSum(in, out);                      // scans of one uint32 per thread, in shared
//   b.InclusiveSuffixSum(in, out);                // memory, each followed by a barrier
//   b.CountDigit(hist, digit, active);            // ++hist[digit] when active; inside a phase,
//                                                 // called by every thread alike (the device
//                                                 // combines a warp's equal digits first)
//
// `Local` is a thread's private state (registers on the device), b.shared() the block's shared
// memory. A phase may read what earlier phases wrote anywhere, but within a phase a thread may
// only read shared data no other thread writes in that phase (updates through hd::Atomic* are
// fine). Control flow between phases must be uniform across the block.
//
// DeviceBlock (kernels/device_block.cuh) maps this onto CUDA: one lambda call per thread,
// __syncthreads() after each phase, CUB block scans. HostBlock below runs the threads one after
// another, phase by phase: the same algorithm, so host tests check the kernels' logic against
// the CPU codecs on machines without a GPU. What host emulation cannot check: CUDA's own
// semantics (barriers reached by every thread, races the rule above excludes, launch limits).
//
// Thread-safety: a HostBlock belongs to one thread.
#ifndef LBCC_KERNELS_BLOCK_H_
#define LBCC_KERNELS_BLOCK_H_

#include <cstdint>
#include <memory>
#include <vector>

namespace lbcc::kernels {

template <typename Shared, typename Local>
class HostBlock {
 public:
  explicit HostBlock(int threads)
      : threads_(threads), shared_(std::make_unique<Shared>()), locals_(threads) {}

  int threads() const { return threads_; }
  Shared& shared() { return *shared_; }

  template <typename F>
  void Phase(F&& f) {
    for (int t = 0; t < threads_; ++t) f(t, locals_[t]);
  }
  // out[t] = sum of in[0..t) for t < threads().
  void ExclusiveSum(const uint32_t* in, uint32_t* out) {
    uint32_t running = 0;
    for (int t = 0; t < threads_; ++t) {
      const uint32_t v = in[t];
      out[t] = running;
      running += v;
    }
  }
  void CountDigit(uint32_t* hist, uint32_t digit, bool active) {
    if (active) ++hist[digit];
  }
  // out[t] = sum of in[t..threads()).
  void InclusiveSuffixSum(const uint32_t* in, uint32_t* out) {
    uint32_t running = 0;
    for (int t = threads_ - 1; t >= 0; --t) {
      running += in[t];
      out[t] = running;
    }
  }

 private:
  int threads_;
  std::unique_ptr<Shared> shared_;
  std::vector<Local> locals_;
};

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_BLOCK_H_
