#include "comm/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "transport/secure.h"
#include "transport/netif.h"

namespace lbcc::comm {
namespace {

constexpr char kIdMagic[4] = {'L', 'B', 'I', 'D'};
constexpr uint32_t kIdVersion = 1;
// An id that carries the job secret (LBCC_SECRET_IN_ID): the address is shorter, the secret at
// kIdSecretAt.
constexpr uint32_t kIdVersionSecret = 2;
constexpr int kIdSecretAt = kUniqueIdBytes - static_cast<int>(transport::kJobSecretBytes);
constexpr int kIdAddressAt = 16;

uint32_t IdVersion(const UniqueId& id) {
  uint32_t version = 0;
  std::memcpy(&version, id.internal + 4, 4);
  return version;
}

// Room for the NUL-terminated address.
size_t AddressRoom(bool with_secret) {
  return static_cast<size_t>((with_secret ? kIdSecretAt : kUniqueIdBytes) - kIdAddressAt);
}

// The secret the bootstrap's sockets authenticate with: the resolved one (a communicator's
// settings) or else the environment's (LBCC_JOB_SECRET / LBCC_JOB_SECRET_FILE) when set, else
// the one the id carries, else none.
absl::StatusOr<std::optional<transport::JobSecret>> BootstrapSecret(
    const BootstrapSecurity& security, const std::optional<transport::JobSecret>& from_id) {
  std::optional<transport::JobSecret> chosen = security.secret;
  if (!security.resolved) {
    LBCC_ASSIGN_OR_RETURN(chosen, transport::JobSecretFromEnv());
  }
  if (chosen.has_value()) return chosen;
  return from_id;
}

// `secret`: BootstrapSecret's answer; none: nothing to do.
absl::Status Authenticate(int fd, transport::HandshakeRole role,
                          const std::optional<transport::JobSecret>& secret,
                          absl::string_view job_id, uint64_t identity, absl::Time deadline,
                          absl::string_view peer) {
  if (!secret.has_value()) return absl::OkStatus();
  return transport::AuthenticateSocket(fd, role, *secret, job_id, identity, deadline, peer)
      .status();
}

constexpr uint32_t kHelloMagic = 0x4c424248;  // "HBBL"
constexpr uint32_t kMaxBlobBytes = 1 << 20;

// An owned socket descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) close(fd_);
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("bootstrap: ", what, ": ", std::strerror(errno)));
}

// A resolved "host:port" (a name or an IPv4/IPv6 literal; IPv6 in brackets).
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  int family() const { return storage.ss_family; }
};

SockAddr FromNumeric(const std::string& host, int port) {
  SockAddr a;
  if (host.find(':') != std::string::npos) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET6, host.c_str(), &in6->sin6_addr);
    a.len = sizeof(sockaddr_in6);
  } else {
    auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, host.c_str(), &in->sin_addr);
    a.len = sizeof(sockaddr_in);
  }
  return a;
}

absl::StatusOr<SockAddr> ParseAddress(absl::string_view address) {
  LBCC_ASSIGN_OR_RETURN(const transport::HostAndPort hp,
                        transport::ParseHostPort(address, "bootstrap: address"));
  LBCC_ASSIGN_OR_RETURN(const std::vector<std::string> resolved,
                        transport::ResolveHost(hp.host, "bootstrap"));
  return FromNumeric(resolved.front(), hp.port);
}

// The IP of `addr` ("10.0.0.1", "fd00::1") and its port.
std::string FormatHost(const SockAddr& addr, int* port = nullptr) {
  char host[INET6_ADDRSTRLEN] = {};
  int p = 0;
  if (addr.family() == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr.storage);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    p = ntohs(in6->sin6_port);
  } else {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr.storage);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    p = ntohs(in->sin_port);
  }
  if (port != nullptr) *port = p;
  return host;
}

std::string FormatAddress(const SockAddr& addr) {
  int port = 0;
  const std::string host = FormatHost(addr, &port);
  return transport::JoinHostPort(host, port);
}

// Waits for `events` on `fd` until `deadline`.
absl::Status WaitFor(int fd, short events, absl::Time deadline, absl::string_view what) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("bootstrap: timed out ", what));
    }
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
    const int n = poll(&p, 1, ms);
    if (n < 0 && errno != EINTR) return Errno("poll");
    if (n > 0) return absl::OkStatus();
  }
}

