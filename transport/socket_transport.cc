#include "transport/socket_transport.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "transport/executor.h"
#include "transport/link.h"
#include "transport/link_setup.h"
#include "transport/netif.h"
#include "transport/socket_frame.h"

namespace lbcc::transport {
namespace {

class Reactor;

// One link being set up or running, at either end.
struct Record {
  uint64_t id = 0;
  bool client = false;
  std::string peer;
  std::shared_ptr<Link> link;
  std::unique_ptr<LinkSetup> setup;
  // Reactor thread only.
  std::map<int, std::shared_ptr<class SocketLane>> lanes;  // by lane index
  int lanes_added = 0;
  bool running = false;
  PeerWatch watch;
};

// A frame waiting to be written: its header bytes, then `length` bytes at `data` (the caller's,
// valid until `done`) or in `payload`.
struct OutFrame {
  std::string head;
  const uint8_t* data = nullptr;
  size_t length = 0;
  std::shared_ptr<std::vector<uint8_t>> payload;
  size_t written = 0;  // of head + body
  DoneCallback done;
};

// One TCP connection: a Lane of its link once admitted.
class SocketLane final : public Lane, public std::enable_shared_from_this<SocketLane> {
 public:
  SocketLane(std::weak_ptr<Reactor> reactor, std::shared_ptr<Executor> fallback, int fd,
             std::string peer)
      : fd(fd), reactor_(std::move(reactor)), fallback_(std::move(fallback)),
        peer_(std::move(peer)) {}

  void SendChunk(const ChunkHeader& header, const uint8_t* data, size_t length,
                 DoneCallback done) override;
  void SendCredit(uint64_t bytes, uint8_t priority) override;
  void Close() override;

  const std::string& peer() const { return peer_; }

  // Reactor thread only.
  void QueueControl(ControlHeader header, std::shared_ptr<std::vector<uint8_t>> payload,
                    DoneCallback done);
  void QueueChunk(const ChunkHeader& header, const uint8_t* data, size_t length,
                  DoneCallback done);

  const int fd;
  const absl::Time born = absl::Now();
  int index = -1;
  std::weak_ptr<Record> record;
  bool closed = false;
  bool want_write = false;
  std::deque<OutFrame> out;
  SocketFrameReader reader;  // the frame being read (socket_frame.h)

 private:
  template <typename Fn>
  void Submit(Fn fn);

  std::weak_ptr<Reactor> reactor_;
  std::shared_ptr<Executor> fallback_;
  const std::string peer_;
};

// What a connection may send before its HELLO was admitted (set-up messages carry no payload).
constexpr uint64_t kMaxStrangerFrameBytes = 4096;
// How long an accepted connection may stay silent before its HELLO.
constexpr absl::Duration kHelloDeadline = absl::Seconds(10);

class Reactor final : public std::enable_shared_from_this<Reactor> {
 public:
  explicit Reactor(const TransportOptions& options)
      : options_(options),
        callbacks_(std::make_shared<Executor>("lbcc-sock-cb")),
        clock_(options.peer_timeout) {}

  absl::Status Start() {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd_ < 0 || event_fd_ < 0) {
      return absl::UnavailableError(absl::StrCat("epoll/eventfd: ", std::strerror(errno)));
    }
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = event_fd_;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &event);
    thread_ = std::thread([self = shared_from_this()] { self->Loop(); });
    pthread_setname_np(thread_.native_handle(), "lbcc-sock");
    return absl::OkStatus();
  }

  ~Reactor() {
    if (epoll_fd_ >= 0) close(epoll_fd_);
    if (event_fd_ >= 0) close(event_fd_);
  }

  const TransportOptions& options() const { return options_; }
  const std::shared_ptr<Executor>& callbacks() const { return callbacks_; }

  // Runs `fn` on the reactor thread; false once stopped (fn not run).
  bool Post(absl::AnyInvocable<void()> fn) {
    {
      MutexLock lock(&mu_);
      if (stopped_) return false;
      commands_.push_back(std::move(fn));
    }
    const uint64_t one = 1;
    ssize_t ignored = write(event_fd_, &one, sizeof(one));
    (void)ignored;
    return true;
  }

