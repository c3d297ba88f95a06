// Fuzzes the master's side of the membership protocol: what members (or anyone who can reach
// the master) send it. The input is a session: records of [u8 connection (0-3)][u32 length]
// [body]. As ElasticMaster does (master_server.cc), a frame over kMaxMemberFrame or a body that
// does not decode ends its connection (Lost), a connection's first message must be a join, and
// every decoded message goes into a MembershipPolicy (membership_policy.h) whose decisions are
// recorded; the clock advances 100 ms per record and ticks every fourth. Never a crash; every
// message the policy sends decodes again (a member would accept it).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/bootstrap.h"
#include "comm/elastic/membership_policy.h"
#include "comm/elastic/wire.h"

namespace {

using namespace lbcc::comm::elastic;

class Output : public PolicyOutput {
 public:
  bool Send(uint64_t, const Message& message, absl::Duration) override {
    absl::StatusOr<Message> again = Decode(Encode(message));
    if (!again.ok()) std::abort();
    return true;
  }
  void Close(uint64_t member) override { closed.push_back(member); }
  absl::StatusOr<lbcc::comm::UniqueId> NewUniqueId() override {
    lbcc::comm::UniqueId id{};  // a well-formed id naming 127.0.0.1:1; nothing listens
    const uint32_t version = 1;
    const uint64_t session = 7;
    std::memcpy(id.internal, "LBID", 4);
    std::memcpy(id.internal + 4, &version, 4);
    std::memcpy(id.internal + 8, &session, 8);
    std::strcpy(id.internal + 16, "127.0.0.1:1");
    return id;
  }
  void SupersedeRoots() override {}
  std::vector<uint64_t> closed;
};

struct Conn {
  uint64_t id = 0;  // 0: not joined
  bool dead = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Output output;
  UnitTable units;
  MembershipPolicy policy(PolicyOptions{"job-1", "fuzz-master", absl::Seconds(1), 2}, &units,
                          &output);
  Conn conns[4];
  absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  size_t at = 0;
  for (int record = 0; at + 5 <= size; ++record) {
    Conn& c = conns[data[at] & 3];
    uint32_t length = 0;
    std::memcpy(&length, data + at + 1, 4);
    at += 5;
    now += absl::Milliseconds(100);
    if (record % 4 == 3) policy.Tick(now);
    for (Conn& other : conns) {
      if (other.id != 0 && !policy.connected(other.id)) other.dead = true;
    }
    if (c.dead) continue;
    if (length > kMaxMemberFrame || length > size - at) {
      if (c.id != 0) policy.Lost(c.id, "frame too large or truncated");
      c.dead = true;
      if (length > size - at) break;
      continue;
    }
    const absl::string_view body(reinterpret_cast<const char*>(data + at), length);
    at += length;
    absl::StatusOr<Message> m = Decode(body);
    if (!m.ok()) {
      if (m.status().code() != absl::StatusCode::kDataLoss) std::abort();
      if (c.id != 0) policy.Lost(c.id, m.status().message());
      c.dead = true;
      continue;
    }
    if (c.id == 0) {
      if (m->type != MsgType::kJoin) {  // the server refuses it before the policy sees it
        c.dead = true;
        continue;
      }
      c.id = policy.Connected("fuzz-peer", now);
    }
    policy.Received(c.id, *m, now);
  }
  policy.Stop();
  return 0;
}
