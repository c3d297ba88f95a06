#include "comm/agreement.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <optional>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "comm/group.h"

namespace lbcc::comm {
namespace internal {
namespace {

using transport::Endpoint;
using transport::Tag;

constexpr uint32_t kMagic = 0x4741424c;  // "LBAG" little-endian
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderBytes = 16;
// Control tags: an operation's tag base has step 0, so op + 1 and op + 2 are its own; the
// standing query receive and the goodbye sit at the top of the tag space, where no operation's
// tags reach (and the control endpoints carry nothing else).
constexpr Tag kVoteStep = 1;
constexpr Tag kReplyStep = 2;
constexpr Tag kQueryTag = ~Tag{0} - 2;
constexpr Tag kByeTag = ~Tag{0} - 1;
constexpr size_t kMaxControlBytes = kHeaderBytes + 4 + kMaxReasonBytes;
// Decisions remembered for peers that ask late; a peer can be at most a few operations behind
// (it takes part in every exchange), so this is ample.
constexpr size_t kRemembered = 1024;

bool IsAbortKind(ControlKind kind) {
  return kind == ControlKind::kVoteAbort || kind == ControlKind::kReplyAborted;
}

std::atomic<bool> fault_hook_set{false};
Mutex fault_mu;
FaultHook* fault_hook ABSL_GUARDED_BY(fault_mu) = nullptr;

}  // namespace

std::string EncodeControl(ControlKind kind, uint64_t op, const absl::Status& reason) {
  std::string out(kHeaderBytes, '\0');
  std::memcpy(out.data(), &kMagic, 4);
  out[4] = static_cast<char>(kVersion);
  out[5] = static_cast<char>(kind);
  std::memcpy(out.data() + 8, &op, 8);
  if (IsAbortKind(kind)) {
    const uint32_t code = static_cast<uint32_t>(reason.code());
    out.append(reinterpret_cast<const char*>(&code), 4);
    const absl::string_view text = reason.message().substr(0, kMaxReasonBytes);
    out.append(text.data(), text.size());
  }
  return out;
}

absl::Status DecodeControl(absl::string_view bytes, ControlMessage* out) {
  if (bytes.size() < kHeaderBytes) {
    return absl::DataLossError(absl::StrCat("control message of ", bytes.size(), " bytes"));
  }
  uint32_t magic = 0;
  std::memcpy(&magic, bytes.data(), 4);
  const uint8_t version = static_cast<uint8_t>(bytes[4]);
  const uint8_t kind = static_cast<uint8_t>(bytes[5]);
  if (magic != kMagic || version != kVersion || bytes[6] != 0 || bytes[7] != 0) {
    return absl::DataLossError("control message: bad magic, version or header");
  }
  if (kind < static_cast<uint8_t>(ControlKind::kVoteCommit) ||
      kind > static_cast<uint8_t>(ControlKind::kReplyUndecided)) {
    return absl::DataLossError(absl::StrCat("control message: unknown kind ", kind));
  }
  out->kind = static_cast<ControlKind>(kind);
  std::memcpy(&out->op, bytes.data() + 8, 8);
  out->reason = absl::OkStatus();
  if (IsAbortKind(out->kind)) {
    if (bytes.size() < kHeaderBytes + 4 || bytes.size() > kMaxControlBytes) {
      return absl::DataLossError("control message: bad abort reason");
    }
    uint32_t code = 0;
    std::memcpy(&code, bytes.data() + kHeaderBytes, 4);
    if (code == 0 || code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
      code = static_cast<uint32_t>(absl::StatusCode::kUnknown);
    }
    out->reason = absl::Status(static_cast<absl::StatusCode>(code),
                               std::string(bytes.substr(kHeaderBytes + 4)));
  } else if (bytes.size() != kHeaderBytes) {
    return absl::DataLossError("control message: trailing bytes");
  }
  return absl::OkStatus();
}

void SetFaultHookForTesting(FaultHook hook) {
  MutexLock lock(&fault_mu);
  delete fault_hook;
  fault_hook = hook ? new FaultHook(std::move(hook)) : nullptr;
  fault_hook_set.store(fault_hook != nullptr);
}

int MaybeFault(const Group& group, FaultPoint point) {
  if (!fault_hook_set.load(std::memory_order_relaxed)) return -1;
  FaultHook hook;
  {
    MutexLock lock(&fault_mu);
    if (fault_hook == nullptr) return -1;
    hook = *fault_hook;
  }
  return hook(group, point);
}

// One operation on this rank, as the board remembers it.
struct Entry {
  enum Phase { kVoted, kCommitted, kAborted };
  Phase phase = kVoted;
  bool frozen = false;  // a peer asked while undecided: only the query round decides now
  absl::Status reason;  // kAborted: why
};

// One round of messages to and from every peer (votes, or queries and replies).
struct VoteAgreement::Round {
  explicit Round(int nranks) : buffers(nranks), received(nranks), failure(nranks) {}
  std::string mine;                            // what this rank sends (lives with the round)
  std::vector<std::string> buffers;            // per global rank
  std::vector<std::optional<ControlMessage>> received;
  std::vector<absl::Status> failure;           // per peer: why nothing was received
  int receives_pending = 0;
  int sends_pending = 0;
  int first_abort = -1;      // a peer that voted or answered abort
  int first_committed = -1;  // a peer that answered committed
  uint64_t op = 0;
};

struct VoteAgreement::State {
  int rank = 0;
  std::vector<Endpoint*> out, in;
  absl::Duration grace;

  Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  std::unordered_map<uint64_t, Entry> board ABSL_GUARDED_BY(mu);
  std::deque<uint64_t> order ABSL_GUARDED_BY(mu);  // insertion order, for forgetting
  std::vector<std::string> query_buffers;         // one standing receive per peer
  // Until when a peer may still ask about an operation this rank decided: its deadline (a peer
  // waits that long for a vote) plus the two rounds' grace. Linger() waits no longer.
  absl::Time askable_until ABSL_GUARDED_BY(mu) = absl::InfinitePast();

