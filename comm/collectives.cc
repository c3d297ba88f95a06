#include "comm/collectives.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status_macros.h"

namespace lbcc::comm {
namespace {

using transport::Priority;
using transport::Tag;

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

absl::Status Direct(const Group& g, Tag tag, const std::string& mine, std::vector<std::string>* out,
                    Priority priority, absl::Time deadline, size_t max_bytes) {
  Batch batch(g.fabric, deadline);
  for (int i = 0; i < g.size(); ++i) {
    if (i == g.me) continue;
    batch.Send(g.ranks[i], tag, Bytes(mine), priority);
    batch.RecvAny(g.ranks[i], tag, &(*out)[i], max_bytes);
  }
  return batch.Wait();
}

absl::Status Ring(const Group& g, Tag tag, std::vector<std::string>* out, Priority priority,
                  absl::Time deadline, size_t max_bytes) {
  const int n = g.size();
  const int right = g.ranks[(g.me + 1) % n];
  const int left = g.ranks[(g.me + n - 1) % n];
  for (int step = 0; step < n - 1; ++step) {
    const int send_index = (g.me - step + n) % n;
    const int recv_index = (g.me - step - 1 + n) % n;
    Batch batch(g.fabric, deadline);
    batch.Send(right, tag + step, Bytes((*out)[send_index]), priority);
    batch.RecvAny(left, tag + step, &(*out)[recv_index], max_bytes);
    LBCC_RETURN_IF_ERROR(batch.Wait());
  }
  return absl::OkStatus();
}

// Bundle: u32 count, then per entry u32 index, u64 size, bytes.
std::string Bundle(const std::vector<std::string>& payloads, const std::vector<int>& indices) {
  std::string out;
  auto put = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  const uint32_t count = static_cast<uint32_t>(indices.size());
  put(&count, 4);
  for (int index : indices) {
    const uint32_t i = static_cast<uint32_t>(index);
    const uint64_t size = payloads[index].size();
    put(&i, 4);
    put(&size, 8);
    out += payloads[index];
  }
  return out;
}

absl::Status Unbundle(const std::string& bundle, std::vector<std::string>* payloads,
                      std::vector<bool>* have) {
  size_t offset = 0;
  auto take = [&](void* p, size_t n) {
    if (bundle.size() - offset < n) return false;
    std::memcpy(p, bundle.data() + offset, n);
    offset += n;
    return true;
  };
  uint32_t count = 0;
  if (!take(&count, 4)) return absl::DataLossError("truncated payload bundle");
  for (uint32_t e = 0; e < count; ++e) {
    uint32_t index = 0;
    uint64_t size = 0;
    if (!take(&index, 4) || !take(&size, 8) || bundle.size() - offset < size ||
        index >= payloads->size() || (*have)[index]) {
      return absl::DataLossError("malformed payload bundle");
    }
    (*payloads)[index].assign(bundle.data() + offset, size);
    (*have)[index] = true;
    offset += size;
  }
  if (offset != bundle.size()) return absl::DataLossError("trailing bytes in payload bundle");
  return absl::OkStatus();
}

// Gather in fast islands, leaders exchange the island payloads (each payload crosses each slow
// link once), leaders hand every member the full set.
absl::Status Hierarchical(const Group& g, Tag tag, std::vector<std::string>* out,
                          Priority priority, absl::Time deadline, size_t max_bytes) {
  const Topology& topology = g.fabric->topology();
  // Islands in order of their first member; the leader is the first member.
  std::map<int, std::vector<int>> by_island;  // island id -> group indices
  std::vector<int> island_order;
  for (int i = 0; i < g.size(); ++i) {
    const int island = topology.island_of(g.ranks[i]);
    if (!by_island.count(island)) island_order.push_back(island);
    by_island[island].push_back(i);
  }
  const std::vector<int>& mine = by_island[topology.island_of(g.ranks[g.me])];
  const int leader = mine[0];
  const size_t bundle_max = max_bytes * g.size() + 16 * g.size() + 4;
  if (g.me != leader) {
    // Member: hand the payload to the leader, get everything back.
    std::string all;
    Batch batch(g.fabric, deadline);
    batch.Send(g.ranks[leader], tag, Bytes((*out)[g.me]), priority);
    batch.RecvAny(g.ranks[leader], tag + 2, &all, bundle_max);
    LBCC_RETURN_IF_ERROR(batch.Wait());
    std::vector<bool> have(g.size(), false);
    const std::string own = (*out)[g.me];
    LBCC_RETURN_IF_ERROR(Unbundle(all, out, &have));
    if (std::count(have.begin(), have.end(), true) != g.size() || (*out)[g.me] != own) {
      return absl::DataLossError("leader's bundle misses payloads");
    }
    return absl::OkStatus();
  }
  // Leader: 1-2. every island payload goes to every other leader as soon as this leader has it
  // (its own at once, a member's when it arrives), one payload per message, so a slow link
  // starts with the island's first finished encode instead of waiting for its last; the other
  // leaders' payloads arrive the same way, one message each.
  std::vector<int> other_leaders;  // group indices
  std::vector<std::string> incoming;
  for (int island : island_order) {
    const std::vector<int>& members = by_island[island];
    if (members[0] == g.me) continue;
    other_leaders.push_back(members[0]);
    for (size_t m = 0; m < members.size(); ++m) incoming.emplace_back();
  }
  const size_t single_max = max_bytes + 16;  // Bundle framing of one payload
  std::vector<std::string> singles(mine.size());  // sent from, alive until `exchange` is done
  Batch exchange(g.fabric, deadline);
  {
    size_t slot = 0;
    for (int other : other_leaders) {
      for (size_t m = 0; m < by_island[topology.island_of(g.ranks[other])].size(); ++m) {
        exchange.RecvAny(g.ranks[other], tag + 1, &incoming[slot++], single_max);
      }
    }
  }
  std::vector<std::unique_ptr<Batch>> gather;  // one per member, all posted at once
  for (size_t k = 1; k < mine.size(); ++k) {
    gather.push_back(std::make_unique<Batch>(g.fabric, deadline));
    gather.back()->RecvAny(g.ranks[mine[k]], tag, &(*out)[mine[k]], max_bytes);
  }
  for (size_t k = 0; k < mine.size(); ++k) {
    if (k > 0) LBCC_RETURN_IF_ERROR(gather[k - 1]->Wait());
    singles[k] = Bundle(*out, {mine[k]});
    for (int other : other_leaders) {
      exchange.Send(g.ranks[other], tag + 1, Bytes(singles[k]), priority);
    }
  }
  LBCC_RETURN_IF_ERROR(exchange.Wait());
  std::vector<bool> have(g.size(), false);
  for (int i : mine) have[i] = true;
  for (const std::string& single : incoming) LBCC_RETURN_IF_ERROR(Unbundle(single, out, &have));
  if (std::count(have.begin(), have.end(), true) != g.size()) {
    return absl::DataLossError("island payloads missing");
  }
  // 3. spread the full set in the island.
  if (mine.size() > 1) {
    std::vector<int> everyone(g.size());
    for (int i = 0; i < g.size(); ++i) everyone[i] = i;
    const std::string all = Bundle(*out, everyone);
    Batch batch(g.fabric, deadline);
    for (size_t k = 1; k < mine.size(); ++k) {
      batch.Send(g.ranks[mine[k]], tag + 2, Bytes(all), priority);
    }
    LBCC_RETURN_IF_ERROR(batch.Wait());
  }
  return absl::OkStatus();
}

// dst[i] = round(float(dst[i]) + float(src[i])) in `dtype`.
void Accumulate(void* dst, const void* src, size_t count, DType dtype) {
  switch (dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(dst);
      const float* s = static_cast<const float*>(src);
      for (size_t i = 0; i < count; ++i) d[i] += s[i];
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToBf16(Bf16ToF32(d[i]) + Bf16ToF32(s[i]));
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToF16(F16ToF32(d[i]) + F16ToF32(s[i]));
      return;
    }
    default:
      LBCC_CHECK(false) << "Accumulate: unsupported dtype";
  }
}

void Scale(void* data, size_t count, DType dtype, float factor) {
  switch (dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(data);
      for (size_t i = 0; i < count; ++i) d[i] *= factor;
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToBf16(Bf16ToF32(d[i]) * factor);
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToF16(F16ToF32(d[i]) * factor);
      return;
    }
    default:
      LBCC_CHECK(false) << "Scale: unsupported dtype";
  }
}

}  // namespace

