// Test helpers for comm/: run N ranks as threads of this process, over the loopback transport
// (or UCX on 127.0.0.1), each with its own Communicator.
#ifndef LBCC_COMM_TESTING_H_
#define LBCC_COMM_TESTING_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "comm/bootstrap.h"
#include "comm/communicator.h"

namespace lbcc::comm::testing {

// A 127.0.0.1 port nobody listens on right now (the kernel's pick for a socket bound to port 0).
inline int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

struct RankOptions {
  std::string backend = "loopback";
  absl::Duration timeout = absl::Seconds(60);
  std::optional<Topology> topology;
};

// Runs `body(rank, comm)` on `nranks` threads; returns each rank's status (an Init failure or
// what body returned).
inline std::vector<absl::Status> RunRanks(
    int nranks, const RankOptions& options,
    const std::function<absl::Status(int rank, Communicator& comm)>& body) {
  std::vector<absl::Status> results(nranks);
  absl::StatusOr<UniqueId> id = CreateUniqueId("127.0.0.1", options.timeout);
  if (!id.ok()) {
    results.assign(nranks, id.status());
    return results;
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank) {
    threads.emplace_back([&, rank] {
      FabricOptions fabric;
      fabric.backend = options.backend;
      fabric.timeout = options.timeout;
      fabric.topology = options.topology;
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          Communicator::Init(*id, nranks, rank, fabric);
      if (!comm.ok()) {
        results[rank] = comm.status();
        return;
      }
      results[rank] = body(rank, **comm);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace lbcc::comm::testing

#endif  // LBCC_COMM_TESTING_H_