  bool FrozenLocked(uint64_t op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = board.find(op);
    return it == board.end() || it->second.frozen;
  }
  // Records this rank's decision; returns what Decide() returns.
  absl::Status DecideLocked(uint64_t op, absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Entry& entry = board[op];
    entry.phase = why.ok() ? Entry::kCommitted : Entry::kAborted;
    entry.reason = why;
    return why;
  }

  void RememberLocked(uint64_t op, Entry entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    board[op] = std::move(entry);
    order.push_back(op);
    while (order.size() > kRemembered) {
      auto it = board.find(order.front());
      if (it != board.end() && it->second.phase == Entry::kVoted) break;  // still deciding
      if (it != board.end()) board.erase(it);
      order.pop_front();
    }
  }
};

namespace {

using StatePtr = std::shared_ptr<VoteAgreement::State>;

}  // namespace

VoteAgreement::VoteAgreement(int rank, std::vector<Endpoint*> out, std::vector<Endpoint*> in,
                             absl::Duration grace)
    : state_(std::make_shared<State>()) {
  state_->rank = rank;
  state_->out = std::move(out);
  state_->in = std::move(in);
  state_->grace = grace;
  state_->query_buffers.resize(state_->in.size());
}

VoteAgreement::~VoteAgreement() { Stop(); }

size_t VoteAgreement::RememberedForTesting() const {
  MutexLock lock(&state_->mu);
  return state_->board.size();
}

namespace {

// Answers a peer's query about `op` (its decision, or Undecided, after which this rank no
// longer commits on its own), then waits for the next query.
void PostQueryReceive(const StatePtr& state, int peer);

void Answer(const StatePtr& state, int peer, uint64_t op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
  auto it = state->board.find(op);
  if (it == state->board.end()) {
    // Not voted yet (or never will): this rank now refuses to vote commit on it.
    Entry tombstone;
    tombstone.phase = Entry::kAborted;
    tombstone.reason = absl::UnavailableError(
        absl::StrCat("rank ", state->rank, " had not voted when rank ", peer,
                     " asked; it gave up on the step"));
    state->RememberLocked(op, tombstone);
    it = state->board.find(op);
  }
  Entry& entry = it->second;
  ControlKind kind = ControlKind::kReplyUndecided;
  if (entry.phase == Entry::kVoted) {
    entry.frozen = true;
  } else {
    kind = entry.phase == Entry::kCommitted ? ControlKind::kReplyCommitted
                                            : ControlKind::kReplyAborted;
  }
  auto reply = std::make_shared<std::string>(EncodeControl(kind, op, entry.reason));
  Endpoint* out = state->out[peer];
  const Tag tag = op + kReplyStep;
  out->Send(tag, absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(reply->data()),
                                           reply->size()),
            {transport::Priority::kHigh, /*control=*/true},
            [state, reply, peer, tag](absl::Status) {
              MutexLock lock(&state->mu);
              if (!state->stopped) state->out[peer]->ReleaseTags(tag, tag + 1);
            });
}

void PostQueryReceive(const StatePtr& state, int peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
  std::string* buffer = &state->query_buffers[peer];
  state->in[peer]->Recv(
      kQueryTag,
      [buffer](size_t size) -> absl::StatusOr<absl::Span<uint8_t>> {
        if (size > kMaxControlBytes) return absl::DataLossError("oversized control message");
        buffer->resize(size);
        return absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(buffer->data()), size);
      },
      [state, peer, buffer](absl::StatusOr<size_t> n) {
        MutexLock lock(&state->mu);
        if (state->stopped) return;
        if (!n.ok() && !absl::IsDataLoss(n.status())) return;  // the link is gone
        ControlMessage message;
        if (n.ok() && DecodeControl(*buffer, &message).ok() &&
            message.kind == ControlKind::kQuery) {
          Answer(state, peer, message.op);
        } else {
          LBCC_LOG(WARN) << "comm: rank " << state->rank << " ignores a malformed query from rank "
                         << peer;
        }
        PostQueryReceive(state, peer);
      });
}

}  // namespace

