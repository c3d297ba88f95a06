#include "transport/loopback.h"

#include <atomic>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "transport/executor.h"
#include "transport/link.h"
#include "transport/link_setup.h"

namespace lbcc::transport {
namespace {

// Chunks at least this large travel as deferred payloads (the receiver pulls them).
constexpr size_t kDeferredBytes = 64 << 10;

struct State;

// Process-wide map of listening names.
struct Registry {
  Mutex mu;
  absl::flat_hash_map<std::string, std::weak_ptr<State>> listeners ABSL_GUARDED_BY(mu);
};
Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

// Per-Transport state, shared with its lanes and endpoints.
struct State {
  explicit State(const TransportOptions& o)
      : options(o),
        callbacks(std::make_shared<Executor>("lbcc-loop-cb")),
        wire(std::make_shared<Executor>("lbcc-loop-wire")) {}

  const TransportOptions options;
  const std::shared_ptr<Executor> callbacks;  // User callbacks and timers.
  const std::shared_ptr<Executor> wire;       // Deliveries into this Transport's links.

  Mutex mu;
  std::string name ABSL_GUARDED_BY(mu);
  bool shut_down ABSL_GUARDED_BY(mu) = false;
  std::deque<std::shared_ptr<Link>> accept_queue ABSL_GUARDED_BY(mu);
  ProbeScratch probe_scratch;  // Thread-safe; for the set-up protocol (no probe runs here).
  std::vector<std::weak_ptr<Link>> links ABSL_GUARDED_BY(mu);
  uint64_t accepted ABSL_GUARDED_BY(mu) = 0;
};

// The sender's bytes of a large chunk, fetched by the receiver.
class LoopbackDeferred final : public DeferredPayload {
 public:
  LoopbackDeferred(const uint8_t* data, size_t length, DoneCallback sender_done,
                   std::shared_ptr<Executor> receiver_wire)
      : data_(data),
        length_(length),
        sender_done_(std::move(sender_done)),
        receiver_wire_(std::move(receiver_wire)) {}
  ~LoopbackDeferred() override {
    // Discarded by the receiver: the sender's part is over all the same.
    if (sender_done_) {
      receiver_wire_->Post(
          [done = std::move(sender_done_)]() mutable { done(absl::OkStatus()); });
    }
  }
  void Fetch(uint8_t* dst, DoneCallback done) override {
    receiver_wire_->Post([data = data_, length = length_, dst, done = std::move(done),
                          sender_done = std::move(sender_done_)]() mutable {
      std::memcpy(dst, data, length);
      done(absl::OkStatus());
      sender_done(absl::OkStatus());
    });
    sender_done_ = nullptr;
  }

 private:
  const uint8_t* data_;
  size_t length_;
  DoneCallback sender_done_;
  std::shared_ptr<Executor> receiver_wire_;
};

// One direction-pair of an in-memory connection, as seen from one side.
class LoopbackLane final : public Lane {
 public:
  LoopbackLane(int index, std::shared_ptr<Executor> peer_wire)
      : index_(index), peer_wire_(std::move(peer_wire)) {}
  void Bind(std::weak_ptr<Link> peer) { peer_ = std::move(peer); }

  void SendChunk(const ChunkHeader& header, const uint8_t* data, size_t length,
                 DoneCallback done) override {
    if (closed_.load()) {
      peer_wire_->Post([done = std::move(done)]() mutable {
        done(absl::CancelledError("lane closed"));
      });
      return;
    }
    peer_wire_->Post([peer = peer_, index = index_, header, data, length, done = std::move(done),
                      wire = peer_wire_]() mutable {
      std::shared_ptr<Link> link = peer.lock();
      if (link == nullptr) {
        done(absl::UnavailableError("loopback peer is gone"));
        return;
      }
      if (length >= kDeferredBytes) {
        link->OnChunk(index, header, nullptr,
                      std::make_unique<LoopbackDeferred>(data, length, std::move(done), wire));
      } else {
        link->OnChunk(index, header, data, nullptr);
        done(absl::OkStatus());
      }
    });
  }

  void SendCredit(uint64_t bytes, uint8_t priority) override {
    peer_wire_->Post([peer = peer_, index = index_, bytes, priority] {
      if (std::shared_ptr<Link> link = peer.lock()) link->OnCredit(index, bytes, priority);
    });
  }