absl::Status SendAll(int fd, const void* data, size_t size, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    LBCC_RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline, "sending"));
    const ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("send");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, void* data, size_t size, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    LBCC_RETURN_IF_ERROR(WaitFor(fd, POLLIN, deadline, "waiting for the other side"));
    const ssize_t n = recv(fd, p, size, 0);
    if (n == 0) return absl::UnavailableError("bootstrap: connection closed by the other side");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("recv");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SendFrame(int fd, absl::string_view bytes, absl::Time deadline) {
  const uint32_t size = static_cast<uint32_t>(bytes.size());
  LBCC_RETURN_IF_ERROR(SendAll(fd, &size, sizeof(size), deadline));
  return SendAll(fd, bytes.data(), bytes.size(), deadline);
}

absl::StatusOr<std::string> RecvFrame(int fd, absl::Time deadline, uint32_t max_bytes) {
  uint32_t size = 0;
  LBCC_RETURN_IF_ERROR(RecvAll(fd, &size, sizeof(size), deadline));
  if (size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("bootstrap: frame of ", size, " bytes"));
  }
  std::string bytes(size, '\0');
  LBCC_RETURN_IF_ERROR(RecvAll(fd, bytes.data(), size, deadline));
  return bytes;
}

template <typename T>
void Append(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

template <typename T>
bool Take(absl::string_view* in, T* value) {
  if (in->size() < sizeof(T)) return false;
  std::memcpy(value, in->data(), sizeof(T));
  in->remove_prefix(sizeof(T));
  return true;
}

std::string ErrorReply(const absl::Status& status) { return internal::EncodeErrorReply(status); }

struct Joined {
  Fd fd;
  std::string blob;
  int dial_port = 0;  // kDialBackRequest: the port to dial at the address the rank came from.
  std::string dial_host;
};

// Dials every rank that asked (kDialBackRequest), up to kDialers at once, each for at most
// kDialBackTimeout, and appends "\n1" (a connection opened; closed at once, nothing sent) or
// "\n0" to its blob. Nothing is dialed past 3 s after the root's deadline (the ranks wait for
// the table until 5 s after theirs): a rank not dialed by then reads "0".
void AnswerDialBacks(std::map<int, Joined>& joined, absl::Time deadline) {
  constexpr size_t kDialers = 64;
  std::vector<Joined*> asked;
  for (auto& [rank, j] : joined) {
    if (j.dial_port != 0) asked.push_back(&j);
  }
  if (asked.empty()) return;
  std::vector<char> open(asked.size(), 0);
  std::atomic<size_t> next{0};
  std::vector<std::thread> dialers;
  for (size_t t = 0; t < std::min(kDialers, asked.size()); ++t) {
    dialers.emplace_back([&open, &next, &asked, deadline] {
      for (size_t i = next++; i < asked.size(); i = next++) {
        const Joined* j = asked[i];
        if (j->dial_port < 0) continue;
        const SockAddr to = FromNumeric(j->dial_host, j->dial_port);
        Fd fd(socket(to.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
        const absl::Time until =
            std::min(deadline + absl::Seconds(3), absl::Now() + kDialBackTimeout);
        open[i] = fd.get() >= 0 && transport::ConnectBefore(fd.get(), to.get(), to.len, until) == 0;
      }
    });
  }
  for (std::thread& t : dialers) t.join();
  int closed = 0;
  for (size_t i = 0; i < asked.size(); ++i) {
    absl::StrAppend(&asked[i]->blob, "\n", open[i] ? "1" : "0");
    closed += open[i] ? 0 : 1;
  }
  LBCC_LOG(INFO) << "bootstrap: dialed back " << asked.size() << " rank(s): " << closed
                 << " could not be reached";
}

// Whether a new connection to a root that has a job secret is a rank without one: its first
// frame is a bootstrap hello ([u32 length][kHelloMagic]...) instead of a handshake. Peeks, so
// the handshake still reads everything when it is not.
bool SendsHelloWithoutSecret(int fd, absl::Time deadline) {
  uint8_t head[8];
  while (true) {
    if (!WaitFor(fd, POLLIN, deadline, "").ok()) return false;
    const ssize_t n = recv(fd, head, sizeof(head), MSG_PEEK);
    if (n <= 0) return false;
    if (n == static_cast<ssize_t>(sizeof(head))) break;
    absl::SleepFor(absl::Milliseconds(1));  // The rest of 8 bytes is in flight: poll again.
  }
  uint32_t magic = 0;
  std::memcpy(&magic, head + 4, sizeof(magic));
  return magic == kHelloMagic;
}

// The root: accepts `nranks` hellos until `deadline`, then answers everyone. With nranks 0,
// the first valid hello sets it.
// `cancel` (may be null): shuts the listener and the connection being read down, so that the
// root stops at once and tells the ranks that joined why.
void RunRoot(Fd listener, int nranks, uint64_t session, absl::Time deadline,
             std::optional<transport::JobSecret> secret, std::shared_ptr<Cancellation> cancel) {
  std::map<int, Joined> joined;
  const Cancellation::Hook stop_listening(
      cancel.get(), [fd = listener.get()] { shutdown(fd, SHUT_RDWR); });
  while (nranks == 0 || static_cast<int>(joined.size()) < nranks) {
    if (cancel != nullptr && cancel->cancelled()) break;
    if (!WaitFor(listener.get(), POLLIN, deadline, "").ok()) break;
    SockAddr from;
    from.len = sizeof(from.storage);
    Fd conn(accept(listener.get(), reinterpret_cast<sockaddr*>(&from.storage), &from.len));
    if (conn.get() < 0) continue;
    const Cancellation::Hook stop_reading(cancel.get(),
                                          [fd = conn.get()] { shutdown(fd, SHUT_RDWR); });
    // With a job secret, only members get further (transport/secure.h; refusals are logged). A
    // rank started without the secret is told so, rather than finding its connection reset.
    const absl::Time hello_deadline = std::min(deadline, absl::Now() + absl::Seconds(10));
    if (secret.has_value() && SendsHelloWithoutSecret(conn.get(), hello_deadline)) {
      LBCC_LOG(WARN) << "bootstrap: refused " << FormatAddress(from)
                     << ": it has no job secret, and this job requires one";
      (void)SendFrame(conn.get(),
                      ErrorReply(absl::PermissionDeniedError(
                          "bootstrap: this job requires a job secret and this rank has none: set "
                          "LBCC_JOB_SECRET or LBCC_JOB_SECRET_FILE (the job's, on every rank), "
                          "or join with a unique id that carries it (LBCC_SECRET_IN_ID)")),
                      hello_deadline);
      continue;
    }
    if (!Authenticate(conn.get(), transport::HandshakeRole::kServer, secret,
                      absl::StrCat("bootstrap ", session), ~uint64_t{0},
                      std::min(deadline, absl::Now() + absl::Seconds(10)), FormatAddress(from))
             .ok()) {
      continue;
    }
    // A slow or silent client must not hold up the root past its deadline.
    absl::StatusOr<std::string> hello =
        RecvFrame(conn.get(), std::min(deadline, absl::Now() + absl::Seconds(10)), kMaxBlobBytes + 64);
    if (!hello.ok()) continue;
    absl::StatusOr<internal::BootstrapHello> decoded = internal::DecodeHello(*hello);
    if (!decoded.ok()) continue;  // Not an LBCC rank.
    const uint32_t their_nranks = decoded->nranks, rank = decoded->rank;
    const uint64_t their_session = decoded->session;
    absl::Status problem;
    if (nranks == 0 && their_session == session && their_nranks > 0) {
      nranks = static_cast<int>(their_nranks);
    }
    if (their_session != session) {
      problem = absl::InvalidArgumentError("bootstrap: the unique id belongs to another job");
    } else if (static_cast<int>(their_nranks) != nranks) {
      problem = absl::InvalidArgumentError(absl::StrCat(
          "bootstrap: rank ", rank, " says nranks ", their_nranks, ", the root expects ", nranks));
    } else if (static_cast<int>(rank) >= nranks) {
      problem = absl::InvalidArgumentError(absl::StrCat("bootstrap: rank ", rank, " >= nranks"));
    } else if (joined.count(static_cast<int>(rank))) {
      problem = absl::InvalidArgumentError(
          absl::StrCat("bootstrap: two processes claim rank ", rank));
    }
    if (!problem.ok()) {
      (void)SendFrame(conn.get(), ErrorReply(problem), absl::Now() + absl::Seconds(5));
      continue;
    }
    Joined j{std::move(conn), std::move(decoded->blob)};
    j.dial_host = FormatHost(from);  // Also the observed address.
    j.dial_port = internal::TakeDialBackRequest(j.blob, j.dial_host);
    if (absl::EndsWith(j.blob, kObservedAddressRequest)) {
      j.blob.resize(j.blob.size() - kObservedAddressRequest.size());
      absl::StrAppend(&j.blob, "\n", j.dial_host);
    }
    joined[static_cast<int>(rank)] = std::move(j);
  }
  if (cancel != nullptr && cancel->cancelled()) {
    // Superseded (an elastic epoch): the ranks that joined learn it now, not at the deadline.
    const absl::Status why = cancel->status();
    LBCC_LOG(INFO) << "bootstrap: root stopped with " << joined.size() << " rank(s) joined: "
                   << why.message();
    for (auto& [rank, j] : joined) {
      (void)SendFrame(j.fd.get(), ErrorReply(why), absl::Now() + absl::Seconds(1));
    }
    return;
  }
  const absl::Time reply_deadline = absl::Now() + absl::Seconds(30);
  if (nranks == 0) return;  // Nobody came.
  if (static_cast<int>(joined.size()) < nranks) {
    std::vector<int> missing;
    for (int r = 0; r < nranks; ++r) {
      if (!joined.count(r)) missing.push_back(r);
    }
    const absl::Status status = absl::DeadlineExceededError(
        absl::StrCat("bootstrap: rank(s) ", absl::StrJoin(missing, ","), " of ", nranks,
                     " never joined before the timeout"));
    LBCC_LOG(WARN) << status.message();
    for (auto& [rank, j] : joined) (void)SendFrame(j.fd.get(), ErrorReply(status), reply_deadline);
    return;
  }
  AnswerDialBacks(joined, deadline);
  std::vector<std::string> blobs;
  for (auto& [rank, j] : joined) blobs.push_back(std::move(j.blob));
  const std::string table = internal::EncodeTable(blobs);
  // Rank 0 last: the root usually lives in rank 0's process (launchers start it there), and a
  // rank 0 that fails its set-up right after the table (a pair nobody can connect) exits with
  // the root; by then every other rank's table is on its way.
  for (auto it = joined.rbegin(); it != joined.rend(); ++it) {
    (void)SendFrame(it->second.fd.get(), table, reply_deadline);
  }
  LBCC_LOG(INFO) << "bootstrap: all " << nranks << " ranks joined";
}

// `bind_errno`: errno of a failed bind, 0 otherwise.
absl::StatusOr<Fd> Listen(const SockAddr& addr, SockAddr* bound, int* bind_errno) {
  *bind_errno = 0;
  Fd fd(socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Errno("socket");
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd.get(), addr.get(), addr.len) != 0) {
    *bind_errno = errno;
    return Errno(absl::StrCat("bind ", FormatAddress(addr)));
  }
  if (listen(fd.get(), 1024) != 0) return Errno("listen");
  bound->len = sizeof(bound->storage);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound->storage), &bound->len) != 0) {
    return Errno("getsockname");
  }
  return fd;
}