  // Stops: every connection closed, every link failed with Cancelled, Accept/Connect waiters
  // woken. Idempotent; joins the thread (not from the reactor thread itself).
  void Stop() {
    std::vector<std::shared_ptr<Record>> setups;
    {
      MutexLock lock(&mu_);
      if (stopped_) return;
      stopped_ = true;
      accept_cv_.SignalAll();
      for (auto& weak : client_setups_) {
        if (std::shared_ptr<Record> r = weak.lock()) setups.push_back(std::move(r));
      }
    }
    // Outside mu_: a set-up's own mutex is never taken under it.
    for (auto& r : setups) r->setup->Cancel(absl::CancelledError("transport shut down"));
    const uint64_t one = 1;
    ssize_t ignored = write(event_fd_, &one, sizeof(one));
    (void)ignored;
    if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
  }

  absl::StatusOr<std::string> Listen(absl::string_view address);
  absl::StatusOr<std::shared_ptr<Link>> Accept(absl::Duration timeout);
  absl::StatusOr<std::shared_ptr<Link>> Connect(absl::string_view address, absl::Duration timeout,
                                                const ConnectOptions& options);

  // Reactor thread.
  void Register(const std::shared_ptr<SocketLane>& lane);
  void UpdateInterest(SocketLane& lane);
  void Flush(SocketLane& lane);
  void Drop(const std::shared_ptr<SocketLane>& lane, const absl::Status& why);

 private:
  void Loop();
  void RunCommands();
  void AcceptNew();
  void ReadFrom(const std::shared_ptr<SocketLane>& lane);
  void OnFrame(const std::shared_ptr<SocketLane>& lane);
  void OnControl(const std::shared_ptr<SocketLane>& lane, const ControlHeader& h,
                 std::vector<uint8_t> payload);
  void HandleSetup(const std::shared_ptr<SocketLane>& lane, const ControlHeader& h);
  void AttachLane(const std::shared_ptr<Record>& record, const std::shared_ptr<SocketLane>& lane,
                  int index);
  void WatchPeers();
  void ShutdownAll();

  const TransportOptions options_;
  const std::shared_ptr<Executor> callbacks_;
  ProbeScratch probe_scratch_;
  int epoll_fd_ = -1, event_fd_ = -1, listen_fd_ = -1;
  std::thread thread_;
  WatchClock clock_;

  Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::AnyInvocable<void()>> commands_ ABSL_GUARDED_BY(mu_);
  CondVar accept_cv_;
  std::deque<std::shared_ptr<Link>> accept_queue_ ABSL_GUARDED_BY(mu_);
  bool listening_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::weak_ptr<Record>> client_setups_ ABSL_GUARDED_BY(mu_);

  // Reactor thread only.
  std::map<int, std::shared_ptr<SocketLane>> lanes_;  // by fd
  std::map<std::pair<uint64_t, bool>, std::shared_ptr<Record>> records_;  // (id, client)
};

template <typename Fn>
void SocketLane::Submit(Fn fn) {
  std::shared_ptr<Reactor> reactor = reactor_.lock();
  if (reactor != nullptr && reactor->Post([fn]() mutable { fn(true); })) return;
  fallback_->Post([fn]() mutable { fn(false); });
}

void SocketLane::SendChunk(const ChunkHeader& header, const uint8_t* data, size_t length,
                           DoneCallback done) {
  auto shared = std::make_shared<DoneCallback>(std::move(done));
  Submit([self = shared_from_this(), header, data, length, shared](bool live) mutable {
    if (!live) {
      (*shared)(absl::CancelledError("transport shut down"));
      return;
    }
    self->QueueChunk(header, data, length, std::move(*shared));
  });
}

void SocketLane::SendCredit(uint64_t bytes, uint8_t priority) {
  Submit([self = shared_from_this(), bytes, priority](bool live) {
    if (!live) return;
    ControlHeader header{};
    header.type = static_cast<uint32_t>(Ctl::kCredit);
    header.a = bytes;
    header.b = priority;
    if (std::shared_ptr<Record> r = self->record.lock()) r->link->SealControl(self->index, &header);
    self->QueueControl(header, nullptr, nullptr);
  });
}

