// Device: one network device of the plugin: its transport (made on first use), its listener and
// the acceptor thread that routes each incoming connection, once its hello arrived, to the
// listen comm the hello names. Private to Net (net.h).
//
// Thread-safety: every method may be called from any thread; Shutdown() joins the acceptor.
#ifndef LBCC_PLUGIN_NET_DEVICE_H_
#define LBCC_PLUGIN_NET_DEVICE_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "plugin/comm_core.h"
#include "plugin/net_options.h"
#include "plugin/staging.h"
#include "transport/transport.h"

namespace lbcc::plugin {

// The hello a connecting side sends first, naming the listen comm: under a transport tag above
// NCCL's (DataTag), magic, version, listen comm id; kHelloBytes in all.
inline constexpr transport::Tag kHelloTag = transport::Tag{1} << 63;
inline constexpr uint32_t kHelloMagic = 0x4948424c;  // "LBHI".
inline constexpr uint16_t kHelloVersion = 1;
inline constexpr size_t kHelloBytes = 16;

class Device {
 public:
  Device(int index, DeviceSpec spec, const NetOptions* options,
         std::shared_ptr<StagingPool> staging)
      : spec_(std::move(spec)),
        options_(options),
        state_(std::make_shared<DeviceState>(index, spec_.name, std::move(staging))) {}
  ~Device() { Shutdown(); }

  const DeviceSpec& spec() const { return spec_; }
  const std::shared_ptr<DeviceState>& state() const { return state_; }

  // The transport connections go out through: the device's one transport, also for connections
  // to its own listener (NCCL connects a process to itself; the transport keeps both ends apart).
  absl::StatusOr<transport::Transport*> TransportForConnect() {
    MutexLock lock(&mu_);
    return GetTransportLocked();
  }

  // Starts the listener and the acceptor once; returns the address peers connect to.
  absl::StatusOr<std::string> EnsureListening();

  // Shuts the transport down without destroying it: connection attempts blocked in it on the
  // connector threads and the acceptor's Accept() return Cancelled at once.
  void Interrupt();

  // Stops the acceptor, closes the endpoints no comm took yet and destroys the transport (open
  // comms then fail with Cancelled). Idempotent.
  void Shutdown();

 private:
  absl::StatusOr<transport::Transport*> GetTransportLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void AcceptLoop(transport::Transport* transport);

  // Waits (without blocking) for the connecting side's hello, which names the listen comm.
  void Greet(std::unique_ptr<transport::Endpoint> endpoint);

  static void OnHello(DeviceState* state, uint64_t id,
                      const std::array<uint8_t, kHelloBytes>& hello,
                      absl::StatusOr<size_t> length);

  const DeviceSpec spec_;
  const NetOptions* const options_;
  const std::shared_ptr<DeviceState> state_;

  Mutex mu_;
  std::unique_ptr<transport::Transport> transport_ ABSL_GUARDED_BY(mu_);
  std::string address_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread acceptor_;
  std::atomic<bool> stop_{false};
};

}  // namespace lbcc::plugin

#endif  // LBCC_PLUGIN_NET_DEVICE_H_