UniqueId MakeId(const std::string& address, uint64_t session,
               const std::optional<transport::JobSecret>& secret = std::nullopt) {
  UniqueId id{};
  std::memcpy(id.internal, kIdMagic, 4);
  const uint32_t version = secret.has_value() ? kIdVersionSecret : kIdVersion;
  std::memcpy(id.internal + 4, &version, 4);
  std::memcpy(id.internal + 8, &session, 8);
  std::strncpy(id.internal + kIdAddressAt, address.c_str(), AddressRoom(secret.has_value()) - 1);
  if (secret.has_value()) {
    std::memcpy(id.internal + kIdSecretAt, secret->bytes().data(), transport::kJobSecretBytes);
  }
  return id;
}

absl::Status CheckArgs(int nranks, absl::Duration timeout) {
  if (nranks < 1) return absl::InvalidArgumentError(absl::StrCat("nranks ", nranks, " < 1"));
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("bootstrap timeout must be positive");
  }
  return absl::OkStatus();
}

// `wildcard_fallback`: a fixed address of another host (a name that resolves to a virtual
// address, a NAT) is served on every interface of the same family instead.
absl::Status StartRootAt(const SockAddr& addr, int nranks, uint64_t session,
                         absl::Duration timeout, bool wildcard_fallback, std::string* address,
                         const BootstrapSecurity& security = BootstrapSecurity{},
                         std::optional<transport::JobSecret> id_secret = std::nullopt,
                         std::shared_ptr<Cancellation> cancel = nullptr) {
  LBCC_ASSIGN_OR_RETURN(std::optional<transport::JobSecret> secret,
                        BootstrapSecret(security, id_secret));
  SockAddr bound;
  int bind_errno = 0;
  absl::StatusOr<Fd> listener = Listen(addr, &bound, &bind_errno);
  if (!listener.ok() && wildcard_fallback && bind_errno == EADDRNOTAVAIL) {
    SockAddr any = FromNumeric(addr.family() == AF_INET6 ? "::" : "0.0.0.0", 0);
    std::memcpy(reinterpret_cast<char*>(&any.storage) + 2,
                reinterpret_cast<const char*>(&addr.storage) + 2, 2);  // The port.
    listener = Listen(any, &bound, &bind_errno);
  }
  if (!listener.ok()) return listener.status();
  *address = FormatAddress(bound);
  LBCC_LOG(INFO) << "bootstrap: root at " << *address;
  std::thread(RunRoot, *std::move(listener), nranks, session, absl::Now() + timeout,
              std::move(secret), std::move(cancel))
      .detach();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<UniqueId> CreateUniqueId(absl::string_view listen_host, absl::Duration timeout,
                                        const BootstrapSecurity& security,
                                        std::shared_ptr<Cancellation> cancel) {
  LBCC_RETURN_IF_ERROR(CheckArgs(1, timeout));
  LBCC_ASSIGN_OR_RETURN(const transport::NetChoice net,
                        transport::SelectListenAddress(listen_host, /*root_host=*/""));
  std::random_device random;
  const uint64_t session = (static_cast<uint64_t>(random()) << 32) ^ random() ^ 1;
  // LBCC_SECRET_IN_ID: the id carries a fresh job secret, unless the job has one (which then
  // wins everywhere, and is never put in an id).
  LBCC_ASSIGN_OR_RETURN(const std::optional<transport::JobSecret> job_secret,
                        BootstrapSecret(security, std::nullopt));
  std::optional<transport::JobSecret> id_secret;
  LBCC_ASSIGN_OR_RETURN(const bool secret_in_id, env::GetBool("LBCC_SECRET_IN_ID"));
  if (secret_in_id) {
    if (job_secret.has_value()) {
      LBCC_LOG(INFO) << "bootstrap: the job has a secret, so the unique id carries none";
    } else {
      id_secret = transport::JobSecret::Random();
    }
  }
  std::string address;
  LBCC_RETURN_IF_ERROR(StartRootAt(FromNumeric(net.address, 0), /*nranks=*/0, session, timeout,
                                   /*wildcard_fallback=*/false, &address,
                                   BootstrapSecurity{true, job_secret}, id_secret,
                                   std::move(cancel)));
  if (address.size() >= AddressRoom(id_secret.has_value())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bootstrap: root address '", address, "' is longer than ",
        AddressRoom(id_secret.has_value()) - 1, " characters", id_secret ? " (with LBCC_SECRET_IN_ID)" : ""));
  }
  return MakeId(address, session, id_secret);
}

