#include "comm/elastic/wire.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/env.h"
#include "base/status_macros.h"
#include "transport/netif.h"

namespace lbcc::comm::elastic {

absl::StatusOr<absl::Duration> ResolvePeerTimeout(absl::Duration given) {
  if (given > absl::ZeroDuration()) return given;
  LBCC_ASSIGN_OR_RETURN(const int64_t ms, env::GetInt("LBCC_PEER_TIMEOUT_MS"));
  return absl::Milliseconds(ms);
}

namespace {

constexpr uint32_t kMagic = 0x4d45424c;  // "LBEM"
// 4: kSetupFailed carries `blame`.
constexpr uint8_t kVersion = 4;

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void PutString(absl::string_view s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    if (in_.size() < sizeof(T)) return ok_ = false;
    std::memcpy(v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }
  bool GetString(std::string* s) {
    uint32_t n = 0;
    if (!Get(&n) || n > in_.size()) return ok_ = false;
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool GetBool(bool* b) {
    uint8_t v = 0;
    if (!Get(&v)) return false;
    *b = v != 0;
    return true;
  }
  bool ok() const { return ok_; }
  // Whether `count` elements of at least `size` bytes each can still follow (a count from the
  // network sizes nothing it cannot back with bytes); false marks the message truncated.
  bool Fits(uint32_t count, size_t size) {
    if (count > in_.size() / size) return ok_ = false;
    return true;
  }

 private:
  absl::string_view in_;
  bool ok_ = true;
};

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("elastic: ", what, ": ", std::strerror(errno)));
}

// "host:port": an IPv4 address, an IPv6 one in brackets, or a host name (resolved).
absl::StatusOr<transport::SocketAddress> ParseAddress(absl::string_view address) {
  return transport::ParseSocketAddress(address, "elastic: address");
}

// "10.0.0.2:4000" or "[fd77::2]:4000"; "?" when the kernel reports neither family.
std::string AddressText(const sockaddr_storage& storage) {
  absl::StatusOr<transport::SocketAddress> a = transport::SocketAddressOf(storage);
  return a.ok() ? a->ToString() : "?";
}

}  // namespace

std::string Encode(const Message& m) {
  Writer w;
  w.Put<uint32_t>(kMagic);
  w.Put<uint8_t>(kVersion);
  w.Put<uint8_t>(static_cast<uint8_t>(m.type));
  switch (m.type) {
    case MsgType::kJoin:
      w.PutString(m.job_id);
      w.PutString(m.name);
      w.Put<int64_t>(m.state_step);
      w.PutString(m.replica);
      w.Put<uint32_t>(m.stage);
      w.Put<uint32_t>(m.replica_stages);
      break;
    case MsgType::kWelcome:
      w.Put<uint64_t>(m.member_id);
      w.Put<uint64_t>(m.step);
      w.Put<uint64_t>(m.peer_timeout_ms);
      break;
    case MsgType::kEpoch:
      w.Put<uint64_t>(m.epoch);
      w.Put<uint64_t>(m.step);
      w.Put<uint32_t>(m.rank);
      w.Put<uint32_t>(m.nranks);
      w.PutString(m.unique_id);
      w.Put<uint32_t>(static_cast<uint32_t>(m.needs_state.size()));
      for (uint32_t r : m.needs_state) w.Put<uint32_t>(r);
      w.Put<uint32_t>(static_cast<uint32_t>(m.names.size()));
      for (const std::string& n : m.names) w.PutString(n);
      w.Put<uint8_t>(m.forward);
      w.Put<uint64_t>(m.forward_step);
      w.Put<uint32_t>(m.forward_source);
      w.Put<uint32_t>(static_cast<uint32_t>(m.forward_to.size()));
      for (uint32_t r : m.forward_to) w.Put<uint32_t>(r);
      w.Put<uint64_t>(m.parent_epoch);
      w.Put<uint32_t>(static_cast<uint32_t>(m.parent_ranks.size()));
      for (uint32_t r : m.parent_ranks) w.Put<uint32_t>(r);
      break;
    case MsgType::kReport:
    case MsgType::kDecision:
      w.Put<uint64_t>(m.epoch);
      w.Put<uint64_t>(m.step);
      w.Put<uint8_t>(static_cast<uint8_t>(m.phase));
      w.Put<uint8_t>(m.ok);
      w.Put<uint8_t>(m.broken);
      w.Put<uint8_t>(m.forward);
      w.Put<uint64_t>(m.next_epoch);
      w.Put<uint32_t>(m.code);
      break;
    case MsgType::kSetupFailed:
      w.Put<uint64_t>(m.epoch);
      w.Put<uint32_t>(m.blame);
      break;
    case MsgType::kEnter:
      w.Put<uint64_t>(m.epoch);
      break;
    case MsgType::kRefuse:
      w.Put<uint32_t>(m.code);
      break;
    case MsgType::kEvicted:
      w.Put<uint8_t>(m.replica_left);
      break;
    case MsgType::kHeartbeat:
    case MsgType::kLeave:
      break;
  }
  w.PutString(m.text);
  return w.Take();
}

