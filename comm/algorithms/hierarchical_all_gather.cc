// The hierarchical all-gather: fast islands gather to a leader, leaders exchange over slow
// links, leaders spread the full set.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/algorithms/all_gather_task.h"

namespace lbcc::comm {
namespace {

using State = AllGatherTask::State;
using transport::Priority;
using transport::Tag;

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
// link once), leaders hand every member the full set. Tags: tag (member -> leader), tag + 1
// (leader <-> leader, one payload per message), tag + 2 (leader -> members, the full set).
class HierarchicalGather final : public State {
 public:
  using State::State;

 private:
  void Start() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    const Topology& topology = group_.fabric->topology();
    // Islands in order of their first member; the leader is the first member.
    std::map<int, std::vector<int>> by_island;  // island id -> group indices
    std::vector<int> island_order;
    for (int i = 0; i < group_.size(); ++i) {
      const int island = topology.island_of(group_.ranks[i]);
      if (!by_island.count(island)) island_order.push_back(island);
      by_island[island].push_back(i);
    }
    mine_ = by_island[topology.island_of(group_.ranks[group_.me])];
    if (group_.me != mine_[0]) {
      // Member: hand the payload to the leader, get everything back.
      const size_t bundle_max = max_bytes_ * group_.size() + 16 * group_.size() + 4;
      Join* join = NewJoin([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { MemberReceived(); });
      Send(join, mine_[0], tag_, &out_[group_.me]);
      RecvAny(join, mine_[0], tag_ + 2, &bundle_, bundle_max);
      Arm(join);
      return;
    }
    // Leader: 1-2. every island payload goes to every other leader as soon as this leader has
    // it (its own at once, a member's when it and the members before it arrived), one payload
    // per message, so a slow link starts with the island's first finished encode instead of
    // waiting for its last; the other leaders' payloads arrive the same way, one message each.
    size_t incoming = 0;
    for (int island : island_order) {
      const std::vector<int>& members = by_island[island];
      if (members[0] == group_.me) continue;
      other_leaders_.push_back(members[0]);
      incoming += members.size();
    }
    incoming_.resize(incoming);
    singles_.resize(mine_.size());
    exchange_ = NewJoin([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { LeadersExchanged(); });
    const size_t single_max = max_bytes_ + 16;  // Bundle framing of one payload
    size_t slot = 0;
    for (int other : other_leaders_) {
      for (size_t m = 0; m < by_island[topology.island_of(group_.ranks[other])].size(); ++m) {
        RecvAny(exchange_, other, tag_ + 1, &incoming_[slot++], single_max);
      }
    }
    arrived_.assign(mine_.size(), false);
    arrived_[0] = true;
    for (size_t k = 1; k < mine_.size(); ++k) {
      Join* join = NewJoin([this, k]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        arrived_[k] = true;
        Forward();
      });
      RecvAny(join, mine_[k], tag_, &out_[mine_[k]], max_bytes_);
      Arm(join);
    }
    Forward();
  }

  // Sends the island payloads that arrived, in member order, to the other leaders.
  void Forward() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    while (forwarded_ < mine_.size() && arrived_[forwarded_]) {
      singles_[forwarded_] = Bundle(out_, {mine_[forwarded_]});
      for (int other : other_leaders_) Send(exchange_, other, tag_ + 1, &singles_[forwarded_]);
      ++forwarded_;
    }
    if (forwarded_ == mine_.size() && !exchange_armed_) {
      exchange_armed_ = true;
      Arm(exchange_);
    }
  }

  // 3. spread the full set in the island.
  void LeadersExchanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    std::vector<bool> have(group_.size(), false);
    for (int i : mine_) have[i] = true;
    for (const std::string& single : incoming_) {
      absl::Status status = Unbundle(single, &out_, &have);
      if (!status.ok()) return Finish(status);
    }
    if (std::count(have.begin(), have.end(), true) != group_.size()) {
      return Finish(absl::DataLossError("island payloads missing"));
    }
    if (mine_.size() == 1) return Finish(absl::OkStatus());
    std::vector<int> everyone(group_.size());
    for (int i = 0; i < group_.size(); ++i) everyone[i] = i;
    bundle_ = Bundle(out_, everyone);
    Join* spread = NewJoin([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { Finish(absl::OkStatus()); });
    for (size_t k = 1; k < mine_.size(); ++k) Send(spread, mine_[k], tag_ + 2, &bundle_);
    Arm(spread);
  }

  void MemberReceived() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    std::vector<bool> have(group_.size(), false);
    const std::string own = out_[group_.me];
    absl::Status status = Unbundle(bundle_, &out_, &have);
    if (!status.ok()) return Finish(status);
    if (std::count(have.begin(), have.end(), true) != group_.size() || out_[group_.me] != own) {
      return Finish(absl::DataLossError("leader's bundle misses payloads"));
    }
    Finish(absl::OkStatus());
  }

  std::vector<int> mine_;              // this island's group indices; mine_[0] leads
  std::vector<int> other_leaders_;     // group indices
  std::vector<std::string> incoming_;  // other islands' payloads, one bundle each
  std::vector<std::string> singles_;   // this island's payloads as sent to the other leaders
  std::vector<bool> arrived_;          // per member of this island
  size_t forwarded_ = 0;               // members whose payload went to the other leaders
  Join* exchange_ = nullptr;           // receives from and sends to the other leaders
  bool exchange_armed_ = false;
  std::string bundle_;  // member: the set from the leader; leader: the set for the members
};

}  // namespace

std::shared_ptr<AllGatherTask::State> NewHierarchicalGather(const GatherParams& params) {
  return std::make_shared<HierarchicalGather>(params);
}

}  // namespace lbcc::comm