absl::Status StartRoot(absl::string_view address, int nranks, uint64_t session,
                       absl::Duration timeout) {
  LBCC_RETURN_IF_ERROR(CheckArgs(nranks, timeout));
  LBCC_ASSIGN_OR_RETURN(SockAddr addr, ParseAddress(address));
  std::string bound;
  return StartRootAt(addr, nranks, session, timeout, /*wildcard_fallback=*/true, &bound);
}

absl::StatusOr<UniqueId> UniqueIdFromAddress(absl::string_view address, uint64_t session) {
  LBCC_RETURN_IF_ERROR(ParseAddress(address).status());
  if (address.size() > kUniqueIdBytes - 17) {
    return absl::InvalidArgumentError(absl::StrCat("bootstrap: address '", address, "' is longer than ",
                                                   kUniqueIdBytes - 17, " characters"));
  }
  return MakeId(std::string(address), session);
}

absl::StatusOr<transport::NetChoice> ChooseListenAddress(const UniqueId& id,
                                                         absl::string_view listen_host) {
  LBCC_ASSIGN_OR_RETURN(const transport::HostAndPort root,
                        transport::ParseHostPort(UniqueIdAddress(id), "bootstrap: root"));
  return transport::SelectListenAddress(listen_host, root.host);
}

absl::Status CheckAdvertisedAddresses(const std::vector<std::string>& hostnames,
                                      const std::vector<std::string>& addresses) {
  for (size_t r = 0; r < addresses.size() && r < hostnames.size(); ++r) {
    absl::StatusOr<transport::HostAndPort> hp = transport::ParseHostPort(addresses[r], "address");
    if (!hp.ok() || !transport::IsLoopbackAddress(hp->host)) continue;
    for (size_t peer = 0; peer < hostnames.size(); ++peer) {
      if (hostnames[peer] == hostnames[r]) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "comm: rank ", r, " (host ", hostnames[r], ") advertises the loopback address ",
          addresses[r], " but rank ", peer, " is on host ", hostnames[peer],
          ": on rank ", r, "'s host set LBCC_SOCKET_IFNAME to the interface its peers reach "
          "(or LBCC_LISTEN_ADDR to its address), or unset LBCC_LISTEN_ADDR"));
    }
  }
  return absl::OkStatus();
}

