// Configuration of a Transport: slow-link scheduling, link classification and peer timeouts,
// read from the LBCC_* environment (base/env.cc declares every variable) or set in code, and the
// link-rules file that names the class of links to given peers (communicators set classes
// from comm/topology.h instead; the rules serve transport users without ranks, e.g. plugin/).
//
// Link-rules file (LBCC_LINK_RULES_FILE), one rule per line, '#' starts a comment:
//
//   # peer            class
//   10.77.0.3         slow      # any port on that host
//   10.77.0.4:5000    fast
//   fd77::5           slow      # IPv6: bare, or [fd77::5] / [fd77::5]:5000 with a port
//   node6             slow      # a host name: the name and every address it resolves to
//   *                 slow      # everyone else
//
// Names are resolved (getaddrinfo) when the file is read; one that does not resolve is an
// InvalidArgument naming it and the line. The most specific rule wins (host:port, then host,
// then *). Peers are matched by the address given to Connect() on the client (UCX: resolved to
// a numeric address) and by the connecting host (port unknown) on the server; the loopback
// backend matches names the same way (its server sees the client's listen name). The parser is
// transport/link_rules.h's; the class rule (either side slow: slow) is transport/link_setup.h's.
//
// Thread-safety: values.
#ifndef LBCC_TRANSPORT_OPTIONS_H_
#define LBCC_TRANSPORT_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "transport/link_rules.h"  // LinkRules, ParseLinkClass
#include "transport/netif.h"
#include "transport/secure.h"
#include "transport/transport.h"

namespace lbcc::transport {

// How a slow link sends.
struct SchedulerOptions {
  int64_t chunk_bytes = 256 << 10;  // LBCC_SLOW_CHUNK_BYTES.
  double pace_bytes_per_second = 0;  // LBCC_SLOW_PACE_MBITS; 0: no pacing.
  int stripes = 1;                   // LBCC_SLOW_STRIPES: connections per slow link.
  // LBCC_SLOW_WINDOW_BYTES: bytes handed to the connections and not yet acknowledged by the
  // receiver. Small keeps high-priority chunks from waiting behind bulk ones in socket buffers
  // and shaper queues; large fills long links. 0: automatic (see WindowBytes()).
  int64_t window_bytes = 0;
  // LBCC_SLOW_BULK_YIELD: bulk-priority sends yield the link to latency-critical ones (see
  // BulkPaceBytesPerSecond()).
  bool bulk_yield = true;
};

// Bulk yielding. While a slow link has sent a non-bulk chunk within kBulkYieldHold, its bulk
// chunks are paced at BulkPaceBytesPerSecond() in chunks of BulkYieldChunkBytes(), so that the
// bottleneck's queue (a shaper's, a router's) stays empty and a latency-critical message waits
// only for its own bytes: credits bound the bytes in flight, not the time they queue, and a
// single 256 KiB chunk is 84 ms on a 25 Mbit/s link. The headroom is twice the recent non-bulk
// rate plus kBulkYieldMargin of the probed rate (the probe's error), never below
// kBulkYieldFloor of it, so bulk keeps moving.
inline constexpr double kBulkYieldMargin = 0.05;
inline constexpr double kBulkYieldFloor = 0.25;
inline constexpr absl::Duration kBulkYieldHold = absl::Seconds(2);
inline constexpr absl::Duration kBulkYieldChunkTime = absl::Milliseconds(2);
inline constexpr int64_t kBulkYieldMinChunkBytes = 16 << 10;
// The bulk bucket holds this many chunks, so a pacing timer that fires late catches up at once
// (the bottleneck's queue then holds at most that many chunks' time).
inline constexpr int kBulkYieldBurstChunks = 2;
double BulkPaceBytesPerSecond(double probed_send_bytes_per_second,
                              double nonbulk_bytes_per_second);
// About kBulkYieldChunkTime at `pace`, within [kBulkYieldMinChunkBytes, options.chunk_bytes].
int64_t BulkYieldChunkBytes(const SchedulerOptions& options, double pace_bytes_per_second);

// The window a slow link uses: the configured one, or
// max(max(stripes, kMinWindowChunks) * chunk, 2 * rate * rtt), so that a long link stays full and
// a short one keeps a few chunks in flight. A chunk's credit returns through the sender's own
// down-link, which in a ring or an all-to-all carries another peer's bulk data, so it waits
// behind that queue (the probe's idle RTT does not see it); with one chunk per window the link
// would idle for that wait after every chunk, with kMinWindowChunks the chunks behind the first
// keep it busy meanwhile. A high-priority chunk waits behind at most the window's bytes.
inline constexpr int kMinWindowChunks = 4;
int64_t WindowBytes(const SchedulerOptions& options, double rate_bytes_per_second,
                    double rtt_seconds);

struct TransportOptions {
  SchedulerOptions scheduler;
  // Messages on fast links travel in chunks of this size (LBCC_FAST_CHUNK_BYTES), so that any
  // size works whatever the backend's limits.
  int64_t fast_chunk_bytes = 64 << 20;
  // Explicit class for every link (LBCC_LINK_CLASS=fast|slow); unset: link rules, then the probe.
  std::optional<LinkClass> link_class;
  LinkRules link_rules;  // LBCC_LINK_RULES_FILE (parser: transport/link_rules.h).
  // A link whose probed rate in either direction is below this is slow (LBCC_SLOW_LINK_GBITS).
  double slow_threshold_bits_per_second = 10e9;
  // Largest probe transfer per direction (LBCC_LINK_PROBE_BYTES); the probe doubles its size until
  // a transfer takes probe_min_time or reaches this.
  int64_t probe_max_bytes = 64 << 20;
  absl::Duration probe_min_time = absl::Milliseconds(20);
  // A peer that stops answering fails pending work with Unavailable within about this long
  // (LBCC_PEER_TIMEOUT_MS).
  absl::Duration peer_timeout = absl::Seconds(10);
  // UCX only. Slow-link chunks up to this size use UCX's eager protocol (no rendezvous
  // round trip through the sender's own busy down-link); larger ones, and every fast-link chunk,
  // let UCX choose (LBCC_SLOW_EAGER_BYTES; 0: never force eager).
  int64_t slow_eager_bytes = 4 << 20;
  // UCX only. How long the progress thread keeps polling after the last event before it sleeps
  // on the worker's event fd (LBCC_UCX_SPIN_US): polling catches the next message of a burst
  // without a wake-up, at the price of CPU time the codecs could use on a busy host.
  absl::Duration progress_spin = absl::Microseconds(50);

