// Test traffic for the NCCL net plugin, the way NCCL's proxy drives a network: a plan of grouped
// receives and their sends, deterministic contents, and loops that keep a window of requests in
// flight, poll test() (yielding when nothing moved, like NCCL's proxy thread) and check every byte.
//
// The loops reach the plugin through NetOps, so the same traffic runs against the C++
// implementation in-process (net_test.cc) and against every version of the built .so
// (plugin_harness_test.cc).
//
// Thread-safety: a Plan is immutable; one RunSends and one RunReceives may run on different
// threads over different comms.
#ifndef LBCC_PLUGIN_TESTING_TRAFFIC_H_
#define LBCC_PLUGIN_TESTING_TRAFFIC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace lbcc::plugin::testing {

struct Part {
  int tag = 0;
  size_t size = 0;    // Bytes sent.
  size_t buffer = 0;  // Receive buffer, >= size.
};

struct Group {
  std::vector<Part> parts;       // One grouped receive.
  std::vector<int> send_order;   // The sender posts the parts in this order.
};

struct PlanOptions {
  uint64_t seed = 1;
  int groups = 100;
  int max_parts = 8;            // Parts per group are drawn from [1, max_parts].
  size_t max_random_bytes = 256 << 10;
  // One part of its own group each, in this order, spread through the plan (e.g. 0, 16 MiB,
  // 64 MiB).
  std::vector<size_t> special_sizes;
};

struct Plan {
  std::vector<Group> groups;
  uint64_t messages = 0;
  uint64_t bytes = 0;
  size_t largest = 0;
};

// Sizes: 70 % up to 4 KiB, 25 % up to 256 KiB, 5 % up to max_random_bytes; a third of the
// receive buffers are larger than their message; tags are distinct within a group and repeat
// across groups; every group's send order is shuffled.
Plan MakePlan(const PlanOptions& options);

// Deterministic bytes of message `id` (its index in plan order).
void FillPattern(uint64_t id, absl::Span<uint8_t> bytes);
// Offset of the first byte that differs from FillPattern(id), or -1.
int64_t FindMismatch(uint64_t id, absl::Span<const uint8_t> bytes);

// The plugin calls the loops need. Errors are whatever the plugin returned, as a Status.
class NetOps {
 public:
  virtual ~NetOps() = default;
  virtual absl::Status RegMr(void* comm, void* data, size_t size, void** mhandle) = 0;
  virtual absl::Status DeregMr(void* comm, void* mhandle) = 0;
  // *request may come back null (try again).
  virtual absl::Status Isend(void* comm, void* data, size_t size, int tag, void* mhandle,
                             void** request) = 0;
  virtual absl::Status Irecv(void* comm, int n, void** data, size_t* sizes, int* tags,
                             void** mhandles, void** request) = 0;
  virtual absl::Status Test(void* request, bool* done, int* sizes) = 0;
};

struct TrafficStats {
  uint64_t messages = 0;
  uint64_t bytes = 0;
  int max_in_flight = 0;    // Requests posted and not yet completed, at most.
  uint64_t null_requests = 0;  // Times the plugin asked to try again.
};

// Sends every part of `plan` on `send_comm`, at most `window` send requests in flight, each from
// its own registered buffer. DeadlineExceeded (with what is pending) when `deadline` passes.
absl::StatusOr<TrafficStats> RunSends(NetOps& ops, void* send_comm, const Plan& plan, int window,
                                      absl::Time deadline);
// Posts one grouped receive per group, at most `window` in flight, and checks every size and
// byte (DataLoss naming the message and offset on a mismatch).
absl::StatusOr<TrafficStats> RunReceives(NetOps& ops, void* recv_comm, const Plan& plan,
                                         int window, absl::Time deadline);

}  // namespace lbcc::plugin::testing

#endif  // LBCC_PLUGIN_TESTING_TRAFFIC_H_
