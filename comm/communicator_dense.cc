// Communicator's dense methods (declared in communicator.h's dense block) and the any-source
// receives behind RecvAny. Each method checks what it can before posting, then runs the
// group-level function of collectives.h (comm/algorithms/) on the worker thread.
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "comm/algorithms/registry.h"
#include "comm/collectives.h"
#include "comm/communicator.h"

namespace lbcc::comm {
namespace {

using transport::Priority;
using transport::Tag;

// Dense point-to-point messages use their own step, next to compressed.cc's 0xffff.
constexpr uint32_t kDenseP2pStep = 0xfffe;

}  // namespace

// RecvAny's matching. A transport receive names its peer and cannot be withdrawn, so an
// any-source receive posts one receive ("slot", into a buffer of its own) on every peer that has
// no unclaimed slot for the tag yet, and takes the first slot to complete. Slots it did not take
// stay: each peer's slots are in that peer's message order, later RecvAny calls take the
// first unclaimed completed one (earliest completion first), and a Recv from that peer
// claims the peer's first unclaimed slot instead of posting its own receive (so messages are
// never taken out of order). Completions run on the transport's callback thread; the Link never
// calls back into this class with its own lock held except through the allocator, which touches
// only its slot.
class AnySourceReceives : public std::enable_shared_from_this<AnySourceReceives> {
 public:
  struct Receiver {
    void* data = nullptr;
    size_t bytes = 0;
    int* source = nullptr;  // RecvAny's; null for Recv
    RequestPtr request;
    std::shared_ptr<const AbortRecord> abort;  // a failure reads as the caller's abort, if first
  };

  // RecvAny: completes `receiver` from a completed slot, or queues it and posts the slots.
  void Any(Fabric* fabric, const std::vector<int>& ranks, int me, Tag wire_tag, uint32_t tag,
           Receiver receiver) {
    MutexLock lock(&mu_);
    TagState& state = tags_[tag];
    state.waiting.push_back(std::move(receiver));
    DrainLocked(state);
    if (state.waiting.empty()) return;
    for (int peer = 0; peer < static_cast<int>(ranks.size()); ++peer) {
      if (peer == me) continue;
      std::deque<std::shared_ptr<Slot>>& slots = state.by_peer[peer];
      const bool unclaimed = std::any_of(slots.begin(), slots.end(), [](const auto& slot) {
        return !slot->claimed.has_value();
      });
      if (unclaimed) continue;
      auto slot = std::make_shared<Slot>();
      slot->peer = peer;
      slots.push_back(slot);
      // Posted under mu_ so that slots are posted in each peer's deque order; the transport
      // never completes a receive inside Recv (transport.h).
      fabric->in(ranks[peer])->Recv(
          wire_tag,
          [slot](size_t size) -> absl::StatusOr<absl::Span<uint8_t>> {
            slot->bytes.resize(size);
            return absl::Span<uint8_t>(slot->bytes.data(), size);
          },
          [self = shared_from_this(), slot, tag](absl::StatusOr<size_t> n) {
            self->Completed(slot, tag, n.status());
          });
    }
  }

  // Recv: true when `peer` has a slot for `tag` not yet claimed; the first such slot then
  // delivers to this receive (now, or when it completes).
  bool TakeFromPeer(void* data, size_t bytes, int peer, uint32_t tag, RequestPtr request,
                    std::shared_ptr<const AbortRecord> abort) {
    MutexLock lock(&mu_);
    auto t = tags_.find(tag);
    if (t == tags_.end()) return false;
    auto p = t->second.by_peer.find(peer);
    if (p == t->second.by_peer.end()) return false;
    for (const std::shared_ptr<Slot>& slot : p->second) {
      if (slot->claimed.has_value()) continue;
      slot->claimed = Receiver{data, bytes, nullptr, std::move(request), std::move(abort)};
      DrainLocked(t->second);
      return true;
    }
    return false;
  }

 private:
  struct Slot {
    int peer = 0;
    std::vector<uint8_t> bytes;         // written by the allocator and the transport only
    bool done = false;
    absl::Status status;
    uint64_t order = 0;                 // completion order, for any-source fairness
    std::optional<Receiver> claimed;    // a Recv that takes this slot
  };
  struct TagState {
    std::map<int, std::deque<std::shared_ptr<Slot>>> by_peer;  // in each peer's message order
    std::deque<Receiver> waiting;                              // RecvAny, in call order
  };

  void Completed(const std::shared_ptr<Slot>& slot, uint32_t tag, absl::Status status) {
    MutexLock lock(&mu_);
    slot->done = true;
    slot->status = std::move(status);
    slot->order = ++completions_;
    DrainLocked(tags_[tag]);
  }

