// lbcc-master: the membership service of an elastic LBCC job (comm/elastic/elastic.h,
// docs/elastic.md).
// Runs until SIGINT/SIGTERM; members find it through LBCC_MASTER_ADDR.
#include <signal.h>

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/elastic/elastic.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:29400", "host:port to listen on (port 0: any)");
ABSL_FLAG(std::string, job_id, "", "the job's id; members must present it (required)");
ABSL_FLAG(int, peer_timeout_ms, 0, "a member silent this long is dropped; 0: LBCC_PEER_TIMEOUT_MS");
ABSL_FLAG(int, min_members, 1, "the first epoch forms once this many members joined");
ABSL_FLAG(int, handshake_timeout_ms, 10000,
          "a connection that has not sent its join this long is closed (README, Security)");
ABSL_FLAG(int, max_handshakes, 1024, "connections waiting for their join at once (the oldest "
          "is closed for a new one)");
ABSL_FLAG(int, max_connections_per_address, 64,
          "connections one peer address may hold, joining or joined");
ABSL_FLAG(std::string, bootstrap_host, "", "address (IPv4, IPv6) or host name of the per-epoch "
          "bootstrap roots; empty: the listen host (0.0.0.0 or [::] needs this set to an address "
          "members reach)");

int main(int argc, char** argv) {
  lbcc::cli::ParseOrExit(argc, argv,
                         "usage: lbcc-master --job_id ID [--listen HOST:PORT] [flags]\n"
                         "The membership service of an elastic LBCC job.",
                         "tools/lbcc_master_main.cc");
  lbcc::comm::ElasticMasterOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.job_id = absl::GetFlag(FLAGS_job_id);
  options.peer_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_peer_timeout_ms));
  options.min_members = absl::GetFlag(FLAGS_min_members);
  options.bootstrap_host = absl::GetFlag(FLAGS_bootstrap_host);
  options.handshake_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_handshake_timeout_ms));
  options.max_handshakes = absl::GetFlag(FLAGS_max_handshakes);
  options.max_connections_per_address = absl::GetFlag(FLAGS_max_connections_per_address);
  if (options.bootstrap_host.empty() && (options.listen_address.rfind("0.0.0.0:", 0) == 0 ||
                                         options.listen_address.rfind("[::]:", 0) == 0)) {
    std::fprintf(stderr, "lbcc-master: --bootstrap_host is needed with --listen 0.0.0.0:PORT "
                         "or [::]:PORT\n");
    return 2;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before any thread starts
  auto master = lbcc::comm::ElasticMaster::Start(options);
  if (!master.ok()) {
    std::fprintf(stderr, "lbcc-master: %s\n", master.status().ToString().c_str());
    return 1;
  }
  std::printf("lbcc-master: job '%s' at %s\n", options.job_id.c_str(),
              (*master)->address().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&signals, &sig);
  (*master)->Stop();
  return 0;
}
