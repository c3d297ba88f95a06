// Test helpers for comm/: run N ranks as threads of this process, over the loopback transport
// (or UCX on 127.0.0.1), each with its own Communicator.
#ifndef LBCC_COMM_TESTING_H_
#define LBCC_COMM_TESTING_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/bootstrap.h"
#include "comm/communicator.h"

namespace lbcc::comm::testing {

// A 127.0.0.1 port nobody uses right now, drawn below the kernel's ephemeral range: a port the
// kernel hands out for bind(port 0) or an outgoing connection (concurrent tests make many) could
// be taken again before the caller binds it. `count` consecutive ports are free when count > 1
// (the first is returned). 0 when none was found.
inline int FreeLoopbackPort(int count = 1) {
  int low = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &low) != 1) low = 32768;
    std::fclose(f);
  }
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(10000, std::max(10001, low - count));
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int base = pick(rng);
    std::vector<int> fds;
    bool ok = true;
    for (int p = base; p < base + count && ok; ++p) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      fds.push_back(fd);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(p));
      ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    }
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
    if (ok) return base;
  }
  return 0;
}

struct RankOptions {
  std::string backend = "loopback";
  absl::Duration timeout = absl::Seconds(60);
  std::optional<Topology> topology;
};

// Runs `body(rank, comm)` on `nranks` threads, each with a Communicator made from `config`
// (unset fields from the environment); returns each rank's status (an Init failure or what
// body returned).
inline std::vector<absl::Status> RunRanksWithConfig(
    int nranks, const CommConfig& config,
    const std::function<absl::Status(int rank, Communicator& comm)>& body) {
  std::vector<absl::Status> results(nranks);
  absl::StatusOr<UniqueId> id = CreateUniqueId(config);
  if (!id.ok()) {
    results.assign(nranks, id.status());
    return results;
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          Communicator::Init(*id, nranks, rank, config);
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

// The same with RankOptions' fields explicit (listening on 127.0.0.1).
inline std::vector<absl::Status> RunRanks(
    int nranks, const RankOptions& options,
    const std::function<absl::Status(int rank, Communicator& comm)>& body) {
  FabricOptions fabric;
  fabric.listen_host = "127.0.0.1";
  fabric.backend = options.backend;
  fabric.timeout = options.timeout;
  fabric.topology = options.topology;
  return RunRanksWithConfig(nranks, ConfigFromFabricOptions(std::move(fabric)), body);
}

// Waits (polling, up to 30 s) until `comm` sent its first message to `peer` since `sent_before`
// (its Counters(peer).messages_sent then), or `request` completed: the pending operation is
// under way there.
inline void AwaitFirstSend(Communicator& comm, int peer, uint64_t sent_before,
                           const RequestPtr& request) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (comm.fabric()->Counters(peer).messages_sent == sent_before && !request->Test() &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));  // polls the condition; nothing else signals it
  }
}

// Calls comm.Abort() on a thread of its own while `request` is pending and waits for `request`:
// its status, and the time from the Abort() call to the request's return.
inline std::pair<absl::Status, absl::Duration> AbortAndWait(Communicator& comm,
                                                           const RequestPtr& request) {
  absl::Time aborted_at;
  std::thread aborter([&] {
    aborted_at = absl::Now();
    comm.Abort();
  });
  absl::Status status = request->Wait();
  const absl::Time returned = absl::Now();
  aborter.join();
  return {std::move(status), returned - aborted_at};
}

}  // namespace lbcc::comm::testing

#endif  // LBCC_COMM_TESTING_H_