  void Close() override {
    if (closed_.exchange(true)) return;
    peer_wire_->Post([peer = peer_] {
      if (std::shared_ptr<Link> link = peer.lock()) {
        link->Fail(absl::UnavailableError("loopback peer closed the endpoint"));
      }
    });
  }

 private:
  const int index_;
  const std::shared_ptr<Executor> peer_wire_;
  std::weak_ptr<Link> peer_;
  std::atomic<bool> closed_{false};
};

// The set-up wire between two LinkSetups in memory: a message reaches the server's LinkSetup at
// once and its reply comes straight back to the client's.
class MemoryWire final : public SetupWire {
 public:
  MemoryWire(LinkSetup* server, LinkSetup* client, ProbeScratch* scratch)
      : server_(server), client_(client), scratch_(scratch) {}
  void Send(ControlMessage message) override {
    LinkSetup::Step step = server_->OnControl(message.header, *scratch_);
    // The reply first: a refusal's WELCOME tells the client why (the first failure is kept).
    if (step.reply.has_value()) client_->OnControl(step.reply->header, *scratch_);
    if (message.header.type == static_cast<uint32_t>(Ctl::kHello) && !step.admit) {
      client_->Fail(absl::UnavailableError("the listener's link set-up refused the connection"));
    } else if (step.refuse) {
      refused_ = true;
      client_->Fail(absl::PermissionDeniedError("the listener refused the link: authentication"));
    }
    if (step.ready.has_value()) ready_ = step.ready;
  }
  // What the server's LinkSetup took from READY.
  const std::optional<LinkParams>& ready() const { return ready_; }
  bool refused() const { return refused_; }

 private:
  LinkSetup* const server_;
  LinkSetup* const client_;
  ProbeScratch* const scratch_;
  std::optional<LinkParams> ready_;
  bool refused_ = false;
};

// What each end configures its Link with, from the set-up every backend runs
// (transport/link_setup.h), its messages handed over in memory. The server's rules see the
// client by the host of its listen name (none: only "*" applies).
struct BothEnds {
  LinkParams client, server;
};
absl::StatusOr<BothEnds> SetUpInMemory(const TransportOptions& client_options,
                                       absl::string_view client_name, State& server,
                                       absl::string_view address, const ConnectOptions& options,
                                       uint64_t connection, absl::Time deadline) {
  LinkSetup client_setup(LinkSetup::Role::kClient, client_options, absl::StrCat("loop:", address),
                         SplitHostPort(address));
  LinkSetup server_setup(LinkSetup::Role::kServer, server.options,
                         absl::StrCat("loop:", client_name),
                         HostPort{SplitHostPort(client_name).host, 0});
  MemoryWire wire(&server_setup, &client_setup, &server.probe_scratch);
  wire.Send(client_setup.Hello(connection, 0));
  LBCC_RETURN_IF_ERROR(client_setup.AwaitWelcomes(1, deadline));
  // Memory lanes have nothing to measure: an unconfigured link is fast.
  LBCC_ASSIGN_OR_RETURN(LinkParams params,
                        client_setup.Negotiate(wire, options, deadline, /*measure=*/false));
  wire.Send(LinkSetup::Ready(connection, params));
  if (!wire.ready().has_value()) {
    if (wire.refused()) {
      return absl::PermissionDeniedError(
          absl::StrCat("loop:", address, " refused the link: authentication failed"));
    }
    return absl::InternalError("loopback set-up lost its READY");
  }
  return BothEnds{params, *wire.ready()};
}

class LoopbackTransport final : public Transport {
 public:
  explicit LoopbackTransport(const TransportOptions& options)
      : state_(std::make_shared<State>(options)) {}

  ~LoopbackTransport() override { Shutdown(); }

  void Shutdown() override {
    std::vector<std::shared_ptr<Link>> links;
    {
      MutexLock lock(&state_->mu);
      state_->shut_down = true;
      for (auto& weak : state_->links) {
        if (std::shared_ptr<Link> link = weak.lock()) links.push_back(std::move(link));
      }
      state_->accept_queue.clear();
      if (!state_->name.empty()) {
        Registry& registry = GetRegistry();
        MutexLock registry_lock(&registry.mu);
        registry.listeners.erase(state_->name);
      }
    }
    for (auto& link : links) link->Fail(absl::CancelledError("transport shut down"));
  }

  absl::string_view backend() const override { return "loopback"; }