void SocketLane::Close() {
  Submit([self = shared_from_this()](bool live) {
    if (!live) return;
    if (std::shared_ptr<Reactor> reactor = self->reactor_.lock()) {
      reactor->Drop(self, absl::CancelledError("connection closed"));
    }
  });
}

void SocketLane::QueueControl(ControlHeader header, std::shared_ptr<std::vector<uint8_t>> payload,
                              DoneCallback done) {
  if (closed) {
    if (done) done(absl::CancelledError("connection closed"));
    return;
  }
  header.lane = static_cast<uint32_t>(std::max(index, 0));
  header.version = kWireVersion;
  OutFrame f;
  const uint32_t length = payload ? static_cast<uint32_t>(payload->size()) : 0;
  f.head = SocketFrameHead(header, length);
  f.length = length;
  f.data = payload ? payload->data() : nullptr;
  f.payload = std::move(payload);
  f.done = std::move(done);
  out.push_back(std::move(f));
  if (std::shared_ptr<Reactor> reactor = reactor_.lock()) reactor->Flush(*this);
}

void SocketLane::QueueChunk(const ChunkHeader& header, const uint8_t* data, size_t length,
                            DoneCallback done) {
  if (closed) {
    done(absl::CancelledError("connection closed"));
    return;
  }
  OutFrame f;
  f.head = SocketFrameHead(header);
  f.data = data;
  f.length = length;
  f.done = std::move(done);
  out.push_back(std::move(f));
  if (std::shared_ptr<Reactor> reactor = reactor_.lock()) reactor->Flush(*this);
}

// ---------------------------------------------------------------------------------------------
// The reactor.

void Reactor::Loop() {
  std::vector<epoll_event> events(64);
  while (true) {
    {
      MutexLock lock(&mu_);
      if (stopped_) break;
    }
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 100);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == event_fd_) {
        uint64_t count;
        ssize_t ignored = read(event_fd_, &count, sizeof(count));
        (void)ignored;
        continue;
      }
      if (fd == listen_fd_) {
        AcceptNew();
        continue;
      }
      auto it = lanes_.find(fd);
      if (it == lanes_.end()) continue;
      std::shared_ptr<SocketLane> lane = it->second;
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) ReadFrom(lane);
      if (!lane->closed && (events[i].events & EPOLLOUT)) Flush(*lane);
    }
    RunCommands();
    if (clock_.Due(absl::Now())) WatchPeers();
  }
  RunCommands();
  ShutdownAll();
}

void Reactor::RunCommands() {
  while (true) {
    std::vector<absl::AnyInvocable<void()>> batch;
    {
      MutexLock lock(&mu_);
      batch.swap(commands_);
    }
    if (batch.empty()) return;
    for (auto& fn : batch) fn();
  }
}

void Reactor::ShutdownAll() {
  const absl::Status cancelled = absl::CancelledError("transport shut down");
  std::vector<std::shared_ptr<SocketLane>> lanes;
  for (auto& [fd, lane] : lanes_) lanes.push_back(lane);
  for (auto& lane : lanes) Drop(lane, cancelled);
  for (auto& [key, record] : records_) {
    record->link->Fail(cancelled);
    record->setup->Cancel(cancelled);
  }
  records_.clear();
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
  // Commands posted meanwhile run their fallbacks: Post refuses after stopped_.
  std::vector<absl::AnyInvocable<void()>> batch;
  {
    MutexLock lock(&mu_);
    batch.swap(commands_);
  }
  for (auto& fn : batch) fn();
}

void Reactor::Register(const std::shared_ptr<SocketLane>& lane) {
  lanes_[lane->fd] = lane;
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.fd = lane->fd;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, lane->fd, &event);
}

void Reactor::UpdateInterest(SocketLane& lane) {
  const bool want = !lane.out.empty();
  if (want == lane.want_write || lane.closed) return;
  lane.want_write = want;
  epoll_event event{};
  event.events = EPOLLIN | (want ? EPOLLOUT : 0);
  event.data.fd = lane.fd;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, lane.fd, &event);
}

