// AllGatherTask (collectives.h): posts the state machine of the algorithm's row in the
// algorithm table (registry.h), and AllGatherV, its blocking form.
#include "comm/algorithms/all_gather_task.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/algorithms/registry.h"

namespace lbcc::comm {
namespace {

using State = AllGatherTask::State;
using transport::Priority;
using transport::Tag;

// Algorithm::kAuto reaching the collectives is our bug.
class UnresolvedGather final : public State {
 public:
  using State::State;

 private:
  void Start() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    Finish(absl::InternalError("AllGatherV: algorithm not resolved"));
  }
};

}  // namespace

std::unique_ptr<AllGatherTask> AllGatherTask::Post(const Group& group, Tag tag, std::string mine,
                                                   Algorithm algorithm, Priority priority,
                                                   absl::Time deadline, size_t max_bytes) {
  const GatherParams params{group, tag, priority, deadline, max_bytes};
  const AlgorithmEntry* entry = FindAlgorithm(algorithm);
  std::shared_ptr<State> state = entry != nullptr && entry->all_gather != nullptr
                                     ? entry->all_gather(params)
                                     : std::make_shared<UnresolvedGather>(params);
  state->Launch(std::move(mine));
  return std::unique_ptr<AllGatherTask>(new AllGatherTask(std::move(state)));
}

AllGatherTask::~AllGatherTask() { (void)state_->Await(/*gathered_only=*/false); }

bool AllGatherTask::Test() const { return state_->Done(); }

absl::Status AllGatherTask::WaitGathered() { return state_->Await(/*gathered_only=*/true); }

absl::Status AllGatherTask::Wait() { return state_->Await(/*gathered_only=*/false); }

std::vector<std::string>& AllGatherTask::result() { return state_->out(); }

absl::Status AllGatherV(const Group& group, Tag tag, const std::string& mine,
                        std::vector<std::string>* out, Algorithm algorithm, Priority priority,
                        absl::Time deadline, size_t max_bytes) {
  std::unique_ptr<AllGatherTask> task =
      AllGatherTask::Post(group, tag, mine, algorithm, priority, deadline, max_bytes);
  absl::Status status = task->Wait();
  *out = std::move(task->result());
  return status;
}

}  // namespace lbcc::comm