  absl::StatusOr<std::string> Listen(absl::string_view address) override {
    if (address.empty()) return absl::InvalidArgumentError("loopback address must be a name");
    MutexLock lock(&state_->mu);
    if (state_->shut_down) return absl::CancelledError("transport shut down");
    if (!state_->name.empty()) return absl::FailedPreconditionError("already listening");
    Registry& registry = GetRegistry();
    MutexLock registry_lock(&registry.mu);
    std::weak_ptr<State>& slot = registry.listeners[std::string(address)];
    if (slot.lock() != nullptr) {
      return absl::UnavailableError(absl::StrCat("loopback name '", address, "' is in use"));
    }
    slot = state_;
    state_->name = std::string(address);
    return state_->name;
  }

  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address,
                                                    absl::Duration timeout,
                                                    ConnectOptions options) override {
    if (address.empty()) return absl::InvalidArgumentError("loopback address must be a name");
    const absl::Time deadline = absl::Now() + timeout;
    std::shared_ptr<State> server;
    uint64_t retries = 0;
    while (true) {
      {
        Registry& registry = GetRegistry();
        MutexLock lock(&registry.mu);
        auto it = registry.listeners.find(std::string(address));
        if (it != registry.listeners.end()) server = it->second.lock();
      }
      if (server != nullptr) break;
      {
        MutexLock lock(&state_->mu);
        if (state_->shut_down) return absl::CancelledError("transport shut down");
      }
      if (absl::Now() >= deadline) {
        return absl::UnavailableError(absl::StrCat("nobody listens on loopback '", address, "'"));
      }
      ++retries;
      absl::SleepFor(absl::Milliseconds(1));  // Waiting for a peer to start listening.
    }

    std::string client_name;
    {
      MutexLock lock(&state_->mu);
      client_name = state_->name;
    }
    uint64_t connection;
    {
      MutexLock lock(&server->mu);
      if (server->shut_down) return absl::UnavailableError("loopback listener shut down");
      connection = server->accepted++;
    }
    LBCC_ASSIGN_OR_RETURN(
        const BothEnds ends,
        SetUpInMemory(state_->options, client_name, *server, address, options, connection,
                      deadline));
    auto client = std::make_shared<Link>(state_->callbacks, absl::StrCat("loop:", address));
    auto accepted = std::make_shared<Link>(
        server->callbacks, absl::StrCat("loop:", address, "#", connection));
    for (int i = 0; i < ends.client.stripes; ++i) {
      auto client_lane = std::make_shared<LoopbackLane>(i, server->wire);
      auto server_lane = std::make_shared<LoopbackLane>(i, state_->wire);
      client_lane->Bind(accepted);
      server_lane->Bind(client);
      client->AddLane(client_lane);
      accepted->AddLane(server_lane);
    }
    client->Configure(ends.client.link_class, state_->options.scheduler,
                      state_->options.fast_chunk_bytes, ends.client.probe, ends.client.channel);
    accepted->Configure(ends.server.link_class, server->options.scheduler,
                        server->options.fast_chunk_bytes, ends.server.probe, ends.server.channel);
    client->AddRetries(retries);
    {
      MutexLock lock(&state_->mu);
      if (state_->shut_down) return absl::CancelledError("transport shut down");
      state_->links.push_back(client);
    }
    {
      MutexLock lock(&server->mu);
      if (server->shut_down) {
        client->Fail(absl::UnavailableError("loopback listener shut down"));
        return absl::UnavailableError("loopback listener shut down");
      }
      server->links.push_back(accepted);
      server->accept_queue.push_back(accepted);
    }
    return std::make_unique<LinkEndpoint>(client, state_);
  }

  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(absl::Duration timeout) override {
    MutexLock lock(&state_->mu);
    if (state_->shut_down) return absl::CancelledError("transport shut down");
    if (state_->name.empty()) return absl::FailedPreconditionError("not listening");
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
      return !state_->accept_queue.empty() || state_->shut_down;
    };
    if (!state_->mu.AwaitWithTimeout(ready, timeout)) {
      return absl::DeadlineExceededError("no connection to accept");
    }
    if (state_->shut_down) return absl::CancelledError("transport shut down");
    std::shared_ptr<Link> link = std::move(state_->accept_queue.front());
    state_->accept_queue.pop_front();
    return std::make_unique<LinkEndpoint>(std::move(link), state_);
  }

 private:
  std::shared_ptr<State> state_;
};

}  // namespace

std::unique_ptr<Transport> NewLoopbackTransport(const TransportOptions& options) {
  return std::make_unique<LoopbackTransport>(options);
}

}  // namespace lbcc::transport
