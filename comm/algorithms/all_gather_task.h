// AllGatherTask's state machine (collectives.h), which every all-gather algorithm extends:
// comm/algorithms/direct_all_gather.cc, ring_all_gather.cc and hierarchical_all_gather.cc each
// implement Start() and are registered in the algorithm table (table.cc). Internal to comm/.
//
// Thread-safety: see State below (algorithm code runs under step_mu_).
#ifndef LBCC_COMM_ALGORITHMS_ALL_GATHER_TASK_H_
#define LBCC_COMM_ALGORITHMS_ALL_GATHER_TASK_H_

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "comm/algorithms/registry.h"
#include "comm/collectives.h"

namespace lbcc::comm {

namespace all_gather_internal {
inline absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}
}  // namespace all_gather_internal

// The machinery every all-gather algorithm runs on. Operations go to the Fabric's endpoints in
// joins; a join's continuation runs once all of its operations completed OK, on the thread of
// the last completion (a transport thread, where it may post but must not block), or inline in
// Arm() when they all completed before. Algorithm code (Start and the continuations) runs under
// step_mu_, so it needs no locking of its own. The first failed operation aborts the Fabric,
// as Batch::Wait does, and stops the continuations; the task is done once its operations drained.
class AllGatherTask::State : public std::enable_shared_from_this<AllGatherTask::State> {
 public:
  explicit State(const GatherParams& p)
      : group_(p.group),
        tag_(p.tag),
        priority_(p.priority),
        max_bytes_(p.max_bytes),
        deadline_(p.deadline) {}
  virtual ~State() = default;

  void Launch(std::string mine) {
    out_.assign(group_.size(), std::string());
    out_[group_.me] = std::move(mine);
    MutexLock step(&step_mu_);
    if (group_.size() == 1) {
      Finish(absl::OkStatus());
      return;
    }
    Start();
  }

  bool Done() const {
    MutexLock lock(&mu_);
    return DoneLocked();
  }

  // Waits until the payloads are in (`gathered_only`) or until every operation completed, or
  // the deadline; after a failure, until no callback can touch the task any more.
  absl::Status Await(bool gathered_only) {
    bool timed_out = false;
    {
      MutexLock lock(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !error_.ok() || (finished_ && (gathered_only || ops_ == 0));
      };
      while (!ready()) {
        if (cv_.WaitWithDeadline(&mu_, deadline_) && !ready()) {
          error_ = NoAnswerError(receives_, sends_);
          timed_out = true;
          break;
        }
      }
      if (error_.ok()) return result_;
    }
    // Fail fast everywhere (the first failed operation aborted already); closing the endpoints
    // fails what is still pending here, so the drain below ends.
    if (timed_out) group_.fabric->Abort(error_status());
    MutexLock lock(&mu_);
    while (ops_ > 0) cv_.Wait(&mu_);
    return error_;
  }

  std::vector<std::string>& out() { return out_; }

 protected:
  // A set of operations and what runs once all completed OK. `pending` counts the operations
  // not yet completed, plus one until Arm().
  struct Join {
    int pending = 1;
    absl::AnyInvocable<void()> then;
  };