void VoteAgreement::Start() {
  MutexLock lock(&state_->mu);
  for (size_t peer = 0; peer < state_->in.size(); ++peer) {
    if (state_->in[peer] != nullptr) PostQueryReceive(state_, static_cast<int>(peer));
  }
}

void VoteAgreement::Stop() {
  MutexLock lock(&state_->mu);
  state_->stopped = true;
}

namespace {

using RoundPtr = std::shared_ptr<VoteAgreement::Round>;

// Sends round->mine to `peers` on `send_tag` and receives one message about operation `op` from
// each of `from` on `tag`. Completions land in `round` under state->mu.
void PostRound(const StatePtr& state, const RoundPtr& round, Tag send_tag, Tag tag, uint64_t op,
               const std::vector<int>& peers, const std::vector<int>& from) {
  {
    MutexLock lock(&state->mu);
    round->sends_pending += static_cast<int>(peers.size());
    round->receives_pending += static_cast<int>(from.size());
  }
  const absl::Span<const uint8_t> mine(reinterpret_cast<const uint8_t*>(round->mine.data()),
                                       round->mine.size());
  for (int peer : peers) {
    state->out[peer]->Send(send_tag, mine, {transport::Priority::kHigh, /*control=*/true},
                           // A lost vote or query is the receiver's missing message.
                           [state, round, peer, send_tag](absl::Status) {
                             MutexLock lock(&state->mu);
                             --round->sends_pending;
                             if (!state->stopped && send_tag != kQueryTag) {
                               state->out[peer]->ReleaseTags(send_tag, send_tag + 1);
                             }
                           });
  }
  for (int peer : from) {
    std::string* buffer = &round->buffers[peer];
    state->in[peer]->Recv(
        tag,
        [buffer](size_t size) -> absl::StatusOr<absl::Span<uint8_t>> {
          if (size > kMaxControlBytes) return absl::DataLossError("oversized control message");
          buffer->resize(size);
          return absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(buffer->data()), size);
        },
        [state, round, peer, tag, op, buffer](absl::StatusOr<size_t> n) {
          MutexLock lock(&state->mu);
          --round->receives_pending;
          if (!state->stopped) state->in[peer]->ReleaseTags(tag, tag + 1);
          ControlMessage message;
          absl::Status status = n.status();
          if (status.ok()) status = DecodeControl(*buffer, &message);
          if (status.ok() && message.op != op) {
            status = absl::DataLossError("control message for another operation");
          }
          if (!status.ok()) {
            round->failure[peer] = Annotate(status, absl::StrCat("rank ", peer));
          } else {
            if (IsAbortKind(message.kind) && round->first_abort < 0) round->first_abort = peer;
            if (message.kind == ControlKind::kReplyCommitted && round->first_committed < 0) {
              round->first_committed = peer;
            }
            round->received[peer] = std::move(message);
          }
              });
  }
}