absl::StatusOr<Message> Decode(absl::string_view body) {
  Reader r(body);
  uint32_t magic = 0;
  uint8_t version = 0, type = 0;
  if (!r.Get(&magic) || magic != kMagic || !r.Get(&version) || !r.Get(&type)) {
    return absl::DataLossError("elastic: not a membership message (bad magic)");
  }
  if (version != kVersion) {
    return absl::DataLossError(
        absl::StrCat("elastic: membership message version ", version, ", expected ", kVersion));
  }
  if (type < 1 || type > static_cast<uint8_t>(MsgType::kEnter)) {
    return absl::DataLossError(absl::StrCat("elastic: unknown membership message type ", type));
  }
  Message m;
  m.type = static_cast<MsgType>(type);
  uint8_t phase = 0;
  uint32_t count = 0;
  switch (m.type) {
    case MsgType::kJoin:
      r.GetString(&m.job_id) && r.GetString(&m.name) && r.Get(&m.state_step) &&
          r.GetString(&m.replica) && r.Get(&m.stage) && r.Get(&m.replica_stages);
      break;
    case MsgType::kWelcome:
      r.Get(&m.member_id) && r.Get(&m.step) && r.Get(&m.peer_timeout_ms);
      break;
    case MsgType::kEpoch:
      if (r.Get(&m.epoch) && r.Get(&m.step) && r.Get(&m.rank) && r.Get(&m.nranks) &&
          r.GetString(&m.unique_id) && r.Get(&count) && r.Fits(count, 4)) {
        m.needs_state.resize(count);
        for (uint32_t& v : m.needs_state) r.Get(&v);
        if (r.Get(&count) && r.Fits(count, 4)) {
          m.names.resize(count);
          for (std::string& n : m.names) r.GetString(&n);
          if (r.GetBool(&m.forward) && r.Get(&m.forward_step) && r.Get(&m.forward_source) &&
              r.Get(&count) && r.Fits(count, 4)) {
            m.forward_to.resize(count);
            for (uint32_t& v : m.forward_to) r.Get(&v);
            if (r.Get(&m.parent_epoch) && r.Get(&count) && r.Fits(count, 4)) {
              m.parent_ranks.resize(count);
              for (uint32_t& v : m.parent_ranks) r.Get(&v);
            }
          }
        }
      }
      if (r.ok() && (m.rank >= m.nranks || m.names.size() != m.nranks)) {
        return absl::DataLossError("elastic: epoch message with a bad rank or member list");
      }
      if (r.ok() && m.parent_epoch != 0) {
        bool bad = m.parent_ranks.size() != m.nranks;
        for (size_t i = 1; !bad && i < m.parent_ranks.size(); ++i) {
          bad = m.parent_ranks[i] <= m.parent_ranks[i - 1];
        }
        if (bad) return absl::DataLossError("elastic: epoch message with a bad parent rank list");
      }
      if (r.ok() && m.forward) {
        bool bad = m.forward_source >= m.nranks;
        for (uint32_t v : m.forward_to) bad |= v >= m.nranks || v == m.forward_source;
        if (bad) return absl::DataLossError("elastic: epoch message with a bad forward list");
      }
      break;
    case MsgType::kReport:
    case MsgType::kDecision:
      r.Get(&m.epoch) && r.Get(&m.step) && r.Get(&phase) && r.GetBool(&m.ok) &&
          r.GetBool(&m.broken) && r.GetBool(&m.forward) &&
          r.Get(&m.next_epoch) && r.Get(&m.code);
      m.phase = static_cast<Phase>(phase);
      if (r.ok() && m.phase != Phase::kSync && m.phase != Phase::kStep &&
          m.phase != Phase::kForward) {
        return absl::DataLossError(absl::StrCat("elastic: unknown phase ", phase));
      }
      break;
    case MsgType::kSetupFailed:
      r.Get(&m.epoch) && r.Get(&m.blame);
      break;
    case MsgType::kEnter:
      r.Get(&m.epoch);
      break;
    case MsgType::kRefuse:
      r.Get(&m.code);
      break;
    case MsgType::kEvicted:
      r.GetBool(&m.replica_left);
      break;
    case MsgType::kHeartbeat:
    case MsgType::kLeave:
      break;
  }
  r.GetString(&m.text);
  if (!r.ok()) return absl::DataLossError("elastic: truncated membership message");
  return m;
}

