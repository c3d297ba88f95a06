// The UCX backend's lanes: UcxLane (one UCP endpoint, a Link's Lane), sending chunks and control
// messages, receiving them (active-message handlers, rendezvous fetches), closing endpoints and
// endpoint errors (transport/ucx_engine.h). Worker context throughout.
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "transport/ucx_engine.h"
#include "transport/wire_constants.h"

namespace lbcc::transport::ucx_internal {
namespace {

// A rendezvous chunk whose bytes are still at the sender.
class UcxDeferred final : public DeferredPayload {
 public:
  UcxDeferred(std::weak_ptr<Engine> engine, std::shared_ptr<Executor> executor,
              std::shared_ptr<UcxLane> lane, void* desc, size_t length)
      : engine_(std::move(engine)),
        executor_(std::move(executor)),
        lane_(std::move(lane)),
        desc_(desc),
        length_(length) {}

  ~UcxDeferred() override {
    if (consumed_) return;
    Run([lane = lane_, desc = desc_](Engine* engine) {
      // Releasing a rendezvous descriptor answers the sender through the endpoint it came on; once
      // that endpoint is destroyed the descriptor is left to the worker, which frees it.
      if (engine != nullptr && lane->ep != nullptr) ucp_am_data_release(engine->worker(), desc);
    });
  }

  void Fetch(uint8_t* dst, DoneCallback done) override {
    consumed_ = true;
    Run([lane = lane_, desc = desc_, dst, length = length_,
         done = std::move(done)](Engine* engine) mutable {
      if (engine == nullptr || lane->closed) {
        done(absl::CancelledError("connection closed before the chunk was fetched"));
        return;
      }
      auto* ctx = new RequestCtx;
      ctx->engine = engine;
      ctx->lane = lane;
      ctx->done = std::move(done);
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
        auto* ctx = static_cast<RequestCtx*>(user_data);
        ucp_request_free(request);
        if (status == UCS_OK) ctx->engine->HeardFrom(*ctx->lane);
        ctx->engine->CompleteRequest(ctx, status, "rendezvous receive");
      };
      param.user_data = ctx;
      engine->StartRequest(ucp_am_recv_data_nbx(engine->worker(), desc, dst, length, &param),
                           ctx, "rendezvous receive");
    });
  }

 private:
  template <typename Fn>
  void Run(Fn fn) {
    if (std::shared_ptr<Engine> engine = engine_.lock()) {
      engine->Submit([engine_ptr = engine.get(), fn = std::move(fn)](bool live) mutable {
        fn(live ? engine_ptr : nullptr);
      });
    } else {
      executor_->Post([fn = std::move(fn)]() mutable { fn(nullptr); });
    }
  }