  // UCX only. FromEnv copies UCX's own UCX_TLS, UCX_NET_DEVICES and UCX_TCP_AF_PRIO here, so
  // the transport never reads the environment itself. Empty: UCX's defaults. Pin one device per Transport
  // so that a fast and a slow device are never striped in one UCX endpoint.
  std::string ucx_tls;
  std::string ucx_net_devices;
  // UCX only. The address families UCX's tcp transport tries on its device, in order
  // (UCX_TCP_AF_PRIO: "inet6", "inet,inet6"). Empty: UCX's own (IPv4 first).
  std::string ucx_tcp_af_prio;

  // The job secret and encryption mode (LBCC_JOB_SECRET / LBCC_JOB_SECRET_FILE, LBCC_ENCRYPT;
  // transport/secure.h). No secret: links are not authenticated.
  SecurityOptions security;

  // Reads every LBCC_* variable above (InvalidArgument for a bad value or an unreadable or bad
  // link rules file).
  static absl::StatusOr<TransportOptions> FromEnv();

  // The explicit class for a peer: link rule, then link_class. nullopt: probe.
  std::optional<LinkClass> ConfiguredClass(absl::string_view host, int port) const;
};

// Sets options->ucx_net_devices to `device` (the interface the rank listens on,
// transport/netif.h) unless it is set already (in code, or by FromEnv from UCX_NET_DEVICES), or `device` is empty
// (loopback, or an address of no interface), then the address family (PinUcxAddressFamily).
// InvalidArgument as PinUcxAddressFamily.
absl::Status PinUcxDevice(const std::string& device, bool ipv6, TransportOptions* options);

// Makes the family of the listen address (`ipv6`) the first one UCX's tcp transport tries
// (options->ucx_tcp_af_prio, passed to UCX over UCX_TCP_AF_PRIO). UCX's tcp transport connects
// its data connections from the first family in that list its device has, toward the peer's
// address as the connection set-up saw it: on a device with both families a set-up over the
// other family then fails (an IPv4 set-up with inet6 first: a handshake timeout; an IPv6 set-up
// with inet first: UCX 1.13 corrupts its heap and aborts). So:
//   - neither set: "inet6" for an IPv6 address when `device_known` (UCX's default puts inet
//     first, right for IPv4; loopback has no usable IPv6 in UCX's tcp, so nothing for it);
//   - set (options->ucx_tcp_af_prio: in code, or by FromEnv from UCX_TCP_AF_PRIO) with that
//     family first: kept;
//   - set with that family later in the list: reordered, that family first (logged at INFO);
//   - set without that family ("inet" for an IPv6 address): InvalidArgument naming
//     UCX_TCP_AF_PRIO, its value and the fix, rather than a crash or a timeout in UCX.
absl::Status PinUcxAddressFamily(bool ipv6, bool device_known, TransportOptions* options);

// The UCX backend's check at Listen, for transport users that pin nothing: the family UCX's tcp
// transport takes on the interface that has `listen_host` (the first family of `af_prio`,
// UCX_TCP_AF_PRIO's syntax, "" for UCX's default "inet,inet6", that the interface has an address
// of) must be `listen_host`'s. InvalidArgument naming UCX_TCP_AF_PRIO and the fix otherwise.
// Loopback, and an address no interface in `interfaces` has, pass (UCX's tcp uses no IPv6 on lo).
absl::Status CheckUcxAddressFamily(absl::string_view af_prio, absl::string_view listen_host,
                                   const std::vector<NetInterface>& interfaces);

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_OPTIONS_H_
