// The direct all-gather: every rank sends to every rank at once.
#include <memory>
#include <string>

#include "comm/algorithms/all_gather_task.h"

namespace lbcc::comm {
namespace {

using State = AllGatherTask::State;
using transport::Priority;
using transport::Tag;

// Every rank sends to every rank at once; gathered once every receive is in.
class DirectGather final : public State {
 public:
  using State::State;

 private:
  void Start() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    Join* received = NewJoin([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { Finish(absl::OkStatus()); });
    for (int i = 0; i < group_.size(); ++i) {
      if (i == group_.me) continue;
      Send(nullptr, i, tag_, &out_[group_.me]);
      RecvAny(received, i, tag_, &out_[i], max_bytes_);
    }
    Arm(received);
  }
};

}  // namespace

std::shared_ptr<AllGatherTask::State> NewDirectGather(const GatherParams& params) {
  return std::make_shared<DirectGather>(params);
}

}  // namespace lbcc::comm