  std::weak_ptr<Engine> engine_;
  std::shared_ptr<Executor> executor_;
  std::shared_ptr<UcxLane> lane_;
  void* desc_;
  size_t length_;
  bool consumed_ = false;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Sending.

void Engine::SendChunk(const std::shared_ptr<UcxLane>& lane, const ChunkHeader& header,
                       const uint8_t* data, size_t length, DoneCallback done) {
  if (lane->closed) {
    done(absl::CancelledError("connection closed"));
    return;
  }
  auto* ctx = new RequestCtx;
  ctx->engine = this;
  ctx->lane = lane;
  ctx->chunk_header = header;
  ctx->done = std::move(done);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  // Slow-link chunks go eagerly: a rendezvous would wait for the receiver's reply, which crosses
  // the sender's own down-link, behind whatever that link is delivering (on a busy shaped link,
  // tens of milliseconds per chunk). The slow-link window (credits) still bounds what is in
  // flight; the receiver keeps an eager chunk that no receive wants yet (Link parks it).
  // Fast-link chunks to another machine go eagerly too: the link is "fast" by the topology
  // (one island), but its reply still crosses a network whose queue may be full (a ring's
  // next step answers behind the step before it); the cost is the receiver's copy, which a
  // network link hides. Between processes of this machine a rendezvous saves that copy.
  const bool credited = (header.flags & kChunkNeedsCredit) != 0;
  ctx->eager = (credited || lane->other_machine) &&
               static_cast<int64_t>(length) <= options_.slow_eager_bytes;
  if (ctx->eager) param.flags |= UCP_AM_SEND_FLAG_EAGER;
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    auto* ctx = static_cast<RequestCtx*>(user_data);
    ucp_request_free(request);
    // A rendezvous send completes on the peer's acknowledgement: it is alive. (An eager one
    // completes once the bytes left this host.)
    if (status == UCS_OK && !ctx->eager) ctx->engine->HeardFrom(*ctx->lane);
    ctx->engine->CompleteRequest(ctx, status, "send");
  };
  param.user_data = ctx;
  StartRequest(ucp_am_send_nbx(lane->ep, kUcxAmData, &ctx->chunk_header, sizeof(ChunkHeader),
                               data, length, &param),
               ctx, "send");
}

void Engine::SendControl(const std::shared_ptr<UcxLane>& lane, ControlHeader header,
                         std::shared_ptr<std::vector<uint8_t>> payload, DoneCallback done) {
  if (lane->closed) {
    if (done) done(absl::CancelledError("connection closed"));
    return;
  }
  auto* ctx = new RequestCtx;
  ctx->engine = this;
  ctx->lane = lane;
  ctx->control_header = header;
  ctx->control_header.lane = static_cast<uint32_t>(std::max(lane->index, 0));
  ctx->control_header.version = kWireVersion;
  ctx->payload = std::move(payload);
  ctx->done = std::move(done);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    auto* ctx = static_cast<RequestCtx*>(user_data);
    ucp_request_free(request);
    ctx->engine->CompleteRequest(ctx, status, "control message");
  };
  param.user_data = ctx;
  const void* data = ctx->payload ? ctx->payload->data() : nullptr;
  const size_t length = ctx->payload ? ctx->payload->size() : 0;
  StartRequest(ucp_am_send_nbx(lane->ep, kUcxAmControl, &ctx->control_header,
                               sizeof(ControlHeader), data, length, &param),
               ctx, "control message");
}

void Engine::HeardFrom(const UcxLane& lane) {
  if (std::shared_ptr<Conn> conn = lane.conn.lock()) conn->watch.HeardFrom(absl::Now());
}

