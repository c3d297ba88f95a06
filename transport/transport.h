// Transport and Endpoint: LBCC's byte mover between ranks. It knows nothing of codecs.
//
// A Transport owns a progress engine (a UCX worker, or an in-process wire for tests) and makes
// Endpoints: Listen() publishes an address string, Connect(address) and Accept() return a
// connected Endpoint. An Endpoint carries tagged messages both ways:
//
//   transport->Listen("10.77.0.2:0")                    -> "10.77.0.2:41234"
//   peer->Connect("10.77.0.2:41234", absl::Seconds(10)) -> Endpoint (client side)
//   transport->Accept(absl::Seconds(10))                -> Endpoint (server side)
//   endpoint->Send(tag, bytes, {Priority::kHigh}, [](absl::Status s) { ... });
//   endpoint->Recv(tag, buffer, [](absl::StatusOr<size_t> n) { ... });
//
// Every Endpoint is kFast or kSlow (see LinkClass). Slow endpoints send through a scheduler
// (chunks, priority classes, optional pacing and striping over several connections); fast ones
// hand whole messages to the backend.
//
// Implementations: NewLoopbackTransport() (transport/loopback.h, in-process, for tests of
// everything above the transport) and NewUcxTransport() (transport/ucx_transport.h).
//
// Completion contract (every backend; tested in transport_test.cc):
//   - each callback runs exactly once, on a transport-owned thread, never inside the call that
//     started the operation (not even when that call fails at once);
//   - callbacks of one Transport run one at a time, in completion order; they may start new
//     operations but must not block (no Wait on another completion, no Connect/Accept);
//   - Close() fails every pending operation with Cancelled; a lost peer fails them with
//     Unavailable (and the Endpoint is then unusable: make a new one).
//
// Thread-safety: Transport and Endpoint methods may be called from any thread concurrently.
// Endpoints stay safe to call after their Transport is destroyed: every operation then fails with
// Cancelled.
#ifndef LBCC_TRANSPORT_TRANSPORT_H_
#define LBCC_TRANSPORT_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace lbcc::transport {

// Slow links (hundreds of Mbit/s) get a scheduler; fast links (NVLink, InfiniBand, data-centre
// Ethernet) bypass it. The class of a link comes from configuration (LBCC_LINK_CLASS,
// LBCC_LINK_RULES_FILE, ConnectOptions) or from a timed probe at connect time compared against
// LBCC_SLOW_LINK_GBITS.
enum class LinkClass : uint8_t { kFast = 0, kSlow = 1 };
absl::string_view LinkClassName(LinkClass link_class);

// On a slow link, chunks of higher-priority messages leave before chunks of lower-priority ones
// that were queued earlier: pipeline activations and their gradients (kHigh) overtake bulk
// data-parallel synchronisation (kBulk). Fast links ignore priorities.
enum class Priority : uint8_t { kHigh = 0, kNormal = 1, kBulk = 2 };
inline constexpr int kNumPriorities = 3;
absl::string_view PriorityName(Priority priority);

// Messages are matched by tag: the k-th Recv posted for tag t on an Endpoint receives the k-th
// message the peer sent with tag t on that Endpoint, whatever the priorities and sizes.
using Tag = uint64_t;

struct SendOptions {
  Priority priority = Priority::kNormal;
  // A collective's own small control message (an operation header, a vote): a slow link's bulk
  // does not yield to it (SchedulerOptions::bulk_yield), since the collective's bulk is what
  // waits for it anyway. Every other non-bulk message makes bulk yield.
  bool control = false;
};

// OK once the payload was handed to the peer's transport and the caller's buffer may be reused.
using SendCallback = absl::AnyInvocable<void(absl::Status)>;
// The message length on success.
using RecvCallback = absl::AnyInvocable<void(absl::StatusOr<size_t>)>;
// Called once with the length of the matched message before any of its bytes are placed; returns
// where to put them (at least `size` bytes; must stay valid until the RecvCallback runs) or an
// error, which fails the Recv with that status. Runs on a transport thread with the endpoint's
// lock held: it must be quick and must not call into the Endpoint.
using RecvAllocator = absl::AnyInvocable<absl::StatusOr<absl::Span<uint8_t>>(size_t size)>;