  virtual void Start() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) = 0;

  Join* NewJoin(absl::AnyInvocable<void()> then) ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    joins_.emplace_back();
    joins_.back().then = std::move(then);
    return &joins_.back();
  }
  // Posts are counted before they are issued, so no completion can find a join at zero early.
  // `data` and `into` must live as long as the task (members of the algorithm or out_).
  void Send(Join* join, int index, transport::Tag tag, const std::string* data)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    const int peer = group_.ranks[index];
    Count(join, peer, /*receive=*/false);
    group_.fabric->out(peer)->Send(tag, all_gather_internal::Bytes(*data), {priority_},
                                   [self = shared_from_this(), join, peer](absl::Status s) {
                                     if (!s.ok())
                                       s = Annotate(s, absl::StrCat("send to rank ", peer));
                                     self->OpDone(join, std::move(s), peer, false);
                                   });
  }
  void RecvAny(Join* join, int index, transport::Tag tag, std::string* into, size_t max_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    const int peer = group_.ranks[index];
    Count(join, peer, /*receive=*/true);
    group_.fabric->in(peer)->Recv(
        tag,
        [into, max_bytes](size_t size) -> absl::StatusOr<absl::Span<uint8_t>> {
          if (size > max_bytes) {
            return absl::DataLossError(
                absl::StrCat("message of ", size, " bytes exceeds the limit of ", max_bytes));
          }
          into->resize(size);
          return absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(into->data()), size);
        },
        [self = shared_from_this(), join, peer](absl::StatusOr<size_t> n) {
          absl::Status s = n.status();
          if (!s.ok()) s = Annotate(s, absl::StrCat("receive from rank ", peer));
          self->OpDone(join, std::move(s), peer, true);
        });
  }
  // Everything of `join` is posted: its continuation may run (at once, if all completed).
  void Arm(Join* join) ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    bool fire = false;
    {
      MutexLock lock(&mu_);
      fire = --join->pending == 0 && error_.ok();
    }
    if (fire) join->then();
  }
  // The algorithm's end: the payloads are in place (OK), or what it found wrong in them.
  void Finish(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    MutexLock lock(&mu_);
    finished_ = true;
    result_ = std::move(status);
    cv_.SignalAll();
  }

  const Group group_;
  const transport::Tag tag_;
  const transport::Priority priority_;
  const size_t max_bytes_;
  std::vector<std::string> out_;  // written by receives and algorithm code, read after Finish
  Mutex step_mu_;

 private:
  bool DoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ops_ == 0 && (finished_ || !error_.ok());
  }
  absl::Status error_status() {
    MutexLock lock(&mu_);
    return error_;
  }
  void Count(Join* join, int peer, bool receive) {
    MutexLock lock(&mu_);
    ++ops_;
    if (join != nullptr) ++join->pending;
    std::vector<int>& by_rank = receive ? receives_ : sends_;
    if (static_cast<size_t>(peer) >= by_rank.size()) by_rank.resize(peer + 1, 0);
    ++by_rank[peer];
  }
  void OpDone(Join* join, absl::Status status, int peer, bool receive) {
    bool fire = false;
    bool abort = false;
    {
      MutexLock lock(&mu_);
      --(receive ? receives_ : sends_)[peer];
      if (!status.ok() && error_.ok()) {
        error_ = status;
        abort = true;
      }
      fire = join != nullptr && --join->pending == 0 && error_.ok();
      if (!fire) --ops_;  // a firing operation stays counted until its continuation ran
      cv_.SignalAll();
    }
    if (abort) group_.fabric->Abort(status);
    if (!fire) return;
    {
      MutexLock step(&step_mu_);
      join->then();
    }
    MutexLock lock(&mu_);
    --ops_;
    cv_.SignalAll();
  }

  const absl::Time deadline_;
  std::deque<Join> joins_ ABSL_GUARDED_BY(step_mu_);  // stable addresses
  mutable Mutex mu_;
  CondVar cv_;
  int ops_ ABSL_GUARDED_BY(mu_) = 0;  // posted, not completed (or continuing)
  // Per peer (its rank in the Fabric): receives and sends not completed yet, for the timeout.
  std::vector<int> receives_ ABSL_GUARDED_BY(mu_), sends_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // the first failed operation, or the deadline
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status result_ ABSL_GUARDED_BY(mu_);  // Finish()'s verdict
};

// The algorithms' state machines, as registered in the algorithm table (table.cc).
std::shared_ptr<AllGatherTask::State> NewDirectGather(const GatherParams& params);
std::shared_ptr<AllGatherTask::State> NewRingGather(const GatherParams& params);
std::shared_ptr<AllGatherTask::State> NewHierarchicalGather(const GatherParams& params);

}  // namespace lbcc::comm

#endif  // LBCC_COMM_ALGORITHMS_ALL_GATHER_TASK_H_