  static void Deliver(Slot& slot, Receiver& receiver) {
    absl::Status status = slot.status;
    if (status.ok() && slot.bytes.size() != receiver.bytes) {
      status = absl::DataLossError(absl::StrCat("DenseRecv: rank ", slot.peer, " sent ",
                                                slot.bytes.size(), " bytes, the buffer holds ",
                                                receiver.bytes));
    } else if (status.ok()) {
      if (receiver.bytes > 0) std::memcpy(receiver.data, slot.bytes.data(), receiver.bytes);
      if (receiver.source != nullptr) *receiver.source = slot.peer;
    } else {
      if (receiver.abort != nullptr) status = receiver.abort->Explain(std::move(status));
      status = Annotate(status, receiver.source != nullptr ? "DenseRecvAny" : "DenseRecv");
    }
    receiver.request->Complete(std::move(status));
  }

  void DrainLocked(TagState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Claimed slots deliver to their Recv once complete.
    for (auto& [peer, slots] : state.by_peer) {
      for (auto it = slots.begin(); it != slots.end();) {
        if ((*it)->done && (*it)->claimed.has_value()) {
          Deliver(**it, *(*it)->claimed);
          it = slots.erase(it);
        } else {
          ++it;
        }
      }
    }
    // Waiting any-source receives take each peer's first unclaimed slot, earliest completion
    // first (claimed slots always precede unclaimed ones in a peer's deque).
    while (!state.waiting.empty()) {
      std::deque<std::shared_ptr<Slot>>* best = nullptr;
      std::deque<std::shared_ptr<Slot>>::iterator best_it;
      for (auto& [peer, slots] : state.by_peer) {
        auto it = std::find_if(slots.begin(), slots.end(),
                               [](const auto& slot) { return !slot->claimed.has_value(); });
        if (it == slots.end() || !(*it)->done) continue;
        if (best == nullptr || (*it)->order < (*best_it)->order) {
          best = &slots;
          best_it = it;
        }
      }
      if (best == nullptr) return;
      Deliver(**best_it, state.waiting.front());
      state.waiting.pop_front();
      best->erase(best_it);
    }
  }

  Mutex mu_;
  std::map<uint32_t, TagState> tags_ ABSL_GUARDED_BY(mu_);
  uint64_t completions_ ABSL_GUARDED_BY(mu_) = 0;
};

std::shared_ptr<AnySourceReceives> NewAnySourceReceives() {
  return std::make_shared<AnySourceReceives>();
}

// Communicator methods (declared in communicator.h's dense block). Each checks what it can
// before posting, then runs the group-level function above on the worker thread; with
// options.verify, a fingerprint exchange comes first (tag steps 0..1; the op uses 0x100 up).
namespace {

constexpr uint32_t kVerifiedStepBase = 0x100;

// The signature checked on every rank before the operation runs (comm/signature.h).
Signature ReduceSignature(const Communicator& comm, absl::string_view name, size_t count,
                          DType type, ReduceOp op, int root) {
  Signature signature = comm.NewSignature(name);
  signature.Add("dtype", TorchDTypeName(type))
      .Add("count", static_cast<int64_t>(count))
      .Add("reduce op", ReduceOpName(op))
      .Add("root", root);
  return signature;
}

Signature BytesSignature(const Communicator& comm, absl::string_view name, size_t bytes,
                         int root) {
  Signature signature = comm.NewSignature(name);
  signature.Add("bytes", static_cast<int64_t>(bytes)).Add("root", root);
  return signature;
}

std::string Fingerprint(absl::string_view name, size_t count, DType type, ReduceOp op, int root) {
  return absl::StrCat(name, "(count=", count, ", dtype=", TorchDTypeName(type),
                      ", op=", ReduceOpName(op), ", root=", root, ")");
}

}  // namespace

namespace {
// Wraps a group-level function with the optional fingerprint check.
Communicator::Op Verified(bool verify, std::string fingerprint,
                          std::function<absl::Status(const Group&, Tag, absl::Time)> run) {
  return [verify, fingerprint = std::move(fingerprint), run = std::move(run)](
             const Group& group, Tag tag, absl::Time deadline) -> absl::Status {
    if (!verify || group.size() == 1) return run(group, tag, deadline);
    LBCC_RETURN_IF_ERROR(VerifyFingerprints(group, tag, fingerprint, deadline));
    return run(group, tag + kVerifiedStepBase, deadline);
  };
}

absl::Status CheckPointers(absl::string_view name, const void* in, const void* out,
                           size_t bytes) {
  if (bytes > 0 && (in == nullptr || out == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": null buffer for ", bytes, " bytes"));
  }
  return absl::OkStatus();
}
}  // namespace

