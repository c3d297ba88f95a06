#include "plugin/testing/traffic.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace lbcc::plugin::testing {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Word(uint64_t id, uint64_t index) { return Mix((id << 40) ^ index); }

// A registered buffer owned by the loops.
struct Buffer {
  std::vector<uint8_t> bytes;
  void* mhandle = nullptr;
};

absl::Status Register(NetOps& ops, void* comm, Buffer* buffer) {
  // Zero-byte messages still get a registered (one-byte) buffer, as NCCL's would be.
  if (buffer->bytes.empty()) buffer->bytes.resize(1);
  return ops.RegMr(comm, buffer->bytes.data(), buffer->bytes.size(), &buffer->mhandle);
}

// A grouped receive in flight: one irecv of a plan group's parts.
struct GroupReceive {
  void* request = nullptr;
  size_t group = 0;
  uint64_t first_id = 0;
  std::vector<Buffer> buffers;
};

// A finished grouped receive: every part's size and bytes as the plan says; deregisters its
// buffers and counts its messages in `stats`. DataLoss for a wrong size or byte.
absl::Status CheckGroupReceive(NetOps& ops, void* recv_comm, const Group& group,
                               const GroupReceive& receive, const int* sizes,
                               TrafficStats* stats) {
  for (size_t p = 0; p < group.parts.size(); ++p) {
    const uint64_t id = receive.first_id + p;
    const size_t expected = group.parts[p].size;
    if (sizes[p] != static_cast<int>(expected)) {
      return absl::DataLossError(absl::StrCat("message ", id, " (group ", receive.group, " part ",
                                              p, ", tag ", group.parts[p].tag, "): ", sizes[p],
                                              " bytes, expected ", expected));
    }
    const int64_t bad =
        FindMismatch(id, absl::MakeConstSpan(receive.buffers[p].bytes.data(), expected));
    if (bad >= 0) {
      return absl::DataLossError(absl::StrCat("message ", id, " of ", expected,
                                              " bytes differs at offset ", bad));
    }
    absl::Status dereg = ops.DeregMr(recv_comm, receive.buffers[p].mhandle);
    if (!dereg.ok()) return dereg;
    ++stats->messages;
    stats->bytes += expected;
  }
  return absl::OkStatus();
}

}  // namespace

Plan MakePlan(const PlanOptions& options) {
  std::mt19937_64 random(options.seed);
  auto uniform = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(random);
  };
  auto random_size = [&]() -> size_t {
    const uint64_t bucket = uniform(0, 99);
    if (bucket < 70) return uniform(0, 4096);
    if (bucket < 95) return uniform(4097, 256 << 10);
    return uniform(0, options.max_random_bytes);
  };
  Plan plan;
  const int groups = std::max(options.groups, static_cast<int>(options.special_sizes.size()));
  const size_t specials = options.special_sizes.size();
  size_t next_special = 0;
  for (int g = 0; g < groups; ++g) {
    Group group;
    const bool special =
        next_special < specials &&
        static_cast<size_t>(g) >= (next_special + 1) * groups / (specials + 1);
    const int parts = special ? 1 : static_cast<int>(uniform(1, options.max_parts));
    const int tag_base = static_cast<int>(g % 5) * options.max_parts;
    for (int p = 0; p < parts; ++p) {
      Part part;
      part.tag = tag_base + p;
      part.size = special ? options.special_sizes[next_special++] : random_size();
      part.buffer = part.size;
      if (uniform(0, 2) == 0) part.buffer += uniform(1, 4096);
      group.parts.push_back(part);
      group.send_order.push_back(p);
      plan.messages += 1;
      plan.bytes += part.size;
      plan.largest = std::max(plan.largest, part.size);
    }
    std::shuffle(group.send_order.begin(), group.send_order.end(), random);
    plan.groups.push_back(std::move(group));
  }
  return plan;
}

void FillPattern(uint64_t id, absl::Span<uint8_t> bytes) {
  const size_t words = bytes.size() / 8;
  for (size_t k = 0; k < words; ++k) {
    const uint64_t word = Word(id, k);
    std::memcpy(bytes.data() + 8 * k, &word, 8);
  }
  if (bytes.size() % 8 != 0) {
    const uint64_t word = Word(id, words);
    std::memcpy(bytes.data() + 8 * words, &word, bytes.size() % 8);
  }
}

int64_t FindMismatch(uint64_t id, absl::Span<const uint8_t> bytes) {
  const size_t words = bytes.size() / 8;
  for (size_t k = 0; k <= words; ++k) {
    const size_t length = k < words ? 8 : bytes.size() % 8;
    if (length == 0) break;
    const uint64_t expected = Word(id, k);
    if (std::memcmp(bytes.data() + 8 * k, &expected, length) != 0) {
      for (size_t i = 0; i < length; ++i) {
        if (bytes[8 * k + i] != reinterpret_cast<const uint8_t*>(&expected)[i]) {
          return static_cast<int64_t>(8 * k + i);
        }
      }
    }
  }
  return -1;
}

