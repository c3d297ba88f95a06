// The network half of the planner: LBCC's topology with per-link rates, and the time of a set of
// concurrent transfers on it.
//
// Link model (docs/planning.md, "Links"): every rank has an access link for slow traffic with
// its own up and down rate and a one-way latency; a fast island may sit behind one shared site
// link (up and down); traffic between ranks the topology links fast uses each rank's fast NIC
// (rates.fast). A transfer s -> d uses up[s] (+ site_up[island(s)]) (+ site_down[island(d)]) +
// down[d] when topology.link(s, d) is slow, fast_up[s] + fast_down[d] when fast.
//
// Time of a phase (transfers that run at once): the busiest resource drains last,
//   t_phase = max over resources R of bytes(R) / (rate(R) * efficiency)
//   and no phase is shorter than the hosts' CPU for its bytes (every rank's bytes sent and
//   received / copy rate; with shared cores their sum over the cores),
//   and no transfer finishes before bytes / pace (the slow-link scheduler's token bucket)
//   nor before its own credit-window time (bytes at its path's rate + a stall per window when
//   the window is smaller than what the path holds during a credit's turnaround),
// plus the largest path latency and the per-message time.
//
// Thread-safety: immutable values and pure functions.
#ifndef LBCC_PLAN_NETWORK_H_
#define LBCC_PLAN_NETWORK_H_

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/topology.h"
#include "nlohmann/json.hpp"
#include "transport/options.h"

namespace lbcc::plan {

struct AccessLink {
  double up_bps = 0;    // bytes per second, line rate
  double down_bps = 0;
  double latency_s = 0;  // one way
  // The shaper's token bucket (rank access links only; 0: none): bytes a link that has idled
  // passes at line speed before its rate holds (docs/planning.md, "Shaper bucket").
  double up_burst_bytes = 0;
  double down_burst_bytes = 0;
};

struct Network {
  comm::Topology topology = comm::Topology::Flat(1);
  std::vector<AccessLink> rank_link;                // slow traffic, per rank
  std::vector<std::optional<AccessLink>> site_link;  // per island, shared; nullopt: none
  AccessLink fast;                                   // per rank NIC for fast links
  double efficiency = 0.95;   // goodput / line rate (TCP/IP headers)
  double pace_bps = 0;        // LBCC_SLOW_PACE_MBITS per slow link (0: off)
  // How the transport sends on a slow link: chunk size, stripes and the credit window
  // (transport/options.h; window_bytes 0 = transport::WindowBytes' automatic size). Read from
  // the LBCC_SLOW_* environment the transport reads, unless the rates override them.
  transport::SchedulerOptions scheduler;
  // A credit's turnaround beyond the path's round trip: the receiver's and the sender's
  // progress, and the wait behind other data on the link the credit returns through.
  double credit_s = 0;
  // Per message: the time between its last byte arriving and the receiver acting on it (its
  // progress thread), added to every phase's latency term.
  double message_s = 0;
  // The hosts' CPU (docs/planning.md, "Shared cores"): what one core spends per byte a rank
  // sends or receives (kernel TCP, the transport's copies, a ring's combine), as bytes per
  // second of one core (0: free), and the cores the ranks share (0: every rank has cores of
  // its own; C > 0: all ranks of the plan run on C cores together, as on tools/testbed).
  double copy_bps = 0;
  int shared_cores = 0;
};

// How many times longer the same CPU work takes when `busy` ranks do it at once on the
// network's shared cores: max(1, busy / shared_cores), 1 without shared cores.
double CpuSerialisation(const Network& net, int busy);

// Parses the "rates" object against `topology`; `scheduler` is what the transport would use
// (TransportOptions::FromEnv().scheduler), overridden by rates.chunk_bytes, .window_bytes and
// .stripes. InvalidArgument naming the field: missing rates, a rank without a rate and no
// default, a rate <= 0 or not a number, an unknown key, an unknown rank or island.
absl::StatusOr<Network> ParseRates(const nlohmann::json& rates, comm::Topology topology,
                                   const transport::SchedulerOptions& scheduler = {});

// The credit window of a slow path with goodput `bytes_per_second` and round trip `rtt_s`:
// transport::WindowBytes with the network's scheduler options.
double WindowOf(const Network& net, double bytes_per_second, double rtt_s);

// One transfer alone on a slow path of goodput `r` and round trip `rtt_s`: its bytes at the
// path's rate plus, per credit window after the first, the stall while the sender waits for
// the window's credits (docs/planning.md, "Credit window").
double WindowedTransferSeconds(const Network& net, double bytes, double r, double rtt_s);

struct Transfer {
  int src = 0;
  int dst = 0;
  double bytes = 0;
};

// Bytes per resource of a phase, for reports: per rank, sent and received on slow and on fast
// links.
struct LinkBytes {
  std::vector<double> slow_up, slow_down, fast_up, fast_down;
  explicit LinkBytes(int nranks)
      : slow_up(nranks), slow_down(nranks), fast_up(nranks), fast_down(nranks) {}
  void Add(const LinkBytes& other);
};

struct PhaseTime {
  double seconds = 0;     // bandwidth term + latency term
  double latency_s = 0;   // the latency term alone (path latency + per-message time)
  double window_s = 0;    // credit-window stalls included in the bandwidth term
  double host_s = 0;      // the hosts' CPU for the phase's bytes (a floor of the bandwidth term)
  std::string bottleneck;  // e.g. "rank 2 down (slow)"
};

// Time of `transfers` running at once (see the header comment); adds their bytes to `bytes`
// when given. `idle_s`: how long every slow access link of the phase idled before it; a link
// with a shaper bucket refilled min(burst, rate x idle_s) of it, which passes at line speed
// (the phase is that much shorter on that link).
PhaseTime TimeOfPhase(const Network& net, const std::vector<Transfer>& transfers,
                      LinkBytes* bytes = nullptr, double idle_s = 0);

// InvalidArgument "<where>: must be an object" or "<where>: unknown key 'k'" unless `object` is
// an object whose keys are all in `allowed` (the plan's JSON parsers share it).
absl::Status CheckJsonKeys(const nlohmann::json& object,
                           std::initializer_list<const char*> allowed, absl::string_view where);

}  // namespace lbcc::plan

#endif  // LBCC_PLAN_NETWORK_H_