absl::Status JoinAnswerStatus(const Message& answer) {
  if (answer.type == MsgType::kRefuse) {
    // The code comes from the network: OK (which would read as success) and numbers absl does
    // not know are not a refusal LBCC sends.
    if (answer.code == 0 || answer.code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
      return absl::DataLossError(absl::StrCat("ElasticGroup: the master refused the join with ",
                                              "an unknown status code ", answer.code, ": ",
                                              answer.text));
    }
    return absl::Status(static_cast<absl::StatusCode>(answer.code), answer.text);
  }
  if (answer.type != MsgType::kWelcome) {
    return absl::DataLossError("ElasticGroup: the master did not answer the join");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> FrameReader::Next() {
  uint32_t size = 0;
  if (buffer_.size() < sizeof(size)) return std::optional<std::string>();
  std::memcpy(&size, buffer_.data(), sizeof(size));
  if (size > max_body_) {
    return absl::DataLossError(absl::StrCat("elastic: membership frame of ", size,
                                            " bytes (at most ", max_body_, ")"));
  }
  if (buffer_.size() - sizeof(size) < size) return std::optional<std::string>();
  std::string body = buffer_.substr(sizeof(size), size);
  buffer_.erase(0, sizeof(size) + size);
  return std::optional<std::string>(std::move(body));
}

Socket::~Socket() { close(fd_); }

absl::StatusOr<std::unique_ptr<Socket>> Socket::Connect(absl::string_view address,
                                                        absl::Time deadline) {
  LBCC_ASSIGN_OR_RETURN(const transport::SocketAddress addr, ParseAddress(address));
  absl::Duration backoff = absl::Milliseconds(20);
  while (true) {
    const int fd = socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Errno("socket");
    // Ends at the deadline also against a firewall that drops packets (no SYN retries).
    const int err = transport::ConnectBefore(fd, addr.get(), addr.length, deadline);
    if (err == 0) {
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return std::make_unique<Socket>(fd);
    }
    close(fd);
    if (absl::Now() + backoff > deadline) {
      return absl::UnavailableError(absl::StrCat("elastic: cannot reach the membership service at ",
                                                 address, ": ", std::strerror(err)));
    }
    absl::SleepFor(backoff);  // retry pacing, not synchronisation
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

absl::StatusOr<std::unique_ptr<Socket>> Socket::Listen(absl::string_view address,
                                                       std::string* bound) {
  LBCC_ASSIGN_OR_RETURN(const transport::SocketAddress addr, ParseAddress(address));
  const int fd = socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  auto sock = std::make_unique<Socket>(fd);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, addr.get(), addr.length) != 0) {
    return Errno(absl::StrCat("bind ", address));
  }
  // A deep backlog: a burst of connections (members of a large job starting together, or
  // clients that are not members) must not make the kernel drop a member's SYN, which costs it
  // a retransmission (1 s, then more).
  if (listen(fd, 4096) != 0) return Errno("listen");
  // Non-blocking: the master accepts everything that is pending after each poll (AcceptNow).
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) return Errno("getsockname");
  *bound = AddressText(local);
  return sock;
}

int PollSliceMs(absl::Duration left) {
  if (left <= absl::ZeroDuration()) return 0;
  // Truncated to whole milliseconds, then one more so that a wait never ends early; capped
  // before the addition: an infinite deadline (the readers' Receive) is INT64_MAX ms here, and
  // adding to it first wrapped to a negative slice, cast to 0: poll() returned at once and
  // every reader thread spun on a CPU for as long as it waited.
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left), kPollSliceMs - 1) + 1);
}

