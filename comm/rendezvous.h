// Rendezvous from a launcher's environment: which rank this process is, how many there are, and
// the unique id (comm/bootstrap.h) they all join, found the way each launcher offers.
//
//   launcher               detected by                          the id travels by
//   LBCC_BOOTSTRAP_ADDR    the variable (with any launcher's    a root on that host:port, started
//                          rank variables)                      by rank 0
//   Open MPI / MPICH       OMPI_COMM_WORLD_RANK/SIZE,           MPI_Bcast from rank 0 (libmpi is
//                          PMI_RANK/PMI_SIZE                    dlopen'ed only then)
//   Slurm (srun)           SLURM_PROCID, SLURM_NTASKS           a root on the first host of
//                                                               SLURM_STEP_NODELIST, port
//                                                               LBCC_BOOTSTRAP_PORT
//   torchrun / env://      RANK, WORLD_SIZE, MASTER_ADDR,       a root on MASTER_ADDR:
//                          MASTER_PORT                          MASTER_PORT + 1 (C/C++; Python's
//                                                               lbcc.init() uses torch's store)
//
// Hosts are names or addresses (resolved with getaddrinfo, IPv4 or IPv6).
//
// Errors (all within a second of the call, before any waiting): InvalidArgument naming the
// variable and its value (a rank variable that is not a number, a node list that does not
// parse, a host that does not resolve); FailedPrecondition when launched by mpirun but no MPI
// library loads (naming the libraries tried and LBCC_MPI_LIBRARY) or MPI was finalized; the
// bootstrap's own errors later (DeadlineExceeded when a rank never comes).
// Thread-safety: reads the environment; nobody may call setenv concurrently. MPI is initialized
// at most once per process (and finalized at exit when LBCC initialized it).
#ifndef LBCC_COMM_RENDEZVOUS_H_
#define LBCC_COMM_RENDEZVOUS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/bootstrap.h"

namespace lbcc::comm {

enum class Launcher { kBootstrapAddr, kMpi, kSlurm, kTorchrun };
absl::string_view LauncherName(Launcher launcher);

// What the environment says about this process.
struct LaunchEnvironment {
  Launcher launcher = Launcher::kTorchrun;
  int rank = 0;
  int nranks = 0;
  int local_rank = 0;
  // Fixed root ("host:port"), for every launcher but MPI.
  std::string root_address;
  uint64_t session = 0;
};

// Reads the launcher's variables (table above). InvalidArgument naming what is missing or bad.
absl::StatusOr<LaunchEnvironment> DetectLaunch();

// Slurm's host list syntax: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5 (ranges
// keep their zero padding; several bracket groups in one name multiply). InvalidArgument naming
// the list for an unclosed bracket, a reversed or non-numeric range, or an empty list.
absl::StatusOr<std::vector<std::string>> ExpandSlurmNodeList(absl::string_view list);

// The unique id every rank of `launch` joins: rank 0 starts the root (listening on
// `listen_host` for MPI; "" picks the interface), the others learn the id.
absl::StatusOr<UniqueId> RendezvousId(const LaunchEnvironment& launch,
                                      absl::string_view listen_host, absl::Duration timeout);

}  // namespace lbcc::comm

#endif  // LBCC_COMM_RENDEZVOUS_H_