absl::Status AbortedBy(const VoteAgreement::Round& round, int peer) {
  const absl::Status& reason = round.received[peer]->reason;
  // A peer that timed out stays a timeout; any other reason is a step this rank lost to a peer.
  return absl::Status(absl::IsDeadlineExceeded(reason) ? absl::StatusCode::kDeadlineExceeded
                                                        : absl::StatusCode::kUnavailable,
                      absl::StrCat("rank ", peer,
                                             " could not complete the step, aborted on every "
                                             "surviving rank: ",
                                             reason.ToString()));
}


absl::Status DecideOn(const StatePtr& state, const Group& group, uint64_t op_seq,
                      absl::Status local, absl::Time deadline, const std::vector<int>& peers,
                      RoundPtr* votes_out, RoundPtr* queries_out);

// The first rank an error message names ("receive from rank 3: ...", "rank 1 could not
// complete the step: ...", "no answer from ranks 0, 2"), or -1.
int FirstRankNamed(absl::string_view message) {
  for (size_t at = message.find("rank"); at != absl::string_view::npos;
       at = message.find("rank", at + 4)) {
    size_t digits = at + 4;
    if (digits < message.size() && message[digits] == 's') ++digits;
    if (digits >= message.size() || message[digits] != ' ') continue;
    ++digits;
    int rank = -1;
    for (size_t i = digits; i < message.size() && message[i] >= '0' && message[i] <= '9'; ++i) {
      rank = (rank < 0 ? 0 : rank * 10) + (message[i] - '0');
      if (rank > (1 << 20)) break;
    }
    if (rank >= 0) return rank;
  }
  return -1;
}

// Why `peer` aborted, as its abort vote or its answer to this rank's query said; null if it said
// neither.
const absl::Status* AbortReason(const StatePtr& state, const VoteAgreement::Round& votes,
                                const VoteAgreement::Round* queries, int peer)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
  for (const VoteAgreement::Round* round : {&votes, queries}) {
    if (round != nullptr && round->received[peer].has_value() &&
        IsAbortKind(round->received[peer]->kind)) {
      return &round->received[peer]->reason;
    }
  }
  return nullptr;
}

// A peer that sent anything (a vote, an answer) is alive.
bool Alive(const StatePtr& state, const VoteAgreement::Round& votes,
           const VoteAgreement::Round* queries, int peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
  return votes.received[peer].has_value() ||
         (queries != nullptr && queries->received[peer].has_value());
}

// Why nothing came from `peer` (its vote's or its answer's failure); null if nothing failed.
const absl::Status* RoundFailure(const StatePtr& state, const VoteAgreement::Round& votes,
                                 const VoteAgreement::Round* queries, int peer)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
  for (const VoteAgreement::Round* round : {&votes, queries}) {
    if (round != nullptr && !round->failure[peer].ok()) return &round->failure[peer];
  }
  return nullptr;
}