// Writes what the socket takes now; completes the frames written in full.
void Reactor::Flush(SocketLane& lane) {
  while (!lane.out.empty() && !lane.closed) {
    OutFrame& f = lane.out.front();
    iovec iov[2];
    int count = 0;
    const size_t head = f.head.size();
    if (f.written < head) {
      iov[count++] = {const_cast<char*>(f.head.data()) + f.written, head - f.written};
      if (f.length > 0) iov[count++] = {const_cast<uint8_t*>(f.data), f.length};
    } else {
      iov[count++] = {const_cast<uint8_t*>(f.data) + (f.written - head), head + f.length - f.written};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    const ssize_t n = sendmsg(lane.fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      Drop(lane.shared_from_this(),
           absl::UnavailableError(absl::StrCat("send to ", lane.peer(), ": ", std::strerror(errno))));
      return;
    }
    f.written += static_cast<size_t>(n);
    if (f.written < head + f.length) break;
    DoneCallback done = std::move(f.done);
    lane.out.pop_front();
    if (done) done(absl::OkStatus());
  }
  UpdateInterest(lane);
}

void Reactor::Drop(const std::shared_ptr<SocketLane>& lane, const absl::Status& why) {
  if (lane->closed) return;
  lane->closed = true;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, lane->fd, nullptr);
  close(lane->fd);
  lanes_.erase(lane->fd);
  std::deque<OutFrame> out;
  out.swap(lane->out);
  for (OutFrame& f : out) {
    if (f.done) f.done(why);
  }
  std::shared_ptr<Record> record = lane->record.lock();
  if (record == nullptr) return;
  const absl::Status lost =
      absl::IsCancelled(why)
          ? why
          : absl::UnavailableError(absl::StrCat("peer ", lane->peer(), " is lost: ",
                                                why.message()));
  record->setup->Fail(lost);
  record->link->Fail(lost);
  records_.erase({record->id, record->client});
}

void Reactor::AcceptNew() {
  while (true) {
    sockaddr_storage from{};
    socklen_t length = sizeof(from);
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &length,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: none left (errors: the next one may do)
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    absl::StatusOr<SocketAddress> peer = SocketAddressOf(from);
    Register(std::make_shared<SocketLane>(weak_from_this(), callbacks_, fd,
                                          peer.ok() ? peer->ToString() : "unknown peer"));
  }
}

void Reactor::ReadFrom(const std::shared_ptr<SocketLane>& lane) {
  while (!lane->closed) {
    const absl::Span<uint8_t> space = lane->reader.Space();
    const ssize_t n = space.empty() ? 0 : recv(lane->fd, space.data(), space.size(), 0);
    if (!space.empty() && n == 0) {
      Drop(lane, absl::UnavailableError("the peer closed the connection"));
      return;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      Drop(lane, absl::UnavailableError(absl::StrCat("receive: ", std::strerror(errno))));
      return;
    }
    // A connection that has not said HELLO yet is a stranger: small set-up frames only.
    const uint64_t limit = lane->record.expired() ? kMaxStrangerFrameBytes : kMaxSocketFrameBytes;
    if (absl::Status s = lane->reader.Received(static_cast<size_t>(n), limit); !s.ok()) {
      Drop(lane, std::move(s));
      return;
    }
    if (lane->reader.ready()) {
      OnFrame(lane);
      lane->reader.Next();
    }
  }
}

void Reactor::OnFrame(const std::shared_ptr<SocketLane>& lane) {
  std::shared_ptr<Record> record = lane->record.lock();
  if (record != nullptr) record->watch.HeardFrom(absl::Now());
  if (lane->reader.kind() == kFrameControl) {
    OnControl(lane, lane->reader.control(), std::move(lane->reader.body()));
    lane->reader.body() = {};
    return;
  }
  const ChunkHeader h = lane->reader.chunk();
  if (record == nullptr || lane->index < 0) {
    Drop(lane, absl::DataLossError("a data chunk before the link was set up"));
    return;
  }
  record->link->OnChunk(lane->index, h, lane->reader.body().data(), nullptr);
}

void Reactor::OnControl(const std::shared_ptr<SocketLane>& lane, const ControlHeader& h,
                        std::vector<uint8_t> payload) {
  (void)payload;  // Probe bytes: their arrival is what a probe measures.
  switch (static_cast<Ctl>(h.type)) {
    case Ctl::kCredit:
    case Ctl::kHeartbeat:
      if (std::shared_ptr<Record> r = lane->record.lock(); r != nullptr && lane->index >= 0) {
        r->link->OnControl(lane->index, h);
      }
      return;
    default:
      break;
  }
  if (!IsSetupMessage(h.type)) {
    LBCC_LOG(WARN) << "socket transport: unknown control message " << h.type << " from "
                   << lane->peer();
    return;
  }
  HandleSetup(lane, h);
}

