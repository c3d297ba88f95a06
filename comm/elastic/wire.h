// The elastic membership protocol between ElasticGroup members and the ElasticMaster
// (comm/elastic/elastic.h): framed messages over one TCP connection per member, and the
// settings both ends share. Internal to comm/elastic/.
//
// Frame: u32 length, then the body: u32 magic "LBEM", u8 version, u8 type, fields (u64/u32/u8
// little-endian, strings as u32 length + bytes). Decoders reject unknown magic, versions, types
// and truncated bodies with DataLoss (the bytes come from the network). Frame sizes are bounded
// per direction: kMaxFrame from the master (an epoch lists every member), kMaxMemberFrame from
// a member (the master faces whoever can reach it).
//
// Thread-safety: a Socket may be written by several threads under its own mutex; one thread
// reads it. Shutdown() may be called from any thread and makes a blocked reader return.
#ifndef LBCC_COMM_ELASTIC_WIRE_H_
#define LBCC_COMM_ELASTIC_WIRE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/mutex.h"

namespace lbcc::comm::elastic {

enum class MsgType : uint8_t {
  kJoin = 1,         // member -> master
  kWelcome = 2,      // master -> member: accepted, waiting for an epoch
  kRefuse = 3,       // master -> member: code + message; the connection closes
  kEpoch = 4,        // master -> members: a new epoch
  kReport = 5,       // member -> master: a phase's local outcome
  kDecision = 6,     // master -> members: commit or abort of a phase
  kHeartbeat = 7,    // both ways
  kLeave = 8,        // member -> master
  kSetupFailed = 9,  // member -> master: the epoch's communicator could not be built
  kEvicted = 10,     // master -> member: dropped (silent too long)
  kEnter = 11,       // member -> master: it adopted this epoch (did not take part in older ones)
};

// kForward: members whose exchange of a step failed receive its result from one that
// committed it (docs/elastic.md, "Deciding off the critical path").
enum class Phase : uint8_t { kSync = 1, kStep = 2, kForward = 3 };

struct Message {
  MsgType type = MsgType::kHeartbeat;
  // kJoin
  std::string job_id, name;
  int64_t state_step = -1;
  // kJoin: stage `stage` of pipeline replica `replica`, which has `replica_stages` stages
  // (0: not a pipeline stage). kEvicted: `replica_left`, its pipeline replica left.
  std::string replica;
  uint32_t stage = 0, replica_stages = 0;
  bool replica_left = false;
  // kWelcome / kEpoch / kReport / kDecision / kSetupFailed
  uint64_t member_id = 0;
  uint64_t epoch = 0;
  uint64_t step = 0;
  uint64_t peer_timeout_ms = 0;
  // kEpoch
  uint32_t rank = 0, nranks = 0;
  std::string unique_id;              // kUniqueIdBytes
  std::vector<uint32_t> needs_state;  // ranks without the shared state
  std::vector<std::string> names;     // per rank
  // kEpoch: the step whose result forward_source sends to forward_to first (forward set).
  // kDecision: the exchange failed on some members only: they get the result in a new epoch.
  // kEpoch: members only left since parent_epoch: rank r of this epoch was parent_ranks[r]
  // there, and members derive its communicator from that epoch's (Communicator::Subgroup).
  uint64_t parent_epoch = 0;
  std::vector<uint32_t> parent_ranks;
  bool forward = false;
  uint64_t forward_step = 0;
  uint32_t forward_source = 0;
  std::vector<uint32_t> forward_to;
  // kReport / kDecision
  Phase phase = Phase::kStep;
  bool ok = false;      // report: local success; decision: commit
  bool broken = false;  // report: the communicator failed; decision: a new epoch follows
  uint64_t next_epoch = 0;  // decision with `broken`: the epoch that follows
  // kSetupFailed: the rank of that epoch the set-up failed on, plus one (it could not connect
  // to it); 0: not known.
  uint32_t blame = 0;
  // kRefuse: absl::StatusCode; every type: a message (reason, error)
  uint32_t code = 0;
  std::string text;
};

// The peer timeout: `given` when positive, else LBCC_PEER_TIMEOUT_MS (master and members).
absl::StatusOr<absl::Duration> ResolvePeerTimeout(absl::Duration given);

// The largest frame body a member accepts from the master, and the largest the master accepts
// from a member (a join, a report and their texts; member-chosen strings are short).
inline constexpr uint32_t kMaxFrame = 1 << 20;
inline constexpr uint32_t kMaxMemberFrame = 64 << 10;

std::string Encode(const Message& message);
absl::StatusOr<Message> Decode(absl::string_view body);

// The member's side of the join: the master's answer (`answer`, decoded) as the join's outcome.
// OK for kWelcome; a kRefuse as the status the master sent (a code that is not an
// absl::StatusCode other than OK is DataLoss naming it); DataLoss for any other message.
absl::Status JoinAnswerStatus(const Message& answer);

// Cuts frames out of a byte stream that arrives in pieces (the master reads a newcomer's join
// this way, without a thread per connection). Pure: no I/O.
class FrameReader {
 public:
  explicit FrameReader(uint32_t max_body) : max_body_(max_body) {}
  void Append(absl::string_view bytes) { buffer_.append(bytes.data(), bytes.size()); }
  // The next whole frame's body, nullopt while it is incomplete, DataLoss naming the size when
  // the frame announces more than `max_body` bytes (the stream is then unusable).
  absl::StatusOr<std::optional<std::string>> Next();
  size_t buffered() const { return buffer_.size(); }
  // The bytes not cut into a frame yet (the reader is empty afterwards).
  std::string TakeBuffered() { return std::exchange(buffer_, std::string()); }