absl::Status Socket::WaitFor(short events, absl::Time deadline) {
  while (true) {
    if (shut_.load()) return absl::CancelledError("elastic: connection shut down");
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("elastic: timed out");
    pollfd p{fd_, events, 0};
    const int n = poll(&p, 1, PollSliceMs(left));
    if (n < 0 && errno != EINTR) return Errno("poll");
    if (n > 0) return absl::OkStatus();
  }
}

absl::StatusOr<std::unique_ptr<Socket>> Socket::Accept(absl::Time deadline) {
  while (true) {
    LBCC_RETURN_IF_ERROR(WaitFor(POLLIN, deadline));
    LBCC_ASSIGN_OR_RETURN(std::unique_ptr<Socket> sock, AcceptNow());
    if (sock != nullptr) return sock;
  }
}

absl::StatusOr<std::unique_ptr<Socket>> Socket::AcceptNow() {
  while (true) {
    if (shut_.load()) return absl::CancelledError("elastic: connection shut down");
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return std::make_unique<Socket>(fd);
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return std::unique_ptr<Socket>();
    return Errno("accept");
  }
}

absl::Status Socket::Send(const Message& message, absl::Time deadline) {
  const std::string body = Encode(message);
  std::string frame(sizeof(uint32_t), '\0');
  const uint32_t size = static_cast<uint32_t>(body.size());
  std::memcpy(frame.data(), &size, sizeof(size));
  frame += body;
  MutexLock lock(&send_mu_);
  const char* p = frame.data();
  size_t left = frame.size();
  while (left > 0) {
    absl::Status ready = WaitFor(POLLOUT, deadline);
    if (!ready.ok()) return absl::UnavailableError(absl::StrCat("elastic: send: ", ready.message()));
    const ssize_t n = send(fd_, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("send");
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status Socket::ReadExactly(char* data, size_t size, absl::Time deadline) {
  if (!unread_.empty()) {
    const size_t n = std::min(size, unread_.size());
    std::memcpy(data, unread_.data(), n);
    unread_.erase(0, n);
    data += n;
    size -= n;
  }
  while (size > 0) {
    LBCC_RETURN_IF_ERROR(WaitFor(POLLIN, deadline));
    const ssize_t n = recv(fd_, data, size, MSG_DONTWAIT);
    if (n == 0) return absl::UnavailableError("elastic: connection closed by the other side");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("recv");
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> Socket::ReadSome(char* data, size_t size) {
  if (!unread_.empty() && size > 0) {
    const size_t n = std::min(size, unread_.size());
    std::memcpy(data, unread_.data(), n);
    unread_.erase(0, n);
    return n;
  }
  while (true) {
    if (shut_.load()) return absl::CancelledError("elastic: connection shut down");
    const ssize_t n = recv(fd_, data, size, MSG_DONTWAIT);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) return absl::UnavailableError("elastic: connection closed by the other side");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return Errno("recv");
  }
}

absl::StatusOr<Message> Socket::Receive(absl::Time deadline, uint32_t max_body) {
  uint32_t size = 0;
  LBCC_RETURN_IF_ERROR(ReadExactly(reinterpret_cast<char*>(&size), sizeof(size), deadline));
  if (size > max_body) {
    return absl::DataLossError(absl::StrCat("elastic: membership frame of ", size,
                                            " bytes (at most ", max_body, ")"));
  }
  std::string body(size, '\0');
  LBCC_RETURN_IF_ERROR(ReadExactly(body.data(), size, deadline));
  return Decode(body);
}

void Socket::Shutdown() {
  if (!shut_.exchange(true)) shutdown(fd_, SHUT_RDWR);
}

std::string Socket::peer() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return AddressText(addr);
}

}  // namespace lbcc::comm::elastic
