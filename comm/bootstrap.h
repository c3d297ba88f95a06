// Bootstrap: how N ranks that know only a unique id find each other, like NCCL's.
//
// One process creates the id (CreateUniqueId): that starts a root, a background thread
// listening on a TCP socket whose address the id carries. Every rank then calls
// BootstrapExchange(id, nranks, rank, blob): it connects to the root, says who it is, and gets
// back every rank's blob (its transport address, host name, ...). The root checks that every
// rank agrees on nranks and the session, that no rank number is taken twice, and answers once
// all ranks have joined. The root exits after answering, or at its deadline.
//
// Launchers without a way to pass an id use a fixed root address instead: rank 0 calls
// StartRoot(address, ...) and every rank calls UniqueIdFromAddress(address). Launchers that
// can pass the id (torch's store, MPI_Bcast) do so: comm/rendezvous.h. Addresses are
// "host:port" with a host name or an IPv4/IPv6 address ("[fd00::1]:29500").
//
// Errors (every call has a deadline; nothing hangs):
//   DeadlineExceeded  a rank never joined (every joined rank is told which ranks are missing),
//                     or the root could not be reached in time;
//   InvalidArgument   bad arguments, a malformed address, or disagreement between ranks
//                     (different nranks, a rank number taken twice, a foreign session);
//   Unavailable       a socket failed mid-exchange;
//   Cancelled         its Cancellation was cancelled (the status passed to Cancel()).
// Thread-safety: all functions are thread-safe; ranks may be threads of one process.
#ifndef LBCC_COMM_BOOTSTRAP_H_
#define LBCC_COMM_BOOTSTRAP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "transport/netif.h"
#include "transport/secure.h"

namespace lbcc::comm {

inline constexpr int kUniqueIdBytes = 128;

// Opaque to callers; bytes are: "LBID", u32 version, u64 session, NUL-terminated "host:port"
// (version 1: at most 111 characters), and in version 2 (LBCC_SECRET_IN_ID) the 32-byte job
// secret in the last 32 bytes (the address then at most 79 characters). An id that carries the
// secret is a credential: whoever has it is a member of the job.
struct UniqueId {
  char internal[kUniqueIdBytes];
};

// A rank whose blob ends with this line asks the root for the address its connection came
// from: in the table every rank gets, that line reads "\n<host>" (the source IP the root saw,
// without port). Behind NAT that is the router's address, not the rank's own
// (comm/fabric.cc's LBCC_REACHABLE=auto). Other blobs are passed through untouched.
inline constexpr absl::string_view kObservedAddressRequest = "\n?observed";

// A rank whose blob ends with this line and a port ("\n?dialback 10.0.0.2:4000": the address it
// listens on) asks the root to dial that port at the address its connection came from, once
// every rank joined (64 at a time, each for at most kDialBackTimeout). In the table
// the line reads "\n1" if a TCP connection opened (the root closes it at once, sending nothing)
// and "\n0" if not: a firewall that refuses or drops inbound connections, or a host other than
// the one the root saw (NAT; the root dials only the address a connection came from). It is
// taken off before kObservedAddressRequest, so a blob may end with both, that one first.
inline constexpr absl::string_view kDialBackRequest = "\n?dialback ";
inline constexpr absl::Duration kDialBackTimeout = absl::Seconds(2);

// The secret a rank's bootstrap connection authenticates with. Resolved (a communicator's
// CommConfig, which read the environment once): `secret`, else the one the id carries. Not
// resolved (the default, for standalone callers): the environment's (LBCC_JOB_SECRET /
// LBCC_JOB_SECRET_FILE), else the id's. None of them: no authentication.
struct BootstrapSecurity {
  bool resolved = false;
  std::optional<transport::JobSecret> secret;
};

// Stops a set-up in flight from another thread: a bootstrap root (CreateUniqueId), a rank's
// bootstrap exchange (BootstrapExchange), a communicator's set-up (FabricOptions::cancel). The
// work registers Hooks (shut a socket down, shut a transport down) while it blocks; Cancel()
// runs them, so whatever the work waits in returns at once, and the work then returns the
// cancellation's status instead of its own error. An elastic epoch superseded while it is being
// set up is cancelled this way (comm/elastic), on the master (its root) and on every member.
// Thread-safe; shared by the canceller and the work (std::shared_ptr).
class Cancellation {
 public:
  Cancellation() = default;
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;

  // Idempotent: the first `why` is kept (an OK or non-Cancelled status becomes Cancelled with
  // its message). Runs every registered hook on this thread, under the cancellation's mutex,
  // before it returns.
  void Cancel(absl::Status why);
  // OK until Cancel(); its status afterwards.
  absl::Status status() const;
  bool cancelled() const { return !status().ok(); }
  // Waits up to `timeout` (a back-off between retries); true when cancelled.
  bool WaitFor(absl::Duration timeout) const;
  // Hooks registered now (tests: the work has let go once this is 0).
  int hooks() const;

  // An action Cancel() runs while the Hook exists: run at once when the cancellation was
  // cancelled already. The destructor unregisters it and waits for a run in progress, so the
  // action may use what the Hook's owner destroys after it (a socket's descriptor: declare the
  // Hook after it). A null cancellation: nothing.
  class Hook {
   public:
    Hook(Cancellation* cancellation, std::function<void()> action);
    ~Hook();
    Hook(const Hook&) = delete;
    Hook& operator=(const Hook&) = delete;

