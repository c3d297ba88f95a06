// ConnectorPool: the small pool of threads that runs Net's connection attempts, so that connect()
// never blocks an NCCL thread; each attempt runs the function the pool was made with
// (Net::RunAttempt). Private to Net (net.h).
//
// Thread-safety: every method may be called from any thread; Stop() joins the threads.
#ifndef LBCC_PLUGIN_CONNECTOR_H_
#define LBCC_PLUGIN_CONNECTOR_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "plugin/handle.h"
#include "transport/transport.h"

namespace lbcc::plugin {

class Device;

// Connects `device` to the listen comm `handle` names (blocking; on a pool thread).
using ConnectFn = std::function<absl::StatusOr<std::unique_ptr<transport::Endpoint>>(
    Device* device, const ListenHandle& handle)>;

// One queued or running attempt; `result` holds its outcome once `done`.
struct ConnectAttempt {
  uint64_t id = 0;
  Device* device = nullptr;
  ListenHandle handle;
  bool done = false;
  absl::StatusOr<std::unique_ptr<transport::Endpoint>> result =
      absl::UnknownError("attempt pending");
};

class ConnectorPool {
 public:
  // An attempt's endpoint or error once it finished; nullopt while it runs.
  using Outcome = std::optional<absl::StatusOr<std::unique_ptr<transport::Endpoint>>>;

  explicit ConnectorPool(ConnectFn connect) : connect_(std::move(connect)) {}
  ~ConnectorPool() { Stop(); }

  // Queues an attempt to connect `device` to the listen comm `handle` names (a thread of the
  // pool runs the ConnectFn) and returns its id; Cancelled once stopping.
  absl::StatusOr<uint64_t> Start(Device* device, ListenHandle handle);

  // The attempt's outcome once done (and forgets it), nullopt while it runs. InvalidArgument for
  // an id this pool does not know.
  absl::StatusOr<Outcome> Poll(uint64_t id);

  bool stopping() const { return stop_flag_.load(); }

  // New attempts fail and running ones give up after their current Connect() call.
  void RequestStop();

  // RequestStop(), then joins the threads and drops the outcomes nobody collected.
  void Stop();

 private:
  void Work();

  const ConnectFn connect_;
  Mutex mu_;
  CondVar cv_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<ConnectAttempt>> attempts_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<ConnectAttempt>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> stop_flag_{false};
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace lbcc::plugin

#endif  // LBCC_PLUGIN_CONNECTOR_H_