absl::Status AllGatherV(const Group& group, Tag tag, const std::string& mine,
                        std::vector<std::string>* out, Algorithm algorithm, Priority priority,
                        absl::Time deadline, size_t max_bytes) {
  out->assign(group.size(), std::string());
  (*out)[group.me] = mine;
  if (group.size() == 1) return absl::OkStatus();
  switch (algorithm) {
    case Algorithm::kDirect:
      return Direct(group, tag, mine, out, priority, deadline, max_bytes);
    case Algorithm::kRing:
      return Ring(group, tag, out, priority, deadline, max_bytes);
    case Algorithm::kHierarchical:
      return Hierarchical(group, tag, out, priority, deadline, max_bytes);
    case Algorithm::kAuto:
      break;
  }
  return absl::InternalError("AllGatherV: algorithm not resolved");
}

absl::Status AllReduceRing(const Group& group, Tag tag, const void* in, void* out, size_t count,
                           DType dtype, ReduceOp op, Priority priority, absl::Time deadline) {
  const size_t element = DTypeSize(dtype);
  if (in != out) std::memmove(out, in, count * element);
  const int n = group.size();
  if (n == 1) return absl::OkStatus();
  uint8_t* data = static_cast<uint8_t*>(out);
  // Chunk c covers [begin(c), begin(c + 1)).
  auto begin = [&](int c) { return count * static_cast<size_t>(c) / n; };
  auto chunk = [&](int c) {
    return absl::Span<uint8_t>(data + begin(c) * element, (begin(c + 1) - begin(c)) * element);
  };
  const int right = group.ranks[(group.me + 1) % n];
  const int left = group.ranks[(group.me + n - 1) % n];
  std::vector<uint8_t> incoming((count / n + 1) * element);
  // Reduce-scatter: after n-1 steps, rank r owns the full sum of chunk (r + 1) % n.
  for (int step = 0; step < n - 1; ++step) {
    const int send_c = (group.me - step + n) % n;
    const int recv_c = (group.me - step - 1 + n) % n;
    absl::Span<uint8_t> target = chunk(recv_c);
    Batch batch(group.fabric, deadline);
    batch.Send(right, tag + step, chunk(send_c), priority);
    batch.Recv(left, tag + step, absl::MakeSpan(incoming.data(), target.size()));
    LBCC_RETURN_IF_ERROR(batch.Wait());
    Accumulate(target.data(), incoming.data(), target.size() / element, dtype);
  }
  const int owned = (group.me + 1) % n;
  if (op == ReduceOp::kMean) Scale(chunk(owned).data(), chunk(owned).size() / element, dtype, 1.0f / n);
  // All-gather the owned chunks.
  for (int step = 0; step < n - 1; ++step) {
    const int send_c = (group.me + 1 - step + n) % n;
    const int recv_c = (group.me - step + n) % n;
    Batch batch(group.fabric, deadline);
    batch.Send(right, tag + n + step, chunk(send_c), priority);
    batch.Recv(left, tag + n + step, chunk(recv_c));
    LBCC_RETURN_IF_ERROR(batch.Wait());
  }
  return absl::OkStatus();
}

absl::Status Broadcast(const Group& group, Tag tag, void* buffer, size_t bytes, int root,
                       Priority priority, absl::Time deadline) {
  if (group.size() == 1) return absl::OkStatus();
  absl::Span<uint8_t> span(static_cast<uint8_t*>(buffer), bytes);
  Batch batch(group.fabric, deadline);
  if (group.me == root) {
    for (int i = 0; i < group.size(); ++i) {
      if (i != root) batch.Send(group.ranks[i], tag, span, priority);
    }
  } else {
    batch.Recv(group.ranks[root], tag, span);
  }
  return batch.Wait();
}

}  // namespace lbcc::comm