std::string UniqueIdAddress(const UniqueId& id) {
  const size_t room = AddressRoom(IdVersion(id) == kIdVersionSecret);
  return std::string(id.internal + kIdAddressAt, strnlen(id.internal + kIdAddressAt, room));
}

std::optional<transport::JobSecret> UniqueIdSecret(const UniqueId& id) {
  if (std::memcmp(id.internal, kIdMagic, 4) != 0 || IdVersion(id) != kIdVersionSecret) {
    return std::nullopt;
  }
  absl::StatusOr<transport::JobSecret> secret = transport::JobSecret::FromBytes(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(id.internal + kIdSecretAt),
                          transport::kJobSecretBytes));
  if (!secret.ok()) return std::nullopt;
  return *secret;
}

namespace {

absl::StatusOr<std::vector<std::string>> Exchange(const UniqueId& id, int nranks, int rank,
                                                  absl::string_view blob, absl::Duration timeout,
                                                  const BootstrapSecurity& security,
                                                  Cancellation* cancel) {
  LBCC_RETURN_IF_ERROR(CheckArgs(nranks, timeout));
  LBCC_ASSIGN_OR_RETURN(const std::optional<transport::JobSecret> secret,
                        BootstrapSecret(security, UniqueIdSecret(id)));
  if (rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in [0, ", nranks, ")"));
  }
  if (blob.size() > kMaxBlobBytes) return absl::InvalidArgumentError("bootstrap blob too large");
  LBCC_ASSIGN_OR_RETURN(const internal::DecodedUniqueId decoded, internal::DecodeUniqueId(id));
  const uint64_t session = decoded.session;
  LBCC_ASSIGN_OR_RETURN(SockAddr root, ParseAddress(UniqueIdAddress(id)));
  const absl::Time deadline = absl::Now() + timeout;

  // Connect, retrying while the root is not up yet; each attempt ends at the deadline, also
  // against a root whose packets are dropped (no answer at all).
  Fd fd;
  absl::Duration backoff = absl::Milliseconds(10);
  while (true) {
    if (cancel != nullptr) LBCC_RETURN_IF_ERROR(cancel->status());
    fd = Fd(socket(root.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) return Errno("socket");
    {
      // Shut down, a connecting socket stops connecting at once (inet_shutdown).
      const Cancellation::Hook stop(cancel, [s = fd.get()] { shutdown(s, SHUT_RDWR); });
      errno = transport::ConnectBefore(fd.get(), root.get(), root.len, deadline);
    }
    if (errno == 0) break;
    if (errno != ECONNREFUSED && errno != EINTR && errno != ETIMEDOUT) {
      return Errno(absl::StrCat("connect to ", UniqueIdAddress(id)));
    }
    if (absl::Now() + backoff > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "bootstrap: rank ", rank, " could not reach the root at ", UniqueIdAddress(id),
          " within ", absl::FormatDuration(timeout),
          errno == ETIMEDOUT ? " (no answer: a firewall dropping packets, or a wrong address?)"
                             : " (connection refused: is the root running?)"));
    }
    // Back-off between connection attempts, not synchronisation.
    if (cancel != nullptr) {
      cancel->WaitFor(backoff);
    } else {
      absl::SleepFor(backoff);
    }
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
  const Cancellation::Hook stop(cancel, [s = fd.get()] { shutdown(s, SHUT_RDWR); });
  absl::Status authenticated =
      Authenticate(fd.get(), transport::HandshakeRole::kClient, secret,
                   absl::StrCat("bootstrap ", session), static_cast<uint64_t>(rank), deadline,
                   UniqueIdAddress(id));
  if (absl::IsUnavailable(authenticated)) {  // The root closed the handshake unanswered.
    return absl::UnavailableError(absl::StrCat(
        authenticated.message(), " (this rank has a job secret: does the root's process have the "
        "same one? a root without a secret closes connections that try to authenticate)"));
  }
  LBCC_RETURN_IF_ERROR(authenticated);
  const std::string hello = internal::EncodeHello(internal::BootstrapHello{
      session, static_cast<uint32_t>(nranks), static_cast<uint32_t>(rank), std::string(blob)});
  LBCC_RETURN_IF_ERROR(SendFrame(fd.get(), hello, deadline));
  // The root answers at its own deadline at the latest; allow it a little longer to say why.
  LBCC_ASSIGN_OR_RETURN(std::string reply,
                        RecvFrame(fd.get(), deadline + absl::Seconds(5),
                                  static_cast<uint32_t>(nranks) * (kMaxBlobBytes + 4) + 5),
                        _.Prepend(absl::StrCat("bootstrap: rank ", rank, " waiting for all ranks")));
  return internal::DecodeReply(reply, nranks);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> BootstrapExchange(const UniqueId& id, int nranks,
                                                           int rank, absl::string_view blob,
                                                           absl::Duration timeout,
                                                           const BootstrapSecurity& security,
                                                           Cancellation* cancel) {
  absl::StatusOr<std::vector<std::string>> blobs =
      Exchange(id, nranks, rank, blob, timeout, security, cancel);
  // Whatever failed once the exchange was cancelled (a socket shut down under it) failed
  // because of that.
  if (!blobs.ok() && cancel != nullptr && cancel->cancelled()) return cancel->status();
  return blobs;
}

void Cancellation::Cancel(absl::Status why) {
  if (!absl::IsCancelled(why)) {
    why = absl::CancelledError(why.ok() ? "cancelled" : why.message());
  }
  MutexLock lock(&mu_);
  if (!why_.ok()) return;
  why_ = std::move(why);
  for (auto& [id, action] : hooks_) action();
}  // Unlocking wakes WaitFor().

absl::Status Cancellation::status() const {
  MutexLock lock(&mu_);
  return why_;
}

bool Cancellation::WaitFor(absl::Duration timeout) const {
  MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !why_.ok(); },
                              timeout);
}