   private:
    Cancellation* cancellation_;
    uint64_t id_ = 0;
  };

 private:
  mutable Mutex mu_;
  absl::Status why_ ABSL_GUARDED_BY(mu_);
  uint64_t next_hook_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::function<void()>> hooks_ ABSL_GUARDED_BY(mu_);
};

// Starts a root listening on `listen_host` (an address, an interface name, or "" for the
// interface transport/netif.h's SelectListenAddress picks; port chosen by the kernel) until
// `timeout` passes, and returns the id that names it. Like ncclGetUniqueId, the root learns
// nranks from the first rank that joins; every later rank must agree. With LBCC_SECRET_IN_ID=1
// and no job secret (`security`'s), the id carries a fresh random one (UniqueIdSecret).
// `cancel` (optional) stops the root early: it closes its listener, tells the ranks that joined
// the cancellation's status, and its thread ends.
absl::StatusOr<UniqueId> CreateUniqueId(absl::string_view listen_host, absl::Duration timeout,
                                        const BootstrapSecurity& security = BootstrapSecurity{},
                                        std::shared_ptr<Cancellation> cancel = nullptr);

// Starts a root on the fixed "host:port" `address` (torchrun/Slurm style) for `nranks` ranks.
// The host is a name or an address (IPv6 in brackets), resolved with getaddrinfo; one that is
// not this host's (a virtual address) is served on every interface. `session` must be the same
// on every rank (e.g. derived from the job id).
absl::Status StartRoot(absl::string_view address, int nranks, uint64_t session,
                       absl::Duration timeout);
absl::StatusOr<UniqueId> UniqueIdFromAddress(absl::string_view address, uint64_t session);

// The "host:port" an id names (for logs).
std::string UniqueIdAddress(const UniqueId& id);

// The job secret an id carries (LBCC_SECRET_IN_ID), if any. Every rank joining from the id
// authenticates its bootstrap connection and its links with it, unless LBCC_JOB_SECRET /
// LBCC_JOB_SECRET_FILE is set: the environment's secret always wins.
std::optional<transport::JobSecret> UniqueIdSecret(const UniqueId& id);

// Where this rank listens for its peers: `listen_host` (LBCC_LISTEN_ADDR: an address or an
// interface name) if not empty, else the interface that routes to the id's root, chosen with
// LBCC_SOCKET_IFNAME (transport/netif.h). InvalidArgument naming a value that matches nothing.
absl::StatusOr<transport::NetChoice> ChooseListenAddress(const UniqueId& id,
                                                         absl::string_view listen_host);

// After the exchange: InvalidArgument naming the rank, and the fix, when a rank advertises a
// loopback address while another rank is on a different host (it could never be reached).
absl::Status CheckAdvertisedAddresses(const std::vector<std::string>& hostnames,
                                      const std::vector<std::string>& addresses);

// Joins the job as `rank` of `nranks` and returns every rank's blob, in rank order. Retries the
// connection until `timeout` (the root may start after this rank). `cancel` (optional, must
// outlive the call): once cancelled, the call returns its status promptly.
absl::StatusOr<std::vector<std::string>> BootstrapExchange(
    const UniqueId& id, int nranks, int rank, absl::string_view blob, absl::Duration timeout,
    const BootstrapSecurity& security = BootstrapSecurity{}, Cancellation* cancel = nullptr);

// The pure decoders of the bytes a bootstrap socket carries, for tests and fuzzers
// (comm/bootstrap_fuzz.cc, comm/unique_id_fuzz.cc); the functions above do the I/O around them.
namespace internal {

// A rank's hello as the root reads it: u32 magic, u64 session, u32 nranks, u32 rank, the blob.
struct BootstrapHello {
  uint64_t session = 0;
  uint32_t nranks = 0;
  uint32_t rank = 0;
  std::string blob;
};
std::string EncodeHello(const BootstrapHello& hello);
// DataLoss when the frame is not an LBCC rank's hello (too short, wrong magic).
absl::StatusOr<BootstrapHello> DecodeHello(absl::string_view frame);

// The root's reply: u8 ok; then u32 count and per rank u32 size + blob, or u32 code + message.
std::string EncodeTable(const std::vector<std::string>& blobs);
std::string EncodeErrorReply(const absl::Status& status);
// Every rank's blob for a rank of `nranks`; the root's error as it sent it (a code that is not
// an absl::StatusCode other than OK is Unavailable "malformed error reply"); Unavailable for a
// reply that does not parse or lists another number of ranks.
absl::StatusOr<std::vector<std::string>> DecodeReply(absl::string_view reply, int nranks);

// The root's reading of kDialBackRequest in a rank's blob: 0 without a request (the blob as it
// was); otherwise the request is taken off `blob` and the result is the port to dial at
// `from_host` (the address the rank's connection came from), or -1 for a request that names
// another host or no valid port (answered "0" without dialing).
int TakeDialBackRequest(std::string& blob, absl::string_view from_host);

// A unique id's fields. InvalidArgument "not an LBCC unique id" for another magic or version.
struct DecodedUniqueId {
  uint32_t version = 0;
  uint64_t session = 0;
  std::string address;  // UniqueIdAddress
  std::optional<transport::JobSecret> secret;  // UniqueIdSecret
};
absl::StatusOr<DecodedUniqueId> DecodeUniqueId(const UniqueId& id);

}  // namespace internal

}  // namespace lbcc::comm

#endif  // LBCC_COMM_BOOTSTRAP_H_
