// The ring all-gather: N-1 neighbour steps.
#include <memory>
#include <string>

#include "comm/algorithms/all_gather_task.h"

namespace lbcc::comm {
namespace {

using State = AllGatherTask::State;
using transport::Priority;
using transport::Tag;

// N-1 steps: pass to the right what came from the left one step earlier.
class RingGather final : public State {
 public:
  using State::State;

 private:
  void Start() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) { Step(0); }
  void Step(int step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    const int n = group_.size();
    if (step == n - 1) {
      Finish(absl::OkStatus());
      return;
    }
    const int send_index = (group_.me - step + n) % n;
    const int recv_index = (group_.me - step - 1 + n) % n;
    Join* join = NewJoin([this, step]() ABSL_NO_THREAD_SAFETY_ANALYSIS { Step(step + 1); });
    Send(join, (group_.me + 1) % n, tag_ + step, &out_[send_index]);
    RecvAny(join, (group_.me + n - 1) % n, tag_ + step, &out_[recv_index], max_bytes_);
    Arm(join);
  }
};

}  // namespace

std::shared_ptr<AllGatherTask::State> NewRingGather(const GatherParams& params) {
  return std::make_shared<RingGather>(params);
}

}  // namespace lbcc::comm