// Follows the blame from `blamed` (-1: none) through the aborted peers' reasons, each naming whom
// that peer lost, into *chain; returns the origin, or -1 where the blame names nobody further.
int FollowBlame(const StatePtr& state, const VoteAgreement::Round& votes,
                const VoteAgreement::Round* queries, const std::vector<int>& peers, int blamed,
                std::vector<int>* chain) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
  auto is_peer = [&](int rank) {
    return std::find(peers.begin(), peers.end(), rank) != peers.end();
  };
  if (blamed >= 0) chain->push_back(blamed);
  while (!chain->empty()) {
    const int at = chain->back();
    const absl::Status* reason = AbortReason(state, votes, queries, at);
    const bool alive = Alive(state, votes, queries, at);
    if (!alive || reason == nullptr) {
      // Silent (lost), or alive without a reason: a rank whose links failed after its commit
      // vote is the origin only at the end of someone's blame.
      if (!alive || chain->size() > 1) return at;
      return -1;
    }
    const int next = FirstRankNamed(reason->message());
    if (!is_peer(next) || std::find(chain->begin(), chain->end(), next) != chain->end()) break;
    chain->push_back(next);
  }
  return -1;
}

// The message that names `origin` first and quotes the blame `chain`.
std::string DescribeOrigin(const StatePtr& state, const VoteAgreement::Round& votes,
                           const VoteAgreement::Round* queries, int origin, int blamed,
                           const std::vector<int>& chain) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
  const absl::Status* lost_because = RoundFailure(state, votes, queries, origin);
  std::string text = absl::StrCat("rank ", origin);
  if (lost_because != nullptr) {
    absl::StrAppend(&text, " is lost (nothing from it: ", lost_because->message(), ")");
  } else if (!Alive(state, votes, queries, origin)) {
    absl::StrAppend(&text, " did not vote in time");
  } else {
    absl::StrAppend(&text, " voted commit, then its connections failed");
  }
  absl::StrAppend(&text, "; every survivor aborts the step.",
                  chain.size() > 1 ? " Blame as the voters gave it: " : "");
  for (size_t k = 0; k + 1 < chain.size(); ++k) {
    absl::StrAppend(&text, k == 0 ? "" : ", ", "rank ", chain[k], " (alive) ",
                    AbortReason(state, votes, queries, chain[k]) != nullptr ? "lost"
                                                                            : "did not blame",
                    " rank ", chain[k + 1]);
  }
  const absl::Status* blamed_reason =
      blamed >= 0 ? AbortReason(state, votes, queries, blamed) : nullptr;
  if (blamed_reason != nullptr) {
    absl::StrAppend(&text, "; rank ", blamed, "'s reason: ", blamed_reason->ToString());
  }
  return text;
}