// Per-link counters, a snapshot. Rates are bytes over the time during which at least one message
// was in progress in that direction (so an idle link does not dilute them).
struct LinkCounters {
  LinkClass link_class = LinkClass::kFast;
  int stripes = 1;                      // Connections the link sends over.
  double probed_send_bytes_per_second = 0;  // Connect-time probe; 0 when not probed.
  double probed_recv_bytes_per_second = 0;
  double probed_rtt_seconds = 0;
  uint64_t bytes_sent = 0;              // Payload bytes whose send completed.
  uint64_t bytes_received = 0;          // Payload bytes placed in receive buffers.
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t chunks_sent = 0;
  uint64_t chunks_received = 0;
  double send_bytes_per_second = 0;     // Achieved rate while sending.
  double recv_bytes_per_second = 0;     // Achieved rate while receiving.
  uint64_t queued_messages = 0;         // Sends waiting in the slow-link scheduler.
  uint64_t queued_bytes = 0;            // Their bytes not yet handed to a connection.
  uint64_t inflight_bytes = 0;          // Handed to a connection, not yet acknowledged.
  uint64_t max_queued_messages = 0;     // High-water mark of queued_messages.
  uint64_t retries = 0;                 // Connection attempts repeated while setting up.
  uint64_t pacing_waits = 0;            // Times a token bucket held a chunk back.
  double bulk_pace_bytes_per_second = 0;  // Bulk's pace when it last yielded (0: never).
  uint64_t live_tags = 0;               // Per-tag entries held (send and receive side).
  bool authenticated = false;           // Set up with the job secret; every chunk is sealed.
  bool encrypted = false;               // ...and encrypted (LBCC_ENCRYPT).
  uint64_t integrity_failures = 0;      // Sealed chunks that did not verify (the link failed).
};

class Endpoint {
 public:
  virtual ~Endpoint() = default;  // Closes (see Close()).

  // Sends `data` under `tag`. `data` must stay valid until `done` runs. Any size, including 0
  // and many GiB. `done` gets OK, Cancelled (closed before completion), Unavailable (peer or
  // link lost) or InvalidArgument (bad options).
  virtual void Send(Tag tag, absl::Span<const uint8_t> data, SendOptions options,
                    SendCallback done) = 0;

  // Receives the next message for `tag` into `buffer`, which must stay valid until `done` runs.
  // `done` gets the message length, or InvalidArgument when the message does not fit (the
  // message is consumed), Cancelled or Unavailable.
  virtual void Recv(Tag tag, absl::Span<uint8_t> buffer, RecvCallback done) = 0;

  // Like Recv above, but the buffer is chosen by `allocate` once the message size is known.
  virtual void Recv(Tag tag, RecvAllocator allocate, RecvCallback done) = 0;

  // Forgets the per-tag matching state of tags in [first, last): call it once no Send or Recv
  // on those tags is pending or will come (a collective that completed on this rank), so that
  // a long job's memory does not grow with every operation. A tag still in use (a posted
  // receive, a message not yet received) keeps its state. Thread-safe; never blocks.
  virtual void ReleaseTags(Tag first, Tag last) {
    (void)first;
    (void)last;
  }

  // Fails every pending Send and Recv with Cancelled (their callbacks follow, on a transport
  // thread, once the backend no longer touches their buffers) and disconnects; the peer's pending
  // operations fail with Unavailable. Idempotent; does not block on the network. Later calls
  // fail with Cancelled.
  virtual void Close() = 0;

  virtual LinkClass link_class() const = 0;
  virtual LinkCounters counters() const = 0;
  // The peer's address as the transport knows it ("10.77.0.3:41234", "loop:name#2").
  virtual std::string peer_address() const = 0;
};

struct ConnectOptions {
  // Explicit link class; unset: LBCC_LINK_RULES_FILE, then LBCC_LINK_CLASS, then the probe.
  bool has_link_class = false;
  LinkClass link_class = LinkClass::kFast;
};

class Transport {
 public:
  virtual ~Transport() = default;  // Closes every Endpoint it made (pending work: Cancelled).

  // Starts accepting connections at `address` (backend syntax: "ip:port" for UCX, port 0 picks a
  // free port; a name for loopback). Returns the address peers pass to Connect(). Errors:
  // InvalidArgument (bad address), FailedPrecondition (already listening), Unavailable
  // (address in use or not local).
  virtual absl::StatusOr<std::string> Listen(absl::string_view address) = 0;

  // Connects to a listening peer and classifies the link. Blocks up to `timeout`: must not be
  // called from a completion callback. Errors: InvalidArgument (bad address), DeadlineExceeded,
  // Unavailable (refused or lost during the handshake), Cancelled (transport shut down).
  virtual absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address,
                                                            absl::Duration timeout,
                                                            ConnectOptions options = {}) = 0;

  // The next connection made to Listen()'s address, fully set up. Blocks up to `timeout`.
  // Errors: FailedPrecondition (not listening), DeadlineExceeded, Cancelled.
  virtual absl::StatusOr<std::unique_ptr<Endpoint>> Accept(absl::Duration timeout) = 0;

  // Shuts the transport down without destroying it: Connect() and Accept() calls blocked in it
  // now, on any thread, return Cancelled promptly (they need not reach their timeout), later
  // calls fail with Cancelled, the listener stops and every Endpoint it made is closed (pending
  // work: Cancelled). For owners that must stop threads blocked in Connect/Accept before they
  // destroy the transport. Idempotent; the destructor calls it. May block briefly (the UCX
  // backend waits up to a few seconds for UCX to finish cancelled requests).
  virtual void Shutdown() = 0;

  // "ucx" or "loopback".
  virtual absl::string_view backend() const = 0;
};

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_TRANSPORT_H_