void Reactor::HandleSetup(const std::shared_ptr<SocketLane>& lane, const ControlHeader& h) {
  const bool hello = static_cast<Ctl>(h.type) == Ctl::kHello;
  std::shared_ptr<Record> record = lane->record.lock();
  if (hello && record == nullptr) {
    if (h.lane > 64) {
      Drop(lane, absl::DataLossError("HELLO for a lane beyond 64"));
      return;
    }
    std::shared_ptr<Record>& slot = records_[{h.conn_id, false}];
    if (slot == nullptr) {
      slot = std::make_shared<Record>();
      slot->id = h.conn_id;
      slot->peer = lane->peer();
      slot->link = std::make_shared<Link>(callbacks_, lane->peer());
      slot->setup = std::make_unique<LinkSetup>(LinkSetup::Role::kServer, options_, lane->peer(),
                                                HostPort{SplitHostPort(lane->peer()).host, 0});
    }
    record = slot;
  }
  if (record == nullptr) {
    Drop(lane, absl::DataLossError("a set-up message before HELLO"));
    return;
  }
  LinkSetup::Step step = record->setup->OnControl(h, probe_scratch_);
  if (step.refuse) {
    if (!hello) {
      record->link->Fail(absl::PermissionDeniedError(
          absl::StrCat("link from ", lane->peer(), " failed authentication")));
    } else if (record->lanes.empty()) {
      records_.erase({record->id, record->client});
    }
    std::weak_ptr<SocketLane> weak = lane;
    auto close = [this, weak](absl::Status) {
      if (std::shared_ptr<SocketLane> l = weak.lock()) Drop(l, absl::CancelledError("refused"));
    };
    if (step.reply.has_value()) {
      lane->QueueControl(step.reply->header, std::move(step.reply->payload), std::move(close));
    } else {
      close(absl::OkStatus());
    }
    return;
  }
  if (hello && step.admit && !record->client) AttachLane(record, lane, static_cast<int>(h.lane));
  if (step.ready.has_value() && !record->client) {
    record->link->Configure(step.ready->link_class, options_.scheduler, options_.fast_chunk_bytes,
                            step.ready->probe, step.ready->channel);
    record->running = true;
    record->watch.Start(absl::Now());
    if (!record->link->failed()) {  // the Link's mutex is never taken under mu_
      MutexLock lock(&mu_);
      accept_queue_.push_back(record->link);
      accept_cv_.SignalAll();
    }
  }
  if (step.reply.has_value()) {
    lane->QueueControl(step.reply->header, std::move(step.reply->payload), nullptr);
  }
}

// A server's connection joins its link; lanes go to the Link in index order.
void Reactor::AttachLane(const std::shared_ptr<Record>& record,
                         const std::shared_ptr<SocketLane>& lane, int index) {
  lane->index = index;
  lane->record = record;
  record->lanes[index] = lane;
  while (record->lanes.count(record->lanes_added) != 0) {
    record->link->AddLane(record->lanes[record->lanes_added]);
    ++record->lanes_added;
  }
}

void Reactor::WatchPeers() {
  const absl::Time now = absl::Now();
  const bool we_stalled = clock_.StartRound(now);
  // Accepted connections that never said HELLO are closed (a stranger cannot hold them).
  std::vector<std::shared_ptr<SocketLane>> silent;
  for (auto& [fd, lane] : lanes_) {
    if (lane->record.expired() && now - lane->born > kHelloDeadline) silent.push_back(lane);
  }
  for (auto& lane : silent) {
    LBCC_LOG(INFO) << "socket transport: closing " << lane->peer() << ": no HELLO within "
                   << kHelloDeadline;
    Drop(lane, absl::DeadlineExceededError("no HELLO"));
  }
  std::vector<std::shared_ptr<Record>> running;
  for (auto& [key, record] : records_) {
    if (record->running) running.push_back(record);
  }
  for (const std::shared_ptr<Record>& record : running) {
    auto it = record->lanes.find(0);
    if (it == record->lanes.end() || it->second->closed || record->link->failed()) continue;
    const PeerWatch::Verdict verdict =
        record->watch.Check(now, options_.peer_timeout, we_stalled,
                            [&record] { return record->link->HasPendingWork(); }, record->peer);
    if (verdict.send_heartbeat) {
      ControlHeader heartbeat = HeartbeatMessage().header;
      record->link->SealControl(0, &heartbeat);
      it->second->QueueControl(heartbeat, nullptr, nullptr);
    }
    if (!verdict.failure.ok()) record->link->Fail(verdict.failure);
  }
}

