// ElasticGroup::Impl (elastic.h): one member's state, shared by the files that implement it:
//   group.cc         joining and leaving, the master's messages (a MasterLink::Listener)
//   group_epochs.cc  epoch building: a Communicator per announced epoch, on a thread of its own
//                    (set-up overlaps the trainer's inner steps), superseded ones retired
//   group_step.cc    the elastic step: acquire the epoch's communicator, run a phase (sync,
//                    step, forward), report it, wait for the master's decision, commit or roll
//                    back
// What moves over the communicator besides the step is in shared_state.h; the connection to
// the master in master_link.h.
//
// Thread-safety: the caller's calls come from one thread; the link's reader and heartbeat
// threads and the epochs' set-up threads share the state below under mu_.
#ifndef LBCC_COMM_ELASTIC_GROUP_IMPL_H_
#define LBCC_COMM_ELASTIC_GROUP_IMPL_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "comm/elastic/deferred_codec.h"
#include "comm/elastic/elastic.h"
#include "comm/elastic/master_link.h"
#include "comm/elastic/shared_state.h"
#include "comm/elastic/wire.h"

namespace lbcc::comm {

class ElasticGroup::Impl : public std::enable_shared_from_this<ElasticGroup::Impl>,
                           private elastic::MasterLink::Listener {
 public:
  Impl(ElasticOptions options, std::vector<TensorView> shared);
  ~Impl() override;

  // group.cc
  absl::Status Join();
  absl::Status Leave();
  uint64_t epoch();
  bool AwaitEpoch(uint64_t n, absl::Duration timeout);
  int rank();
  int size();
  uint64_t step();
  ElasticStats stats();
  std::shared_ptr<Communicator> communicator();

  // group_step.cc
  absl::Status Boundary();
  absl::Status SparseAllReduce(const std::vector<Communicator::SparseTensor>& tensors,
                               const codecs::Codec* codec, codecs::DecodeOptions decode);

 private:
  struct EpochInfo {
    uint64_t epoch = 0;
    int rank = 0, nranks = 0;
    UniqueId id{};
    std::vector<uint32_t> needs_state;
    std::vector<std::string> names;
    std::string reason;
    uint64_t parent_epoch = 0;  // derived from this epoch's communicator (0: built anew)
    std::vector<int> parent_ranks;
    bool forward = false;  // forward_source sends step forward_step's result to forward_to
    uint64_t forward_step = 0;
    int forward_source = 0;
    std::vector<uint32_t> forward_to;
  };
  // A member whose exchange of `step` failed, waiting to receive its result.
  struct ForwardTarget {
    uint64_t epoch = 0, step = 0;
    const std::vector<Communicator::SparseTensor>* tensors = nullptr;
    bool done = false;
  };
  // A step this member committed before the master decided it: its result, kept until every
  // member has the step (the master may ask this member to forward it).
  struct Held {
    uint64_t epoch = 0, step = 0;
    std::vector<TensorView> out;  // the caller's `out` tensors of that call
  };
  struct Acquired {
    std::shared_ptr<Communicator> comm;
    EpochInfo info;
    uint64_t step = 0;
  };
  using DecisionKey = std::tuple<uint64_t, int, uint64_t>;  // epoch, phase, step
  static DecisionKey Key(uint64_t epoch, elastic::Phase phase, uint64_t step) {
    return DecisionKey(epoch, static_cast<int>(phase), step);
  }

  // group.cc: the master's messages (MasterLink::Listener) and failing for good.
  absl::Status CheckOptions() const;
  bool OnMessage(const elastic::Message& m) override;
  void OnClosed(const absl::Status& why) override;
  void OnSilent(absl::Duration silent) override;
  void FailLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MasterLost(absl::string_view how) const;
  void AwaitLastDecisionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // group_epochs.cc
  bool OnEpochLocked(const elastic::Message& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnDecisionLocked(const elastic::Message& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BuildEpoch(const EpochInfo& info, const std::shared_ptr<Communicator>& parent,
                  const std::shared_ptr<Cancellation>& cancel);
  // Stops the newest epoch's set-up if it still runs (superseded, left, failed for good).
  void CancelSetupLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetireLocked(std::shared_ptr<Communicator> comm) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // group_step.cc
  absl::StatusOr<Acquired> Acquire(ForwardTarget* target = nullptr);
  absl::Status TakeEpochLocked(ForwardTarget* target, Acquired* a, bool* enter, bool* forward)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SettleHeldLocked(absl::Time deadline, absl::Duration limit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ForwardStep(const Acquired& a, ForwardTarget* target);
  bool AwaitDecisionLocked(const DecisionKey& key, uint64_t epoch, elastic::Phase phase,
                           uint64_t step, bool or_new_epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BeginPhase(const Acquired& a);
  void EndPhase();
  void Report(const Acquired& a, elastic::Phase phase, uint64_t step, const absl::Status& local);
  template <typename Body>
  absl::Status RunPhase(const Acquired& a, elastic::Phase phase, Body body);
  absl::Status AwaitPhaseDecision(const Acquired& a, elastic::Phase phase,
                                  const absl::Status& local, absl::Duration ran);
  absl::Status FailedStep(const Acquired& a, const std::vector<Communicator::SparseTensor>& wrapped,
                          const absl::Status& local,
                          std::vector<std::unique_ptr<elastic::DeferredState>>& states);

  ElasticOptions options_;
  elastic::SharedState state_;
  absl::Duration peer_timeout_;
  absl::Duration setup_timeout_;
  std::unique_ptr<elastic::MasterLink> link_;

  Mutex mu_;
  bool left_ ABSL_GUARDED_BY(mu_) = false;
  bool reader_done_ ABSL_GUARDED_BY(mu_) = false;  // after Leave(): the master closed
  bool in_phase_ ABSL_GUARDED_BY(mu_) = false;  // an operation runs on comm_ (BeginPhase)
  // Aborted while a phase ran on them: their control connections close when it ends.
  std::vector<std::shared_ptr<Communicator>> close_after_phase_ ABSL_GUARDED_BY(mu_);
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  EpochInfo info_ ABSL_GUARDED_BY(mu_);   // the newest epoch announced
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;  // committed outer steps of the job
  uint64_t expect_after_ ABSL_GUARDED_BY(mu_) = 0;  // a decision announced a newer epoch
  uint64_t entered_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // the newest epoch told to the master
  std::optional<Held> held_ ABSL_GUARDED_BY(mu_);
  bool held_forwarding_ ABSL_GUARDED_BY(mu_) = false;  // held_ is to be forwarded
  std::shared_ptr<Communicator> comm_ ABSL_GUARDED_BY(mu_);
  uint64_t comm_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status setup_status_ ABSL_GUARDED_BY(mu_);
  // The newest epoch's set-up (Communicator::Init's): cancelled when a newer epoch supersedes
  // it, so its bootstrap and connections stop at once instead of at the set-up timeout.
  std::shared_ptr<Cancellation> setup_cancel_ ABSL_GUARDED_BY(mu_);
  std::map<DecisionKey, elastic::Message> decisions_ ABSL_GUARDED_BY(mu_);
  ElasticStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lbcc::comm

#endif  // LBCC_COMM_ELASTIC_GROUP_IMPL_H_