int Cancellation::hooks() const {
  MutexLock lock(&mu_);
  return static_cast<int>(hooks_.size());
}

Cancellation::Hook::Hook(Cancellation* cancellation, std::function<void()> action)
    : cancellation_(cancellation) {
  if (cancellation_ == nullptr) return;
  MutexLock lock(&cancellation_->mu_);
  if (!cancellation_->why_.ok()) action();
  id_ = ++cancellation_->next_hook_;
  cancellation_->hooks_.emplace(id_, std::move(action));
}

Cancellation::Hook::~Hook() {
  if (cancellation_ == nullptr) return;
  MutexLock lock(&cancellation_->mu_);  // waits for a Cancel() running the action
  cancellation_->hooks_.erase(id_);
}

namespace internal {

std::string EncodeHello(const BootstrapHello& hello) {
  std::string out;
  Append<uint32_t>(&out, kHelloMagic);
  Append<uint64_t>(&out, hello.session);
  Append<uint32_t>(&out, hello.nranks);
  Append<uint32_t>(&out, hello.rank);
  out += hello.blob;
  return out;
}

absl::StatusOr<BootstrapHello> DecodeHello(absl::string_view frame) {
  absl::string_view in = frame;
  uint32_t magic = 0;
  BootstrapHello hello;
  if (!Take(&in, &magic) || !Take(&in, &hello.session) || !Take(&in, &hello.nranks) ||
      !Take(&in, &hello.rank) || magic != kHelloMagic) {
    return absl::DataLossError("bootstrap: not an LBCC rank's hello");
  }
  hello.blob = std::string(in);
  return hello;
}

std::string EncodeTable(const std::vector<std::string>& blobs) {
  std::string table(1, '\1');
  Append<uint32_t>(&table, static_cast<uint32_t>(blobs.size()));
  for (const std::string& blob : blobs) {
    Append<uint32_t>(&table, static_cast<uint32_t>(blob.size()));
    table += blob;
  }
  return table;
}

// Reply: u8 ok; then either u32 count + frames of blobs, or the error code + message.
std::string EncodeErrorReply(const absl::Status& status) {
  std::string reply(1, '\0');
  Append<uint32_t>(&reply, static_cast<uint32_t>(status.code()));
  reply.append(status.message().data(), status.message().size());
  return reply;
}

// Only the host the connection came from is dialed: a rank cannot point the root at another
// machine. A request for another host (behind NAT, which the observed address shows anyway) is
// answered "0".
int TakeDialBackRequest(std::string& blob, absl::string_view from_host) {
  const size_t at = blob.rfind(kDialBackRequest.data(), std::string::npos, kDialBackRequest.size());
  if (at == std::string::npos) return 0;
  const absl::string_view target = absl::string_view(blob).substr(at + kDialBackRequest.size());
  if (absl::StrContains(target, '\n')) return 0;  // Not the last line: not a request.
  const absl::StatusOr<transport::HostAndPort> hp = transport::ParseHostPort(target, "dial-back");
  bool ok = hp.ok() && hp->port > 0 && hp->port <= 65535;
  if (ok) {
    const absl::StatusOr<transport::SocketAddress> host =
        transport::NumericSocketAddress(hp->host, 0);
    ok = host.ok() && host->host == transport::UnmappedIPv4(from_host);
  }
  const int port = ok ? hp->port : -1;
  blob.resize(at);
  return port;
}

absl::StatusOr<std::vector<std::string>> DecodeReply(absl::string_view reply, int nranks) {
  absl::string_view in = reply;
  uint8_t ok = 0;
  if (!Take(&in, &ok)) return absl::UnavailableError("bootstrap: empty reply from the root");
  // The root sends 0 or 1; any other first byte is not its reply (bootstrap_fuzz's finding:
  // read as a table, it did not re-encode to itself).
  if (ok > 1) return absl::UnavailableError("bootstrap: malformed reply from the root");
  if (!ok) {
    uint32_t code = 0;
    // The code comes from the network: OK (an error reply that would read as success) and
    // numbers absl does not know are not an error the root sends.
    if (!Take(&in, &code) || code == 0 ||
        code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
      return absl::UnavailableError("bootstrap: malformed error reply");
    }
    return absl::Status(static_cast<absl::StatusCode>(code), in);
  }
  uint32_t count = 0;
  if (!Take(&in, &count) || static_cast<int>(count) != nranks) {
    return absl::UnavailableError("bootstrap: malformed table from the root");
  }
  std::vector<std::string> blobs;
  for (uint32_t r = 0; r < count; ++r) {
    uint32_t size = 0;
    if (!Take(&in, &size) || size > in.size()) {
      return absl::UnavailableError("bootstrap: malformed table from the root");
    }
    blobs.emplace_back(in.substr(0, size));
    in.remove_prefix(size);
  }
  return blobs;
}

absl::StatusOr<DecodedUniqueId> DecodeUniqueId(const UniqueId& id) {
  const uint32_t version = IdVersion(id);
  if (std::memcmp(id.internal, kIdMagic, 4) != 0 ||
      (version != kIdVersion && version != kIdVersionSecret)) {
    return absl::InvalidArgumentError("not an LBCC unique id (or from another LBCC version)");
  }
  DecodedUniqueId decoded;
  decoded.version = version;
  std::memcpy(&decoded.session, id.internal + 8, 8);
  decoded.address = UniqueIdAddress(id);
  decoded.secret = UniqueIdSecret(id);
  return decoded;
}

}  // namespace internal

}  // namespace lbcc::comm