absl::StatusOr<std::string> Reactor::Listen(absl::string_view address) {
  {
    MutexLock lock(&mu_);
    if (stopped_) return absl::CancelledError("transport shut down");
    if (listening_) return absl::FailedPreconditionError("already listening");
  }
  LBCC_ASSIGN_OR_RETURN(SocketAddress at, ParseSocketAddress(address, "listen address"));
  const int fd = socket(at.ipv6() ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, at.get(), at.length) != 0 || listen(fd, 128) != 0) {
    const int e = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", std::strerror(e)));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  LBCC_ASSIGN_OR_RETURN(SocketAddress actual, SocketAddressOf(bound));
  {
    MutexLock lock(&mu_);
    listening_ = true;
  }
  Post([this, fd] {
    listen_fd_ = fd;
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event);
  });
  return actual.ToString();
}

absl::StatusOr<std::shared_ptr<Link>> Reactor::Accept(absl::Duration timeout) {
  MutexLock lock(&mu_);
  if (stopped_) return absl::CancelledError("transport shut down");
  if (!listening_) return absl::FailedPreconditionError("not listening");
  const absl::Time deadline = absl::Now() + timeout;
  while (accept_queue_.empty() && !stopped_) {
    if (accept_cv_.WaitWithDeadline(&mu_, deadline) && accept_queue_.empty()) {
      return absl::DeadlineExceededError("no connection to accept");
    }
  }
  if (stopped_) return absl::CancelledError("transport shut down");
  std::shared_ptr<Link> link = std::move(accept_queue_.front());
  accept_queue_.pop_front();
  return link;
}

// Connection 0 of a client's link as its set-up wire.
class SocketWire final : public SetupWire {
 public:
  SocketWire(Reactor* reactor, std::shared_ptr<SocketLane> lane)
      : reactor_(reactor), lane_(std::move(lane)) {}
  void Send(ControlMessage message) override {
    reactor_->Post([lane = lane_, message = std::move(message)]() mutable {
      lane->QueueControl(message.header, std::move(message.payload), nullptr);
    });
  }

 private:
  Reactor* const reactor_;
  const std::shared_ptr<SocketLane> lane_;
};