absl::StatusOr<TrafficStats> RunSends(NetOps& ops, void* send_comm, const Plan& plan, int window,
                                      absl::Time deadline) {
  struct InFlight {
    void* request = nullptr;
    uint64_t id = 0;
    size_t size = 0;
    Buffer buffer;
  };
  // Message ids in plan order; parts are posted in each group's send order.
  struct Next {
    uint64_t id;
    const Part* part;
  };
  std::vector<Next> order;
  uint64_t first_id = 0;
  for (const Group& group : plan.groups) {
    for (int p : group.send_order) order.push_back({first_id + p, &group.parts[p]});
    first_id += group.parts.size();
  }

  TrafficStats stats;
  std::deque<std::unique_ptr<InFlight>> in_flight;
  size_t next = 0;
  while (next < order.size() || !in_flight.empty()) {
    bool moved = false;
    while (next < order.size() && static_cast<int>(in_flight.size()) < window) {
      auto message = std::make_unique<InFlight>();
      message->id = order[next].id;
      message->size = order[next].part->size;
      message->buffer.bytes.resize(message->size);
      FillPattern(message->id, absl::MakeSpan(message->buffer.bytes));
      absl::Status status = Register(ops, send_comm, &message->buffer);
      if (!status.ok()) return status;
      status = ops.Isend(send_comm, message->buffer.bytes.data(), message->size,
                         order[next].part->tag, message->buffer.mhandle, &message->request);
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat("isend of message ", message->id, ": ",
                                                        status.message()));
      }
      if (message->request == nullptr) {
        ++stats.null_requests;
        (void)ops.DeregMr(send_comm, message->buffer.mhandle);
        break;
      }
      in_flight.push_back(std::move(message));
      ++next;
      moved = true;
      stats.max_in_flight = std::max(stats.max_in_flight, static_cast<int>(in_flight.size()));
    }
    for (auto it = in_flight.begin(); it != in_flight.end();) {
      bool done = false;
      int sizes[1] = {-1};
      absl::Status status = ops.Test((*it)->request, &done, sizes);
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat("test of send ", (*it)->id, ": ",
                                                        status.message()));
      }
      if (!done) {
        ++it;
        continue;
      }
      if (sizes[0] != static_cast<int>((*it)->size)) {
        return absl::DataLossError(absl::StrCat("send ", (*it)->id, " of ", (*it)->size,
                                                " bytes reported ", sizes[0]));
      }
      absl::Status dereg = ops.DeregMr(send_comm, (*it)->buffer.mhandle);
      if (!dereg.ok()) return dereg;
      ++stats.messages;
      stats.bytes += (*it)->size;
      it = in_flight.erase(it);
      moved = true;
    }
    if (!moved) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("sends: ", stats.messages, " of ", order.size(), " done, ",
                         in_flight.size(), " in flight, oldest message ",
                         in_flight.empty() ? 0 : in_flight.front()->id));
      }
      std::this_thread::yield();
    }
  }
  return stats;
}

absl::StatusOr<TrafficStats> RunReceives(NetOps& ops, void* recv_comm, const Plan& plan,
                                         int window, absl::Time deadline) {
  TrafficStats stats;
  std::deque<std::unique_ptr<GroupReceive>> in_flight;
  size_t next = 0;
  uint64_t next_id = 0;
  while (next < plan.groups.size() || !in_flight.empty()) {
    bool moved = false;
    while (next < plan.groups.size() && static_cast<int>(in_flight.size()) < window) {
      const Group& group = plan.groups[next];
      const int n = static_cast<int>(group.parts.size());
      auto receive = std::make_unique<GroupReceive>();
      receive->group = next;
      receive->first_id = next_id;
      receive->buffers.resize(n);
      void* data[8];
      size_t sizes[8];
      int tags[8];
      void* mhandles[8];
      for (int p = 0; p < n; ++p) {
        Buffer& buffer = receive->buffers[p];
        buffer.bytes.assign(group.parts[p].buffer, 0xee);
        absl::Status status = Register(ops, recv_comm, &buffer);
        if (!status.ok()) return status;
        data[p] = buffer.bytes.data();
        sizes[p] = group.parts[p].buffer;
        tags[p] = group.parts[p].tag;
        mhandles[p] = buffer.mhandle;
      }
      absl::Status status = ops.Irecv(recv_comm, n, data, sizes, tags, mhandles,
                                      &receive->request);
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat("irecv of group ", next, ": ",
                                                        status.message()));
      }
      if (receive->request == nullptr) {
        ++stats.null_requests;
        for (Buffer& buffer : receive->buffers) (void)ops.DeregMr(recv_comm, buffer.mhandle);
        break;
      }
      next_id += n;
      ++next;
      in_flight.push_back(std::move(receive));
      moved = true;
      stats.max_in_flight = std::max(stats.max_in_flight, static_cast<int>(in_flight.size()));
    }
    for (auto it = in_flight.begin(); it != in_flight.end();) {
      GroupReceive& receive = **it;
      const Group& group = plan.groups[receive.group];
      bool done = false;
      int sizes[8];
      std::fill(sizes, sizes + 8, -1);
      absl::Status status = ops.Test(receive.request, &done, sizes);
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat("test of group ", receive.group, ": ",
                                                        status.message()));
      }
      if (!done) {
        ++it;
        continue;
      }
      absl::Status checked = CheckGroupReceive(ops, recv_comm, group, receive, sizes, &stats);
      if (!checked.ok()) return checked;
      it = in_flight.erase(it);
      moved = true;
    }
    if (!moved) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("receives: ", stats.messages, " messages done, ", in_flight.size(),
                         " grouped receives in flight, oldest group ",
                         in_flight.empty() ? 0 : in_flight.front()->group));
      }
      std::this_thread::yield();
    }
  }
  return stats;
}

}  // namespace lbcc::plugin::testing