void Engine::CloseLane(const std::shared_ptr<UcxLane>& lane) {
  lane->closed = true;
  if (lane->ep == nullptr) return;
  lane->closed = true;
  ucp_ep_h ep = lane->ep;
  lane->ep = nullptr;
  eps_.erase(ep);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* request = ucp_ep_close_nbx(ep, &param);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) closing_.push_back(request);
  // A link whose connections are all closed is forgotten.
  if (std::shared_ptr<Conn> conn = lane->conn.lock()) {
    MutexLock lock(&ctl_mu_);
    bool any_open = false;
    for (auto& [index, other] : conn->lanes) any_open |= other != nullptr && !other->closed;
    if (!any_open && (conn->link == nullptr || conn->link->failed())) {
      conns_.erase({conn->id, conn->client});
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Incoming (worker context).

std::shared_ptr<UcxLane> Engine::LaneForEp(ucp_ep_h ep) {
  auto it = eps_.find(ep);
  if (it == eps_.end() || it->second->closed) return nullptr;
  return it->second;
}

namespace {

// The lane an active message came on, and its engine; null if unknown or closed.
std::shared_ptr<UcxLane> LaneOf(void* worker_arg, const ucp_am_recv_param_t* param,
                                Engine** engine) {
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return nullptr;
  WorkerClient* client = nullptr;
  std::shared_ptr<UcxLane> lane =
      static_cast<Worker*>(worker_arg)->LaneFor(param->reply_ep, &client);
  *engine = static_cast<Engine*>(client);  // Every client of the worker is an Engine.
  return lane;
}

}  // namespace

ucs_status_t Engine::OnAmData(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param) {
  Engine* engine = nullptr;
  std::shared_ptr<UcxLane> lane = LaneOf(arg, param, &engine);
  std::shared_ptr<Link> link = lane ? lane->link.lock() : nullptr;
  if (link == nullptr || header_length != sizeof(ChunkHeader)) return UCS_OK;  // Dropped.
  engine->HeardFrom(*lane);
  ChunkHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (h.length != length) {
    link->Fail(absl::DataLossError(absl::StrCat("chunk from ", lane->peer(), " announces ",
                                                h.length, " bytes and carries ", length)));
    return UCS_OK;
  }
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    link->OnChunk(lane->index, h, nullptr,
                  std::make_unique<UcxDeferred>(engine->weak_from_this(), engine->executor_, lane,
                                                data, length));
    return UCS_INPROGRESS;  // The descriptor is ours until fetched or released.
  }
  link->OnChunk(lane->index, h, static_cast<const uint8_t*>(data), nullptr);
  return UCS_OK;
}

ucs_status_t Engine::OnAmControl(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param) {
  Engine* engine = nullptr;
  std::shared_ptr<UcxLane> lane = LaneOf(arg, param, &engine);
  if (lane == nullptr || header_length != sizeof(ControlHeader)) return UCS_OK;
  engine->HeardFrom(*lane);
  ControlHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (static_cast<Ctl>(h.type) == Ctl::kProbeData &&
      (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    // Probe bytes must really cross the link: receive them into a scratch buffer first.
    auto* ctx = new RequestCtx;
    ctx->engine = engine;
    ctx->lane = lane;
    ctx->payload = engine->probe_scratch_.Get(length);
    ctx->done = [engine, lane, h](absl::Status status) {
      if (status.ok()) engine->HandleControl(lane, h);
    };
    ucp_request_param_t rparam{};
    rparam.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rparam.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
      auto* ctx = static_cast<RequestCtx*>(user_data);
      ucp_request_free(request);
      ctx->engine->CompleteRequest(ctx, status, "probe receive");
    };
    rparam.user_data = ctx;
    engine->StartRequest(ucp_am_recv_data_nbx(engine->worker_, data, ctx->payload->data(), length,
                                              &rparam),
                         ctx, "probe receive");
    return UCS_INPROGRESS;
  }
  engine->HandleControl(lane, h);
  return UCS_OK;
}

void Engine::HandleControl(const std::shared_ptr<UcxLane>& lane, const ControlHeader& h) {
  switch (static_cast<Ctl>(h.type)) {
    case Ctl::kCredit:
    case Ctl::kHeartbeat:  // HeardFrom() already noted it; the Link checks its tag.
      if (std::shared_ptr<Link> link = lane->link.lock()) link->OnControl(lane->index, h);
      return;
    default:
      break;
  }
  if (!IsSetupMessage(h.type)) {
    LBCC_LOG(WARN) << "unknown control message " << h.type << " from " << lane->peer();
    return;
  }
  HandleSetup(lane, h);
}

void Engine::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  // arg: the Worker. The endpoint's engine, if it still has the endpoint (a closed lane's
  // endpoint is out of its map).
  Engine* engine = nullptr;
  std::shared_ptr<UcxLane> lane;
  for (WorkerClient* client : static_cast<Worker*>(arg)->engines()) {
    auto* candidate = static_cast<Engine*>(client);  // Every client of the worker is an Engine.
    auto it = candidate->eps_.find(ep);
    if (it != candidate->eps_.end()) {
      engine = candidate;
      lane = it->second;
      break;
    }
  }
  if (engine == nullptr) return;
  // Say what happened to the peer, not only UCX's word for it ("Endpoint timeout" alone read as
  // a local timeout to users): the comm layer adds which rank that peer is.
  const char* what = "the connection failed";
  switch (status) {
    case UCS_ERR_ENDPOINT_TIMEOUT:
      what = "the peer stopped answering (its process died or froze, or the network failed)";
      break;
    case UCS_ERR_CONNECTION_RESET:
      what = "the peer closed or reset the connection (its process exited or aborted)";
      break;
    case UCS_ERR_UNREACHABLE:
      what = "the peer became unreachable";
      break;
    default:
      break;
  }
  const absl::Status error = absl::UnavailableError(absl::StrCat(
      "peer ", lane->peer(), " is lost: ", what, " (UCX: ", ucs_status_string(status), ")"));
  if (std::shared_ptr<Conn> conn = lane->conn.lock()) conn->setup->Fail(error);
  // No more UCX calls on the failed endpoint; queued work on it completes with Cancelled. The
  // endpoint itself is closed after this callback returns.
  lane->closed = true;
  // Failing the link first queues the release of its rendezvous descriptors ahead of the close.
  if (std::shared_ptr<Link> link = lane->link.lock()) link->Fail(error);
  engine->Submit([engine, lane](bool live) {
    if (live) engine->CloseLane(lane);
  });
}

}  // namespace lbcc::transport::ucx_internal