absl::StatusOr<std::shared_ptr<Link>> Reactor::Connect(absl::string_view address,
                                                       absl::Duration timeout,
                                                       const ConnectOptions& options) {
  const absl::Time deadline = absl::Now() + timeout;
  LBCC_ASSIGN_OR_RETURN(SocketAddress to, ParseSocketAddress(address, "address"));
  auto record = std::make_shared<Record>();
  record->id = std::random_device()() | (uint64_t{std::random_device()()} << 32);
  record->client = true;
  record->peer = to.ToString();
  record->link = std::make_shared<Link>(callbacks_, record->peer);
  record->setup = std::make_unique<LinkSetup>(LinkSetup::Role::kClient, options_, record->peer,
                                              SplitHostPort(record->peer));
  {
    MutexLock lock(&mu_);
    if (stopped_) return absl::CancelledError("transport shut down");
    client_setups_.erase(std::remove_if(client_setups_.begin(), client_setups_.end(),
                                        [](const std::weak_ptr<Record>& r) { return r.expired(); }),
                         client_setups_.end());
    client_setups_.push_back(record);
  }
  // Dials one connection of the link and hands it to the reactor; its HELLO goes first.
  auto dial = [&](int index) -> absl::StatusOr<std::shared_ptr<SocketLane>> {
    const int fd = socket(to.ipv6() ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
    const int e = ConnectBefore(fd, to.get(), to.length, deadline);
    if (e != 0) {
      close(fd);
      if (e == ETIMEDOUT) {
        return absl::DeadlineExceededError(
            absl::StrCat("connect to ", record->peer, " timed out"));
      }
      return absl::UnavailableError(
          absl::StrCat("cannot connect to ", record->peer, ": ", std::strerror(e)));
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    auto lane = std::make_shared<SocketLane>(weak_from_this(), callbacks_, fd, record->peer);
    lane->index = index;
    lane->record = record;
    ControlMessage hello = record->setup->Hello(record->id, static_cast<uint32_t>(index));
    const bool posted = Post([this, lane, record, hello = std::move(hello)]() mutable {
      Register(lane);
      record->lanes[lane->index] = lane;
      records_[{record->id, true}] = record;
      lane->QueueControl(hello.header, std::move(hello.payload), nullptr);
    });
    if (!posted) {
      close(fd);
      return absl::CancelledError("transport shut down");
    }
    return lane;
  };
  absl::StatusOr<std::shared_ptr<Link>> result = [&]() -> absl::StatusOr<std::shared_ptr<Link>> {
    LBCC_ASSIGN_OR_RETURN(std::shared_ptr<SocketLane> lane0, dial(0));
    LBCC_RETURN_IF_ERROR(record->setup->AwaitWelcomes(1, deadline));
    SocketWire wire(this, lane0);
    LBCC_ASSIGN_OR_RETURN(LinkParams params,
                          record->setup->Negotiate(wire, options, deadline, /*measure=*/true));
    std::vector<std::shared_ptr<SocketLane>> lanes = {lane0};
    for (int i = 1; i < params.stripes; ++i) {
      LBCC_ASSIGN_OR_RETURN(std::shared_ptr<SocketLane> lane, dial(i));
      lanes.push_back(lane);
    }
    LBCC_RETURN_IF_ERROR(record->setup->AwaitWelcomes(params.stripes, deadline));
    for (const auto& lane : lanes) record->link->AddLane(lane);
    record->link->Configure(params.link_class, options_.scheduler, options_.fast_chunk_bytes,
                            params.probe, params.channel);
    wire.Send(LinkSetup::Ready(record->id, params));
    Post([record] {
      record->running = true;
      record->watch.Start(absl::Now());
    });
    return record->link;
  }();
  if (!result.ok()) {
    Post([this, record] {
      std::vector<std::shared_ptr<SocketLane>> lanes;
      for (auto& [i, lane] : record->lanes) lanes.push_back(lane);
      for (auto& lane : lanes) Drop(lane, absl::CancelledError("set-up failed"));
      records_.erase({record->id, true});
    });
  }
  return result;
}

class SocketTransport final : public Transport {
 public:
  explicit SocketTransport(std::shared_ptr<Reactor> reactor) : reactor_(std::move(reactor)) {}
  ~SocketTransport() override { Shutdown(); }

  absl::StatusOr<std::string> Listen(absl::string_view address) override {
    return reactor_->Listen(address);
  }
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address,
                                                    absl::Duration timeout,
                                                    ConnectOptions options) override {
    LBCC_ASSIGN_OR_RETURN(std::shared_ptr<Link> link,
                          reactor_->Connect(address, timeout, options));
    return std::make_unique<LinkEndpoint>(std::move(link), reactor_);
  }
  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(absl::Duration timeout) override {
    LBCC_ASSIGN_OR_RETURN(std::shared_ptr<Link> link, reactor_->Accept(timeout));
    return std::make_unique<LinkEndpoint>(std::move(link), reactor_);
  }
  void Shutdown() override { reactor_->Stop(); }
  absl::string_view backend() const override { return "socket"; }

 private:
  std::shared_ptr<Reactor> reactor_;
};

}  // namespace

std::unique_ptr<Transport> NewSocketTransport(const TransportOptions& options) {
  auto reactor = std::make_shared<Reactor>(options);
  absl::Status started = reactor->Start();
  if (!started.ok()) {
    LBCC_LOG(WARN) << "socket transport: " << started;
    reactor->Stop();
  }
  return std::make_unique<SocketTransport>(std::move(reactor));
}

}  // namespace lbcc::transport