// A rank that aborts because its own peer died closes its data connections without saying why,
// so its neighbours' errors blame it although it lives. A rank that took part in the vote is
// alive: when `why` blames a peer that voted abort, follow the blame through the voters'
// reasons (each names whom that voter lost) to its origin, a rank that did not vote, or voted
// commit and then lost its links; without a blamed peer, a peer whose vote or answer failed.
// Name that rank first and quote the chain. Waits for the blamed peer's vote and then for the
// rest, until `until` at most; `why` unchanged when it already names the origin, or the origin
// cannot be told.
absl::Status NameTheLost(const StatePtr& state, const VoteAgreement::Round& votes,
                         const VoteAgreement::Round* queries, const std::vector<int>& peers,
                         absl::Status why, absl::Time until) {
  if (why.ok() || !(absl::IsUnavailable(why) || absl::IsDeadlineExceeded(why) ||
                    absl::IsCancelled(why))) {
    return why;
  }
  auto is_peer = [&](int rank) {
    return std::find(peers.begin(), peers.end(), rank) != peers.end();
  };
  // The peer `why` blames, or -1 (it names nobody, or this rank).
  const int blamed = is_peer(FirstRankNamed(why.message())) ? FirstRankNamed(why.message()) : -1;
  MutexLock lock(&state->mu);
  auto settled = [&](int peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
    return votes.received[peer].has_value() || !votes.failure[peer].ok();
  };
  if (blamed >= 0 && (!state->mu.AwaitWithDeadline(
                          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
                            return settled(blamed) || state->stopped;
                          },
                          until) ||
                      !Alive(state, votes, queries, blamed))) {
    return why;  // the blamed peer said nothing: it is the origin as far as this rank can tell
  }
  state->mu.AwaitWithDeadline([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
    return (votes.receives_pending == 0 && (queries == nullptr || queries->receives_pending == 0)) ||
           state->stopped;
  }, until);
  // Follow the blame: an aborted peer's reason names whom it lost.
  std::vector<int> chain;
  int origin = FollowBlame(state, votes, queries, peers, blamed, &chain);
  if (origin < 0) {
    // The blame names nobody further: a peer whose vote or answer failed, if any.
    for (int peer : peers) {
      if (RoundFailure(state, votes, queries, peer) != nullptr) {
        origin = peer;
        break;
      }
    }
    if (origin < 0) return why;
    if (!chain.empty()) chain.push_back(origin);
  }
  if (origin == blamed) return why;
  absl::Status named(why.code(),
                     absl::StrCat(DescribeOrigin(state, votes, queries, origin, blamed, chain),
                                  "; this rank saw: ", why.message()));
  auto it = state->board.find(votes.op);
  if (it != state->board.end() && it->second.phase == Entry::kAborted) {
    it->second.reason = named;  // what a peer that asks later hears
  }
  return named;
}

}  // namespace

absl::Status VoteAgreement::Decide(const Group& group, uint64_t op_seq, absl::Status local,
                                   absl::Time deadline) {
  if (group.size() <= 1) return local;
  std::vector<int> peers;
  for (int r = 0; r < group.size(); ++r) {
    if (r != group.me) peers.push_back(group.ranks[r]);
  }
  RoundPtr votes, queries;
  absl::Status result =
      DecideOn(state_, group, op_seq, std::move(local), deadline, peers, &votes, &queries);
  if (result.ok() || votes == nullptr) return result;
  // At most one grace period more, and only on a failure: the live peers' votes come at once,
  // only a frozen or cut-off peer's never do.
  return NameTheLost(state_, *votes, queries.get(), peers, std::move(result),
                     absl::Now() + state_->grace);
}