RequestPtr Communicator::AllReduce(const void* in, void* out, size_t count, DType type, ReduceOp op,
                                   OpOptions options) {
  absl::Status check = CheckReduceOp(type, op);
  if (check.ok()) check = CheckPointers("DenseAllReduce", in, out, count);
  if (!check.ok()) return PostRejected("DenseAllReduce", check);
  // The selection table (or the configured or requested algorithm) chooses, as for AllReduce.
  const size_t bytes = count * DTypeSize(type);
  absl::StatusOr<Algorithm> chosen =
      ChooseAlgorithm(Collective::kAllReduce, group_, bytes, options.algorithm);
  if (!chosen.ok()) return PostRejected("DenseAllReduce", chosen.status());
  // The algorithm's row (comm/algorithms/registry.h): ChooseAlgorithm checked that it has one.
  const AlgorithmEntry& entry = *FindAlgorithm(*chosen);
  Signature signature = ReduceSignature(*this, "DenseAllReduce", count, type, op, -1);
  signature.Add("algorithm", AlgorithmName(*chosen));
  if (entry.all_reduce_with_header != nullptr && !options.verify && bytes <= kMaxHeaderData) {
    // One round, the operation header in it.
    return PostWithHeader(
        std::move(signature),
        [=, run = entry.all_reduce_with_header](const Group& g, Tag tag, uint64_t sequence,
                                                const Signature& signature, absl::Time deadline) {
          return run(g, tag, sequence, signature, in, out, count, type, op, deadline);
        },
        options.timeout);
  }
  return Post(std::move(signature),
              Verified(options.verify, Fingerprint("allreduce", count, type, op, -1),
                       [=, run = entry.all_reduce](const Group& g, Tag tag, absl::Time deadline) {
                         return run(g, tag, in, out, count, type, op, options.priority, deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::Reduce(const void* in, void* out, size_t count, DType type, ReduceOp op,
                                int root, OpOptions options) {
  absl::Status check = CheckReduceOp(type, op);
  if (check.ok()) check = CheckRoot(root, nranks(), "DenseReduce");
  if (check.ok()) check = CheckPointers("DenseReduce", in, rank() == root ? out : in, count);
  if (!check.ok()) return PostRejected("DenseReduce", check);
  return Post(ReduceSignature(*this, "DenseReduce", count, type, op, root),
              Verified(options.verify, Fingerprint("reduce", count, type, op, root),
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         return ReduceRing(g, tag, in, out, count, type, op, root, options.priority,
                                           deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::ReduceScatter(const void* in, void* out, size_t count, DType type,
                                       ReduceOp op, OpOptions options) {
  absl::Status check = CheckReduceOp(type, op);
  if (check.ok()) check = CheckPointers("DenseReduceScatter", in, out, count);
  if (!check.ok()) return PostRejected("DenseReduceScatter", check);
  return Post(ReduceSignature(*this, "DenseReduceScatter", count, type, op, -1),
              Verified(options.verify, Fingerprint("reduce_scatter", count, type, op, -1),
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         return ReduceScatterRing(g, tag, in, out, count, type, op,
                                                  options.priority, deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::AllToAll(const void* in, void* out, AllToAllLayout layout,
                                  OpOptions options) {
  auto shared = std::make_shared<AllToAllLayout>(std::move(layout));
  // Ranks may send different sizes to different peers, so the fingerprint holds only the name.
  return Post(NewSignature("DenseAllToAll"),
              Verified(options.verify, "alltoall",
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         return AllToAllDirect(g, tag, in, out, *shared, options.priority,
                                               deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::AllGather(const void* in, void* out, size_t bytes, OpOptions options) {
  absl::Status check = CheckPointers("DenseAllGather", in, out, bytes);
  if (!check.ok()) return PostRejected("DenseAllGather", check);
  auto shared = std::make_shared<AllToAllLayout>(AllGatherLayout(nranks(), bytes));
  return Post(BytesSignature(*this, "DenseAllGather", bytes, -1),
              Verified(options.verify, absl::StrCat("allgather(bytes=", bytes, ")"),
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         return AllToAllDirect(g, tag, in, out, *shared, options.priority,
                                               deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::Gather(const void* in, void* out, size_t bytes, int root,
                                OpOptions options) {
  absl::Status check = CheckRoot(root, nranks(), "DenseGather");
  if (check.ok()) check = CheckPointers("DenseGather", in, rank() == root ? out : in, bytes);
  if (!check.ok()) return PostRejected("DenseGather", check);
  return Post(BytesSignature(*this, "DenseGather", bytes, root),
              Verified(options.verify, absl::StrCat("gather(bytes=", bytes, ", root=", root, ")"),
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         return GatherDirect(g, tag, in, out, bytes, root, options.priority,
                                             deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::Scatter(const void* in, void* out, size_t bytes, int root,
                                 OpOptions options) {
  absl::Status check = CheckRoot(root, nranks(), "DenseScatter");
  if (check.ok()) check = CheckPointers("DenseScatter", rank() == root ? in : out, out, bytes);
  if (!check.ok()) return PostRejected("DenseScatter", check);
  return Post(BytesSignature(*this, "DenseScatter", bytes, root),
              Verified(options.verify, absl::StrCat("scatter(bytes=", bytes, ", root=", root, ")"),
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         return ScatterDirect(g, tag, in, out, bytes, root, options.priority,
                                              deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::Broadcast(void* buffer, size_t bytes, int root, OpOptions options) {
  absl::Status check = CheckRoot(root, nranks(), "DenseBroadcast");
  if (check.ok()) check = CheckPointers("DenseBroadcast", buffer, buffer, bytes);
  if (!check.ok()) return PostRejected("DenseBroadcast", check);
  return Post(BytesSignature(*this, "DenseBroadcast", bytes, root),
              Verified(options.verify,
                       absl::StrCat("broadcast(bytes=", bytes, ", root=", root, ")"),
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         return comm::Broadcast(g, tag, buffer, bytes, root, options.priority,
                                                deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::Send(const void* data, size_t bytes, int peer, uint32_t tag) {
  if (peer < 0 || peer >= nranks() || peer == rank() || (bytes > 0 && data == nullptr)) {
    return CompletedRequest(absl::InvalidArgumentError(
        absl::StrCat("DenseSend: bad peer ", peer, " or null buffer (rank ", rank(), " of ",
                     nranks(), ")")));
  }
  absl::Status status = fabric_->aborted();
  if (!status.ok()) {
    return CompletedRequest(absl::FailedPreconditionError(
        absl::StrCat("DenseSend: the communicator failed earlier: ", status.ToString())));
  }
  auto request = std::make_shared<Request>();
  fabric_->out(group_.ranks[peer])
      ->Send(MakeTag(comm_id_, tag, kDenseP2pStep), RawBytes(data, bytes),
             {transport::Priority::kNormal},
             [request, abort = fabric_->abort_record()](absl::Status status) {
               status = abort->Explain(std::move(status));
               if (!status.ok()) status = Annotate(status, "DenseSend");
               request->Complete(std::move(status));
             });
  return request;
}

RequestPtr Communicator::Recv(void* data, size_t bytes, int peer, uint32_t tag) {
  if (peer < 0 || peer >= nranks() || peer == rank() || (bytes > 0 && data == nullptr)) {
    return CompletedRequest(absl::InvalidArgumentError(
        absl::StrCat("DenseRecv: bad peer ", peer, " or null buffer (rank ", rank(), " of ",
                     nranks(), ")")));
  }
  absl::Status status = fabric_->aborted();
  if (!status.ok()) {
    return CompletedRequest(absl::FailedPreconditionError(
        absl::StrCat("DenseRecv: the communicator failed earlier: ", status.ToString())));
  }
  auto request = std::make_shared<Request>();
  // A RecvAny may have posted receives on this peer for this tag first: they come first.
  if (any_source_->TakeFromPeer(data, bytes, peer, tag, request, fabric_->abort_record())) {
    return request;
  }
  fabric_->in(group_.ranks[peer])
      ->Recv(
          MakeTag(comm_id_, tag, kDenseP2pStep),
          [data, bytes](size_t size) -> absl::StatusOr<absl::Span<uint8_t>> {
            if (size != bytes) {
              return absl::DataLossError(absl::StrCat("DenseRecv: the peer sent ", size,
                                                      " bytes, the buffer holds ", bytes));
            }
            return RawBytes(data, bytes);
          },
          [request, abort = fabric_->abort_record()](absl::StatusOr<size_t> n) {
            absl::Status status = abort->Explain(n.status());
            if (!status.ok()) status = Annotate(status, "DenseRecv");
            request->Complete(std::move(status));
          });
  return request;
}

RequestPtr Communicator::RecvAny(void* data, size_t bytes, uint32_t tag, int* source) {
  if ((bytes > 0 && data == nullptr) || source == nullptr) {
    return CompletedRequest(absl::InvalidArgumentError(
        absl::StrCat("DenseRecvAny: null buffer or source (rank ", rank(), " of ", nranks(), ")")));
  }
  if (nranks() == 1) {
    return CompletedRequest(absl::InvalidArgumentError(
        "DenseRecvAny: a communicator of one rank has no peer to receive from"));
  }
  absl::Status status = fabric_->aborted();
  if (!status.ok()) {
    return CompletedRequest(absl::FailedPreconditionError(
        absl::StrCat("DenseRecvAny: the communicator failed earlier: ", status.ToString())));
  }
  auto request = std::make_shared<Request>();
  any_source_->Any(fabric_.get(), group_.ranks, group_.me, MakeTag(comm_id_, tag, kDenseP2pStep),
                   tag,
                   AnySourceReceives::Receiver{data, bytes, source, request,
                                               fabric_->abort_record()});
  return request;
}

}  // namespace lbcc::comm
