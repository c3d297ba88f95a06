// What an elastic member moves over an epoch's communicator besides the step itself: the shared
// state a newcomer receives at Boundary() (every member's XXH3 hash compared first, then the
// state from the best-linked holder, zstd-compressed over slow links where that is smaller),
// and a step's result forwarded to members whose exchange of it failed.
//
// Errors: DataLoss (states that differ, a bad header, a body that does not decompress or match
// its hash), InvalidArgument (this member's state has another size than the job's),
// FailedPrecondition (no member holds the state), and the communicator's own (Aborted after an
// operation ran past the op timeout).
//
// Thread-safety: a SharedState is used by one thread at a time (the group's caller).
#ifndef LBCC_COMM_ELASTIC_SHARED_STATE_H_
#define LBCC_COMM_ELASTIC_SHARED_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/tensor_view.h"
#include "comm/communicator.h"

namespace lbcc::comm::elastic {

// Bytes this member sent and received in one shared-state transfer.
struct StateTraffic {
  uint64_t sent = 0;
  uint64_t received = 0;
};

class SharedState {
 public:
  // `views`: host buffers every member holds identically; they must outlive this object.
  SharedState(std::vector<TensorView> views, absl::Duration op_timeout);

  // InvalidArgument naming a tensor that is not host memory.
  absl::Status Check() const;
  uint64_t bytes() const { return bytes_; }
  uint64_t Hash() const;

  // Boundary's phase over an epoch's communicator, where this member is `rank` and the ranks
  // in `needs` lack the state: every member's hash, then each newcomer's state from its best
  // source.
  absl::StatusOr<StateTraffic> Sync(Communicator& comm, int rank,
                                    const std::vector<uint32_t>& needs);

 private:
  struct Record;
  absl::StatusOr<std::vector<Record>> GatherRecords(Communicator& comm, bool synced);
  absl::StatusOr<uint64_t> Send(Communicator& comm, int peer, bool slow, uint64_t hash);
  absl::StatusOr<uint64_t> Receive(Communicator& comm, int source, uint64_t hash);

  const std::vector<TensorView> views_;
  const absl::Duration op_timeout_;
  uint64_t bytes_ = 0;
};

// A step's result forwarded from the member that committed it (`result`: its `out` tensors'
// bytes, in order) to the ranks in `to`, each checked against its XXH3 hash.
absl::Status SendResult(Communicator& comm, const std::string& result,
                        const std::vector<uint32_t>& to, absl::Duration op_timeout);
// Receives step `step`'s result from rank `source` into `outs` (the failed call's `out`
// tensors).
absl::Status ReceiveResult(Communicator& comm, int source, uint64_t step,
                           const std::vector<TensorView>& outs, absl::Duration op_timeout);

// Waits for `request`; past `timeout`, aborts the communicator and returns its outcome.
absl::Status WaitOrAbort(Communicator& comm, const RequestPtr& request, absl::Duration timeout);

}  // namespace lbcc::comm::elastic

#endif  // LBCC_COMM_ELASTIC_SHARED_STATE_H_