 private:
  uint32_t max_body_;
  std::string buffer_;
};

// A Socket waits in poll() slices of at most this many ms, so that Shutdown() is noticed
// promptly even where shutdown() does not wake poll.
constexpr int kPollSliceMs = 100;
// The poll() timeout for a wait with `left` to go: 0 when nothing is left, else between 1 and
// kPollSliceMs, never ending before `left` is over for finite waits under kPollSliceMs (an
// infinite `left`, as the readers' Receive(absl::InfiniteFuture()), gives kPollSliceMs).
int PollSliceMs(absl::Duration left);

// An owned TCP socket with framed send/receive.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // Connects to "host:port" (an IPv4 address, an IPv6 one in brackets or a host name),
  // retrying until `deadline` (the master may start later). InvalidArgument naming the address
  // when it does not parse or resolve.
  static absl::StatusOr<std::unique_ptr<Socket>> Connect(absl::string_view address,
                                                         absl::Time deadline);
  // Listens on "host:port" (port 0: any; syntax as Connect); *bound is the address it got
  // ("[fd77::1]:4000" for IPv6).
  static absl::StatusOr<std::unique_ptr<Socket>> Listen(absl::string_view address,
                                                        std::string* bound);
  // The next connection, or DeadlineExceeded at `deadline`, Cancelled after Shutdown().
  absl::StatusOr<std::unique_ptr<Socket>> Accept(absl::Time deadline);
  // A connection that is already pending, or null when none is (never blocks). Unavailable
  // when the listener failed (EMFILE: out of descriptors), Cancelled after Shutdown().
  absl::StatusOr<std::unique_ptr<Socket>> AcceptNow();

  // Thread-safe. Unavailable when the other side is gone or not reading before `deadline`.
  absl::Status Send(const Message& message, absl::Time deadline);
  // One reader. DeadlineExceeded at `deadline`, Unavailable when closed, DataLoss when corrupt
  // or when the frame announces more than `max_body` bytes.
  absl::StatusOr<Message> Receive(absl::Time deadline, uint32_t max_body = kMaxFrame);
  // One reader, never blocks: reads what has arrived (at most `size` bytes) into `data`; 0 when
  // nothing has. Unavailable when the other side closed or the socket failed.
  absl::StatusOr<size_t> ReadSome(char* data, size_t size);
  // Bytes read from the socket elsewhere (a FrameReader's rest) that the next reads return
  // first. The reader's thread only.
  void Unread(std::string bytes) { unread_ = std::move(bytes) + unread_; }
  // The descriptor, for poll() over many sockets; owned by the Socket.
  int fd() const { return fd_; }
  // Wakes a blocked Receive/Accept (they fail) and makes later calls fail. Idempotent.
  void Shutdown();
  std::string peer() const;

 private:
  absl::Status WaitFor(short events, absl::Time deadline);
  absl::Status ReadExactly(char* data, size_t size, absl::Time deadline);

  const int fd_;
  std::string unread_;  // reader only
  Mutex send_mu_;
  std::atomic<bool> shut_{false};
};

}  // namespace lbcc::comm::elastic

#endif  // LBCC_COMM_ELASTIC_WIRE_H_