namespace {

// This rank's vote on `op_seq`: the status it votes with (`local`, or why it must abort), and
// whether that is a commit vote (recorded on the board either way). Cancelled with `closed` set
// when the control connections are closed (nothing voted).
struct OwnVote {
  absl::Status result;
  bool commit = false;
  bool closed = false;
};
OwnVote ChooseVote(const StatePtr& state, uint64_t op_seq, absl::Status local,
                   absl::Time deadline) {
  OwnVote vote;
  vote.result = local;
  MutexLock lock(&state->mu);
  if (state->stopped) {
    vote.closed = true;
    vote.result = local.ok() ? absl::CancelledError("agreement: the control connections are closed")
                             : local;
    return vote;
  }
  state->askable_until =
      std::max(state->askable_until, std::max(deadline, absl::Now()) + 2 * state->grace);
  if (vote.result.ok() && absl::Now() > deadline) {
    // Late (this rank was frozen or starved): the peers may have given up on its vote already,
    // and abort is the one vote that agrees with whatever they decided without it.
    vote.result = absl::DeadlineExceededError(
        absl::StrCat("rank ", state->rank, " reached its vote after the deadline"));
  }
  auto it = state->board.find(op_seq);
  if (!vote.result.ok() && it == state->board.end()) {
    Entry entry;
    entry.phase = Entry::kAborted;
    entry.reason = vote.result;
    state->RememberLocked(op_seq, entry);
  } else if (it != state->board.end()) {
    // A peer asked before this rank got here: it promised not to vote commit.
    if (vote.result.ok()) vote.result = it->second.reason;
  } else {
    state->RememberLocked(op_seq, Entry());  // voted commit
    vote.commit = true;
  }
  return vote;
}

// Sends this rank's vote to the peers (fewer where a test's fault hook cuts it short).
void SendVote(const StatePtr& state, const Group& group, const RoundPtr& votes, uint64_t op_seq,
              const OwnVote& vote, const std::vector<int>& peers) {
  votes->mine = EncodeControl(vote.commit ? ControlKind::kVoteCommit : ControlKind::kVoteAbort,
                              op_seq, vote.result);
  const int reach = MaybeFault(group, FaultPoint::kVote);
  std::vector<int> voted_to = peers;
  if (reach >= 0 && reach < static_cast<int>(peers.size())) voted_to.resize(reach);
  PostRound(state, votes, op_seq + kVoteStep, op_seq + kVoteStep, op_seq, voted_to, peers);
  if (fault_hook_set.load(std::memory_order_relaxed)) {
    {
      MutexLock lock(&state->mu);
      state->mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
        return votes->sends_pending == 0;
      });
    }
    MaybeFault(group, FaultPoint::kAfterVote);
  }
}

// Round 1's end for a commit vote: the decision once every vote is in or one is abort; none
// (*missing: the first peer without a vote, or -1 where a peer asked first) when round 2 must
// ask, the op then frozen (commit only if some rank says it committed).
std::optional<absl::Status> AwaitVotes(const StatePtr& state, const RoundPtr& votes,
                                       uint64_t op_seq, absl::Time deadline,
                                       const std::vector<int>& peers, int* missing,
                                       bool* voted_in_time) {
  const absl::Time vote_deadline = std::max(deadline, absl::Now() + state->grace);
  MutexLock lock(&state->mu);
  *voted_in_time = state->mu.AwaitWithDeadline(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
        return votes->receives_pending == 0 || votes->first_abort >= 0 ||
               state->FrozenLocked(op_seq) || state->stopped;
      },
      vote_deadline);
  if (votes->first_abort >= 0) {
    return state->DecideLocked(op_seq, AbortedBy(*votes, votes->first_abort));
  }
  for (int peer : peers) {
    if (!votes->received[peer].has_value() && *missing < 0) *missing = peer;
  }
  if (*missing < 0 && !state->FrozenLocked(op_seq) && !state->stopped) {
    return state->DecideLocked(op_seq, absl::OkStatus());
  }
  if (state->stopped) {
    return state->DecideLocked(
        op_seq, absl::CancelledError("agreement: the control connections are closed"));
  }
  // A vote is missing (or a peer asked first): from now on this rank commits only if some
  // rank says it committed.
  state->board[op_seq].frozen = true;
  return std::nullopt;
}

// Why this rank aborts when nobody reachable committed (docs/agreement.md says why not commit).
absl::Status NoCommitReason(const VoteAgreement::Round& votes, int missing, bool voted_in_time) {
  if (missing < 0) {
    return absl::UnavailableError(
        "a peer asked before every vote was in and no reachable rank committed");
  }
  if (!votes.failure[missing].ok()) {
    return absl::Status(absl::IsDeadlineExceeded(votes.failure[missing])
                            ? absl::StatusCode::kDeadlineExceeded
                            : absl::StatusCode::kUnavailable,
                        absl::StrCat("no vote from ", votes.failure[missing].message(),
                                     "; no reachable rank committed, so every survivor aborts"));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "rank ", missing, voted_in_time ? " had not voted when this rank asked" :
                                        " did not vote before the deadline",
      "; no reachable rank committed, so every survivor aborts"));
}

