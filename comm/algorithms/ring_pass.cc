// RingPass: the pipelined ring every ring reduction runs on (collectives.h), and the reduction
// rings' schedule (reduce_ring.h).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "base/check.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "comm/algorithms/reduce_ring.h"
#include "comm/collectives.h"
#include "transport/netif.h"

namespace lbcc::comm {
namespace {

using transport::Priority;
using transport::Tag;

// Whether ranks a and b advertise different hosts (UCX's "host:port"; other backends' addresses
// name no host: never).
bool AcrossNetwork(const Fabric& fabric, int a, int b) {
  const std::vector<std::string>& addresses = fabric.addresses();
  if (a >= static_cast<int>(addresses.size()) || b >= static_cast<int>(addresses.size())) {
    return false;
  }
  absl::StatusOr<transport::HostAndPort> host_a = transport::ParseHostPort(addresses[a], "address");
  absl::StatusOr<transport::HostAndPort> host_b = transport::ParseHostPort(addresses[b], "address");
  return host_a.ok() && host_b.ok() && host_a->host != host_b->host;
}

}  // namespace

absl::Status RingPass(const Group& group, uint8_t* data, absl::Span<const size_t> offsets,
                      size_t element, const RingSchedule& schedule, Priority priority,
                      absl::Time deadline) {
  const int n = group.size();
  const int steps = schedule.steps;
  const int staged = schedule.combine_steps;  // steps whose receives are staged and combined
  if (n == 1 || steps <= 0) return absl::OkStatus();
  LBCC_CHECK(static_cast<int>(offsets.size()) == n + 1) << "RingPass: offsets";
  const int right = group.ranks[(group.me + 1) % n];
  const int left = group.ranks[(group.me + n - 1) % n];
  size_t largest = 0;  // elements
  for (int c = 0; c < n; ++c) largest = std::max(largest, (offsets[c + 1] - offsets[c]) / element);
  // Segments pay where a chunk takes long on the wire: over slow links. Over fast ones a step
  // takes about as long as the thread hand-offs a segment costs, so a chunk goes whole. Every
  // rank derives the same segments from the same offsets and topology.
  // Neighbours that advertise different hosts have a network between them even where the
  // topology made one fast island of them (hosts that share a name, as tools/testbed's do), and
  // a chunk takes long on such a wire too.
  bool slow_ring = false;
  for (int i = 0; i < n; ++i) {
    const int a = group.ranks[i], b = group.ranks[(i + 1) % n];
    slow_ring = slow_ring || group.fabric->topology().link(a, b) == LinkClass::kSlow ||
                AcrossNetwork(*group.fabric, a, b);
  }
  const size_t segments =
      !slow_ring
          ? 1
          : std::max<size_t>(1, std::min(largest, (largest * element + kRingSegmentBytes - 1) /
                                                      kRingSegmentBytes));
  auto seg_begin = [&](int c, size_t j) {  // byte offset of segment j of chunk c in `data`
    const size_t elements = (offsets[c + 1] - offsets[c]) / element;
    return offsets[c] + elements * j / segments * element;
  };
  // Combined receives land in one of two staging buffers (by step parity) first; a step's
  // receives are posted a step ahead, the next buffer's once the step before it was combined.
  // Not zero-filled: every byte a combine reads was received first.
  std::unique_ptr<uint8_t[]> incoming[2];
  if (staged > 0) {
    for (auto& buffer : incoming) buffer.reset(new uint8_t[largest * element]);
  }
  auto target = [&](int step, size_t j) -> uint8_t* {
    const int c = schedule.recv_chunk(step);
    if (step >= staged) return data + seg_begin(c, j);
    return incoming[step % 2].get() + (seg_begin(c, j) - offsets[c]);
  };
  // Declared after the buffers they point into, so they are destroyed (drained) first.
  std::vector<std::unique_ptr<Batch>> sends;
  std::vector<std::unique_ptr<Batch>> recvs(static_cast<size_t>(steps) * segments);
  auto post_recvs = [&](int step) {
    const int c = schedule.recv_chunk(step);
    for (size_t j = 0; j < segments; ++j) {
      auto batch = std::make_unique<Batch>(group.fabric, deadline);
      batch->Recv(left, schedule.step_tag(step),
                  absl::MakeSpan(target(step, j), seg_begin(c, j + 1) - seg_begin(c, j)));
      recvs[step * segments + j] = std::move(batch);
    }
  };
  auto post_send = [&](int step, size_t j) {
    const int c = schedule.send_chunk(step);
    auto batch = std::make_unique<Batch>(group.fabric, deadline);
    batch->Send(right, schedule.step_tag(step),
                absl::MakeConstSpan(data + seg_begin(c, j), seg_begin(c, j + 1) - seg_begin(c, j)),
                priority);
    sends.push_back(std::move(batch));
  };
  // Receives straight into `data` (the all-gather's) are posted once no combine but the last
  // step's can still touch their chunks (the last combined chunk is never received again).
  auto post_direct_recvs = [&] {
    for (int step = staged; step < steps; ++step) post_recvs(step);
  };
  for (int step = 0; step < std::min(staged, 2); ++step) post_recvs(step);
  if (staged <= 1) post_direct_recvs();
  for (size_t j = 0; j < segments; ++j) post_send(0, j);
  const absl::Time start = absl::Now();
  for (int step = 0; step < steps; ++step) {
    const int c = schedule.recv_chunk(step);
    for (size_t j = 0; j < segments; ++j) {
      LBCC_RETURN_IF_ERROR(recvs[step * segments + j]->Wait());
      if (step < staged) {
        const size_t elements = (seg_begin(c, j + 1) - seg_begin(c, j)) / element;
        schedule.combine(data + seg_begin(c, j), target(step, j), elements);
        if (step == staged - 1 && schedule.finish)
          schedule.finish(data + seg_begin(c, j), elements);
      }
      if (step + 1 < steps) post_send(step + 1, j);
    }
    if (step + 2 < staged) post_recvs(step + 2);
    if (step + 2 == staged) post_direct_recvs();
    LBCC_LOG(TRACE) << "ring (tag " << schedule.step_tag(0) << "): step " << step << " of " << steps
                    << ", " << segments << " segments of chunk " << c << ", in after "
                    << absl::ToDoubleMilliseconds(absl::Now() - start) << " ms";
  }
  for (auto& batch : sends) LBCC_RETURN_IF_ERROR(batch->Wait());
  LBCC_LOG(TRACE) << "ring (tag " << schedule.step_tag(0) << "): sends done after "
                  << absl::ToDoubleMilliseconds(absl::Now() - start) << " ms";
  return absl::OkStatus();
}

std::vector<size_t> EvenChunkOffsets(size_t count, int n, size_t element) {
  std::vector<size_t> offsets(n + 1);
  for (int c = 0; c <= n; ++c) offsets[c] = count * static_cast<size_t>(c) / n * element;
  return offsets;
}

RingSchedule ReduceRingSchedule(const Group& g, Tag tag, DType type, ReduceOp op, bool all_gather) {
  const int n = g.size();
  const int me = g.me;
  RingSchedule ring;
  ring.combine_steps = n - 1;
  ring.steps = all_gather ? 2 * (n - 1) : n - 1;
  ring.send_chunk = [me, n](int s) { return ((me - s - 1) % n + n) % n; };
  ring.recv_chunk = [me, n](int s) { return ((me - s - 2) % n + n) % n; };
  ring.step_tag = [tag, n](int s) { return s < n - 1 ? tag + s : tag + n + (s - (n - 1)); };
  ring.combine = [type, op](uint8_t* dst, const uint8_t* src, size_t elements) {
    ReduceCombine(dst, src, elements, type, op);
  };
  if (all_gather) {
    ring.finish = [type, op, n](uint8_t* segment, size_t elements) {
      ReduceFinish(segment, elements, type, op, n);
    };
  }
  return ring;
}

}  // namespace lbcc::comm