// Round 2: asks every peer what it decided; commits if one committed, else aborts.
absl::Status AskPeers(const StatePtr& state, const RoundPtr& votes, uint64_t op_seq,
                      const std::vector<int>& peers, int missing, bool voted_in_time,
                      RoundPtr* queries_out) {
  auto queries = std::make_shared<VoteAgreement::Round>(static_cast<int>(state->out.size()));
  queries->mine = EncodeControl(ControlKind::kQuery, op_seq, absl::OkStatus());
  queries->op = op_seq;
  *queries_out = queries;
  PostRound(state, queries, kQueryTag, op_seq + kReplyStep, op_seq, peers, peers);
  MutexLock lock(&state->mu);
  state->mu.AwaitWithDeadline(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
        return queries->receives_pending == 0 || queries->first_committed >= 0 ||
               queries->first_abort >= 0 || votes->first_abort >= 0 || state->stopped;
      },
      absl::Now() + state->grace);
  if (queries->first_committed >= 0) return state->DecideLocked(op_seq, absl::OkStatus());
  if (queries->first_abort >= 0) {
    return state->DecideLocked(op_seq, AbortedBy(*queries, queries->first_abort));
  }
  if (votes->first_abort >= 0) {
    return state->DecideLocked(op_seq, AbortedBy(*votes, votes->first_abort));
  }
  return state->DecideLocked(op_seq, NoCommitReason(*votes, missing, voted_in_time));
}

absl::Status DecideOn(const StatePtr& state, const Group& group, uint64_t op_seq,
                      absl::Status local, absl::Time deadline, const std::vector<int>& peers,
                      RoundPtr* votes_out, RoundPtr* queries_out) {
  // Round 1: the vote.
  auto votes = std::make_shared<VoteAgreement::Round>(static_cast<int>(state->out.size()));
  votes->op = op_seq;
  *votes_out = votes;
  const OwnVote vote = ChooseVote(state, op_seq, std::move(local), deadline);
  if (vote.closed) return vote.result;
  SendVote(state, group, votes, op_seq, vote, peers);
  // An abort vote decides at once: nobody can commit without this rank's commit vote.
  if (!vote.commit) return vote.result;
  int missing = -1;
  bool voted_in_time = true;
  std::optional<absl::Status> decided =
      AwaitVotes(state, votes, op_seq, deadline, peers, &missing, &voted_in_time);
  if (decided.has_value()) return *std::move(decided);
  // Round 2: ask every peer.
  return AskPeers(state, votes, op_seq, peers, missing, voted_in_time, queries_out);
}

}  // namespace

absl::Status VoteAgreement::Linger(absl::Time deadline) {
  const StatePtr& state = state_;
  std::vector<int> peers;
  for (size_t r = 0; r < state->out.size(); ++r) {
    if (state->out[r] != nullptr && state->in[r] != nullptr) peers.push_back(static_cast<int>(r));
  }
  if (peers.empty()) return absl::OkStatus();
  {
    // Nobody can still be deciding anything with this rank's help: no need to wait for them.
    MutexLock lock(&state->mu);
    deadline = std::min(deadline, state->askable_until);
    if (deadline <= absl::Now()) return absl::OkStatus();
  }
  auto byes = std::make_shared<Round>(static_cast<int>(state->out.size()));
  byes->mine = EncodeControl(ControlKind::kReplyUndecided, 0, absl::OkStatus());
  {
    MutexLock lock(&state->mu);
    if (state->stopped) return absl::CancelledError("agreement stopped");
  }
  PostRound(state, byes, kByeTag, kByeTag, 0, peers, peers);
  MutexLock lock(&state->mu);
  if (!state->mu.AwaitWithDeadline(
          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
            return (byes->receives_pending == 0 && byes->sends_pending == 0) || state->stopped;
          },
          deadline)) {
    return absl::DeadlineExceededError("agreement: a peer did not say goodbye in time");
  }
  for (int peer : peers) {
    if (!byes->failure[peer].ok()) return byes->failure[peer];
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace lbcc::comm
